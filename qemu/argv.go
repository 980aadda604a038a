package qemu

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// Names QEMU sees for the objects BuildArgs creates.
const (
	// ConsoleChardev is the chardev id of the guest's first serial port.
	ConsoleChardev = "console"
	// QMPChardev is the chardev id of the QMP monitor socket.
	QMPChardev = "qmp"
	// SCSIController is the id of the virtio-scsi controller.
	SCSIController = "scsi0"
	// TPMChardev is the chardev id of the TPM emulator's control channel.
	TPMChardev = "tpm0-ctrl"
	// TPMDevice is the id of the TPM backend.
	TPMDevice = "tpm0"
	// AgentChardev is the chardev id of the guest agent channel.
	AgentChardev = "agent"
	// AgentPortName is the virtio-serial port name qemu-guest-agent opens.
	AgentPortName = "org.qemu.guest_agent.0"
	// AgentPortID is the qdev id of the guest agent's virtio-serial port,
	// the id QEMU's VSERPORT_CHANGE events carry.
	AgentPortID = "agent-port"
	// SerialController is the id of the virtio-serial controller.
	SerialController = "vser0"
)

// sandboxOptions confine QEMU with seccomp: no obsolete syscalls, no setuid,
// no fork/exec, no scheduler or resource limit changes.
const sandboxOptions = "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"

// tcgThreading is the TCG threading mode; multi runs one host thread per vCPU.
const tcgThreading = "multi"

// TCGCacheMiB bounds TCG's translated-code cache (QEMU's default is 1 GiB,
// or an eighth of host RAM): the cache is QEMU's largest own use of memory
// under TCG, and it is charged to the VM's cgroup. A boot fills whatever
// it is given: measured on the test guest, 64 MiB boots in the same time
// as 32 MiB (3.1–3.4 s), 16 MiB takes 10 % longer and 8 MiB twice as long
// (docs/performance.md).
const TCGCacheMiB = 32

// escapeOpt escapes a value for QEMU's comma-separated option syntax, where a
// literal comma is written as two.
func escapeOpt(s string) string {
	return strings.ReplaceAll(s, ",", ",,")
}

// opts renders key=value pairs as one QEMU option string, escaping values.
// A pair with an empty key is a bare leading word such as a driver name.
type opts []string

func (o opts) add(key, value string) opts {
	if key == "" {
		return append(o, escapeOpt(value))
	}
	return append(o, key+"="+escapeOpt(value))
}

// String joins the options with commas.
func (o opts) String() string { return strings.Join(o, ",") }

// FileNode is the node name of a drive's protocol (file) layer.
func FileNode(driveID string) string { return "file-" + driveID }

// DiskNode is the node name of a drive's format layer, the one its device uses.
func DiskNode(driveID string) string { return "disk-" + driveID }

// BaseFileNode is the node name of a drive's backing file layer.
func BaseFileNode(driveID string) string { return "bfile-" + driveID }

// BaseNode is the node name of a drive's backing format layer.
func BaseNode(driveID string) string { return "base-" + driveID }

// DeviceID is the qdev id of a drive's guest device.
func DeviceID(driveID string) string { return "dev-" + driveID }

// NetdevID is the id of a NIC's tap backend.
func NetdevID(nicID string) string { return "net-" + nicID }

// NICDeviceID is the qdev id of a NIC's guest device.
func NICDeviceID(nicID string) string { return "nic-" + nicID }

// FSDevID is the id of a share's 9p filesystem backend.
func FSDevID(shareID string) string { return "fs-" + shareID }

// ShareDeviceID is the qdev id of a share's virtio-9p device.
func ShareDeviceID(shareID string) string { return "share-" + shareID }

// VFIODeviceID is the qdev id of the i-th passed-through PCI function.
func VFIODeviceID(i int) string { return "hostdev" + strconv.Itoa(i) }

// BuildArgs validates s and returns QEMU's argv without argv[0].
func BuildArgs(s Spec) ([]string, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	args := []string{
		// debug-threads names QEMU's threads ("CPU 0/TCG"...), so the
		// shim and an operator can tell the vCPU threads apart.
		"-name", opts{}.add("guest", s.Name).String() + ",debug-threads=on",
		"-nodefaults", "-no-user-config",
	}
	args = append(args, displayArgs(s.VNC)...)
	args = append(args, s.machineArgs()...)
	switch s.Accel {
	case AccelKVM:
		args = append(args, "-accel", "kvm")
	default:
		args = append(args, "-accel", "tcg,thread="+tcgThreading+",tb-size="+strconv.Itoa(TCGCacheMiB))
	}
	args = append(args, cpuArgs(s.Accel, s.Windows)...)
	if s.Windows {
		args = append(args, "-rtc", "base=localtime")
	}
	args = append(args, s.smpArgs()...)
	args = append(args, s.memoryArgs()...)
	args = append(args,
		"-chardev", listenChardev(QMPChardev, s.QMPSocket, s.QMPFD),
		"-mon", "chardev="+QMPChardev+",mode=control",
	)
	// Files come before the devices that open them.
	for _, a := range s.FDSets {
		args = append(args, "-add-fd", fmt.Sprintf("fd=%d,set=%d", a.FD, a.Set))
	}
	args = append(args, firmwareArgs(s.Firmware)...)
	if s.ConsoleFD != 0 {
		args = append(args,
			"-chardev", fmt.Sprintf("socket,id=%s,fd=%d", ConsoleChardev, s.ConsoleFD),
			"-serial", "chardev:"+ConsoleChardev,
		)
	}
	if s.AgentSocket != "" {
		args = append(args,
			"-device", s.virtioDevice("virtio-serial-pci")+",id="+SerialController,
			"-chardev", listenChardev(AgentChardev, s.AgentSocket, s.AgentFD),
			"-device", "virtserialport,bus="+SerialController+".0,id="+AgentPortID+",chardev="+AgentChardev+",name="+AgentPortName,
		)
	}
	// A TPM 2.0 on the CRB interface (what Windows 11 and Linux's
	// tpm_crb expect on q35), emulated by swtpm: QEMU sends the TPM's
	// commands, and gets and sets its state for a migration, over the
	// control channel, on which it also hands swtpm a data socket.
	if s.TPMFD != 0 {
		args = append(args,
			"-chardev", fmt.Sprintf("socket,id=%s,fd=%d", TPMChardev, s.TPMFD),
			"-tpmdev", "emulator,id="+TPMDevice+",chardev="+TPMChardev,
			"-device", "tpm-crb,tpmdev="+TPMDevice,
		)
	}
	// A guest panic reported through pvpanic makes QEMU exit non-zero.
	args = append(args, "-device", "pvpanic", "-action", "panic=exit-failure")
	if s.Sandbox {
		args = append(args, "-sandbox", sandboxOptions)
	}
	if s.Paused {
		args = append(args, "-S")
	}
	if s.Incoming {
		args = append(args, "-incoming", "defer")
	}
	// -kernel, -initrd and -append take their value verbatim, not as an
	// option list, so commas are not doubled there.
	if s.Kernel != "" {
		args = append(args, "-kernel", s.Kernel)
		if s.Initrd != "" {
			args = append(args, "-initrd", s.Initrd)
		}
		if s.Append != "" {
			args = append(args, "-append", s.Append)
		}
	}
	args = append(args, s.driveArgs()...)
	for _, n := range s.NICs {
		args = append(args, s.nicArgs(n)...)
	}
	// Shares and passed-through functions come last, so adding one never
	// moves the PCI slot, and with it the guest's name, of a disk or NIC.
	for _, sh := range s.Shares {
		args = append(args, s.shareArgs(sh)...)
	}
	for i, addr := range s.VFIO {
		args = append(args, "-device", "vfio-pci,host="+addr+",id="+VFIODeviceID(i))
	}
	args = append(args, s.virtioMemArgs()...)
	return append(args, s.balloonArgs()...), nil
}

// listenChardev renders a server socket chardev: on the listening socket
// fd QEMU inherited, or on path, which QEMU then creates.
func listenChardev(id, path string, fd int) string {
	if fd != 0 {
		return fmt.Sprintf("socket,id=%s,fd=%d,server=on,wait=off", id, fd)
	}
	return opts{"socket", "id=" + id}.add("path", path).add("server", "on").add("wait", "off").String()
}

// driveArgs renders the block nodes and devices for validated drives.
func (s Spec) driveArgs() []string {
	var args []string
	made := map[string]bool{}
	on := map[string]int{} // drives so far on each controller
	for _, d := range s.Drives {
		args = append(args, blockdevArgs(d)...)
		driver := d.Driver
		if driver == "" {
			driver = DriverVirtioBlk
		}
		args = append(args, s.controllerArgs(driver, made)...)
		args = append(args, "-device", s.deviceOpts(d, driver, on[driver]).String())
		on[driver]++
	}
	return args
}

// blockdevArgs renders a drive's -blockdev options: an optional read-only
// base (file + format node), then the top file node and format node.
//
// -blockdev takes JSON here: it needs no escaping, and it is the only syntax
// for "backing": null. Every qcow2 node names its backing explicitly (the
// base node, or null), so QEMU never opens a backing file named in an image.
func blockdevArgs(d Drive) []string {
	var args []string
	top := formatNode(DiskNode(d.ID), FileNode(d.ID), d.Format, d.ReadOnly)
	top.Size = d.Size
	if d.BackingPath != "" {
		base := formatNode(BaseNode(d.ID), BaseFileNode(d.ID), d.BackingFormat, true)
		args = append(args,
			"-blockdev", fileNode(BaseFileNode(d.ID), d.BackingPath, true).String(),
			"-blockdev", base.String(),
		)
		top.Backing = jsonString(BaseNode(d.ID))
	}
	return append(args,
		"-blockdev", protocolNode(d).String(),
		"-blockdev", top.String(),
	)
}

// blockdev is one -blockdev node; fields are emitted in declaration order.
type blockdev struct {
	Driver   string          `json:"driver"`
	NodeName string          `json:"node-name"`
	Filename string          `json:"filename,omitempty"`
	File     string          `json:"file,omitempty"`
	Backing  json.RawMessage `json:"backing,omitempty"`
	ReadOnly bool            `json:"read-only,omitempty"`
	Discard  string          `json:"discard,omitempty"`
	Size     int64           `json:"size,omitempty"` // raw only: the guest sees this much of the file
}

// String renders the node as one-line JSON.
func (b blockdev) String() string {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(b) // plain strings and bools always encode
	return strings.TrimSuffix(buf.String(), "\n")
}

func jsonString(s string) json.RawMessage {
	b, _ := json.Marshal(s)
	return b
}

func fileNode(name, path string, readOnly bool) blockdev {
	return withAccess(blockdev{Driver: "file", NodeName: name, Filename: path}, readOnly)
}

// protocolNode is a drive's top protocol node: a file, or a host block device.
func protocolNode(d Drive) blockdev {
	b := fileNode(FileNode(d.ID), d.Path, d.ReadOnly)
	if d.HostDevice {
		b.Driver = "host_device"
	}
	return b
}

func formatNode(name, file, format string, readOnly bool) blockdev {
	b := blockdev{Driver: format, NodeName: name, File: file}
	if format == FormatQCOW2 {
		b.Backing = json.RawMessage("null")
	}
	return withAccess(b, readOnly)
}

// withAccess makes a node read-only, or writable with guest discards
// passed down so a deleted file frees space in the image.
func withAccess(b blockdev, readOnly bool) blockdev {
	if readOnly {
		b.ReadOnly = true
	} else {
		b.Discard = "unmap"
	}
	return b
}

func (s Spec) deviceOpts(d Drive, driver string, n int) opts {
	var o opts
	serial := d.Serial
	switch driver {
	case DriverVirtioSCSI:
		o = opts{"scsi-hd", "bus=" + SCSIController + ".0"}
		if d.CDROM {
			o[0] = "scsi-cd"
		}
	case DriverSATA, DriverIDE:
		o = ataOpts(d, driver, n)
	case DriverNVMe:
		o = opts{"nvme"}
		if serial == "" {
			serial = d.ID
		}
	default:
		o = opts{s.virtioDevice("virtio-blk-pci")}
	}
	o = append(o, "id="+DeviceID(d.ID), "drive="+DiskNode(d.ID))
	if serial != "" {
		o = o.add("serial", serial)
	}
	if d.BootIndex != 0 {
		o = append(o, "bootindex="+strconv.Itoa(d.BootIndex))
	}
	return o
}

func (s Spec) nicArgs(n NIC) []string {
	mac, _ := canonicalMAC(n.MAC) // validated by Spec.Validate
	dev := fmt.Sprintf("%s,id=%s,netdev=%s,mac=%s", s.virtioDevice(nicDevices[n.Model]), NICDeviceID(n.ID), NetdevID(n.ID), mac)
	if !s.microVM() {
		// romfile= drops the PXE option ROM: VMs never boot from the network.
		dev += ",romfile="
	}
	return []string{"-netdev", fmt.Sprintf("tap,id=%s,fd=%d", NetdevID(n.ID), n.TapFD), "-device", dev}
}

// shareArgs renders a share's 9p backend and device. With security_model
// none, QEMU creates files as itself and keeps no guest ownership metadata.
func (s Spec) shareArgs(sh Share) []string {
	fsdev := opts{"local", "id=" + FSDevID(sh.ID)}.add("path", sh.Path).add("security_model", "none")
	if sh.ReadOnly {
		fsdev = append(fsdev, "readonly=on")
	}
	return []string{
		"-fsdev", fsdev.String(),
		"-device", s.virtioDevice("virtio-9p-pci") + ",id=" + ShareDeviceID(sh.ID) + ",fsdev=" + FSDevID(sh.ID) + ",mount_tag=" + sh.Tag,
	}
}
