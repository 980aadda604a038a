package qemu

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"

	"github.com/vmshim/vmshim/pci"
)

// Accel is a QEMU accelerator.
type Accel string

const (
	// AccelKVM runs the guest with hardware virtualization.
	AccelKVM Accel = "kvm"
	// AccelTCG runs the guest with QEMU's binary translator.
	AccelTCG Accel = "tcg"
)

// Disk image formats a Drive may name.
const (
	// FormatQCOW2 is the qcow2 image format.
	FormatQCOW2 = "qcow2"
	// FormatRaw is a raw image.
	FormatRaw = "raw"
)

// Disk controllers a Drive may name.
const (
	// DriverVirtioBlk attaches the disk as a virtio-blk PCI device.
	DriverVirtioBlk = "virtio-blk"
	// DriverVirtioSCSI attaches the disk as a scsi-hd on a virtio-scsi controller.
	DriverVirtioSCSI = "virtio-scsi"
	// DriverNVMe attaches the disk as an NVMe controller.
	DriverNVMe = "nvme"
)

// Limits enforced by Spec validation.
const (
	// MinMemoryMiB is the smallest guest RAM accepted.
	MinMemoryMiB = 16
	// MaxMemoryMiB is the largest guest RAM accepted (16 TiB).
	MaxMemoryMiB = 16 << 20
	// MaxCPUs is the largest vCPU count accepted (q35 without an IOMMU).
	MaxCPUs = 255
	// MaxIDLen bounds Drive and NIC IDs so derived QEMU node names stay
	// within QEMU's 31-character limit.
	MaxIDLen = 20
	// MaxSerialLen is the longest disk serial every disk driver keeps intact.
	MaxSerialLen = 20
	// MaxNameLen bounds the guest name.
	MaxNameLen = 253
	// MaxTagLen is the longest 9p mount tag QEMU's virtio-9p device accepts.
	MaxTagLen = 31
)

// Drive is one guest block device, its image format pinned (never probed).
//
// A qcow2 image is always opened with an explicit backing node, or with no
// backing file at all when BackingPath is empty, so QEMU never follows a
// backing file name stored in an image header.
type Drive struct {
	ID            string // [a-z0-9-]+, unique; used for node names and device ids
	Path          string // top image file
	Format        string // "qcow2" or "raw"
	BackingPath   string // optional: read-only base image under a qcow2 top image
	BackingFormat string // "qcow2" or "raw" when BackingPath is set
	ReadOnly      bool
	Driver        string // "virtio-blk" (default when empty), "virtio-scsi", "nvme"
	BootIndex     int    // 0 = not a boot device; otherwise bootindex=N
	Serial        string // optional device serial (defaults to ID for nvme, which needs one)
	HostDevice    bool   // Path is a host block device, opened with QEMU's host_device driver; Format must be raw
	// CDROM makes the drive a CD-ROM (read-only raw, on sata, ide or
	// virtio-scsi): an installer's ISO.
	CDROM bool
	// Size, for a raw drive, is how much of its file the guest sees,
	// from the start; 0 is all of it. A multiple of 512.
	Size int64
}

// NIC is one guest network card backed by an already-open tap fd.
type NIC struct {
	ID    string // [a-z0-9-]+
	TapFD int    // fd number as QEMU sees it (see FDSet)
	MAC   string // aa:bb:cc:dd:ee:ff
	Model string // NICVirtio (default when empty), NICE1000, NICE1000E or NICRTL8139
}

// Share is a host directory exported to the guest over virtio-9p.
type Share struct {
	ID       string // [a-z0-9-]+, unique; used for the fsdev and device ids
	Tag      string // [a-z0-9-]+, unique, at most MaxTagLen bytes; the guest mounts the share by this tag
	Path     string // host directory, absolute and clean
	ReadOnly bool   // QEMU refuses every write, whatever the guest mounts
}

// Spec describes one VM; BuildArgs turns it into a QEMU command line.
type Spec struct {
	Name  string // guest name (-name); no control characters, at most MaxNameLen bytes
	Accel Accel
	CPUs  int // vCPUs the guest boots with
	// PluggedCPUs is how many vCPUs QEMU has at boot, ≥ CPUs; the guest
	// is to keep those beyond CPUs offline (the shim's maxcpus= for a
	// kernel boot) until a resize brings them online. 0 means CPUs.
	PluggedCPUs int
	// MaxCPUs is the most vCPUs the guest can have by hot-plug; 0 or
	// CPUs for none. It equals Topology.CPUs() when that is set.
	MaxCPUs int
	// Topology shapes MaxCPUs vCPUs; zero is one socket of cores.
	Topology  Topology
	MemoryMiB int
	// ResizeMiB is how far guest RAM can grow beyond MemoryMiB, with a
	// virtio-mem device; 0 for none.
	ResizeMiB int
	// HugePageSize, when set (2 MiB or 1 GiB), backs guest RAM with
	// preallocated huge pages of that size.
	HugePageSize int64
	// NUMA splits guest RAM and the vCPUs into nodes bound to host
	// nodes; nil for none.
	NUMA        []NUMANode
	Drives      []Drive
	NICs        []NIC
	Kernel      string // direct kernel boot when set
	Initrd      string
	Append      string // kernel command line (only with Kernel)
	QMPSocket   string // unix socket path the shim dials for QMP
	QMPFD       int    // fd number (as QEMU sees it) of the QMP socket, listening; 0 = QEMU listens on QMPSocket itself
	ConsoleFD   int    // fd number (as QEMU sees it) of a connected unix stream socket for the first serial port; 0 = no console
	TPMFD       int    // fd number of a connected unix stream socket to the control channel of the VM's TPM emulator (swtpm); 0 = no TPM
	Sandbox     bool   // -sandbox on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny
	Paused      bool   // -S: start with vCPUs stopped (containerd create → start)
	Incoming    bool   // -incoming defer: the VM's state is loaded (Client.LoadState), not booted
	AgentSocket string // unix socket path the shim dials for the guest agent's virtio-serial port; "" = none
	AgentFD     int    // fd number of the agent socket, listening; 0 = QEMU listens on AgentSocket itself
	Shares      []Share
	VFIO        []string // host PCI functions to pass through, as DDDD:BB:DD.F in lower-case hex
	// Firmware boots UEFI from flash; nil boots SeaBIOS (or the kernel).
	Firmware *Firmware
	// VNC gives the VM a display adapter and a VNC server, which takes
	// only clients handed to it over QMP.
	VNC bool
	// Windows applies what Windows guests want: Hyper-V enlightenments
	// and an RTC in local time.
	Windows bool
	// Machine is MachineQ35 (also when "") or MachineMicroVM.
	Machine string
	// Unmergeable keeps guest RAM from KSM (mem-merge=off): by QEMU's
	// default it is offered (MADV_MERGEABLE), which costs nothing where
	// the node does not run KSM.
	Unmergeable bool
	// Balloon gives the VM a virtio-balloon device, never inflated, with
	// free page reporting: the pages the guest frees go back to the
	// host. Not with guest RAM on huge pages or VFIO devices.
	Balloon bool
	// FDSets are inherited fds QEMU files under fd sets (-add-fd); a
	// drive whose Path is FDSetPath(set) opens the fd of its set whose
	// access mode matches, so QEMU resolves no path of its own.
	FDSets []AddFD
}

// AddFD files an inherited fd under an fd set.
type AddFD struct {
	Set int // fd set id, >= 0
	FD  int // fd number as QEMU sees it, >= 3
}

// FDSetPath is the path under which QEMU opens an fd of set.
func FDSetPath(set int) string { return "/dev/fdset/" + strconv.Itoa(set) }

// maxUnixPath is the room for a path in sockaddr_un, less the NUL.
const maxUnixPath = 107

// invalid returns an ErrInvalidArgument error naming field.
func invalid(field, format string, args ...any) error {
	return fmt.Errorf("invalid %s: %s: %w", field, fmt.Sprintf(format, args...), errdefs.ErrInvalidArgument)
}

// Validate checks every field of s; the error names the first bad field.
func (s Spec) Validate() error {
	if err := checkText("name", s.Name, MaxNameLen); err != nil {
		return err
	}
	if s.Name == "" {
		return invalid("name", "must not be empty")
	}
	if s.Accel != AccelKVM && s.Accel != AccelTCG {
		return invalid("accel", "%q is not kvm or tcg", s.Accel)
	}
	if s.CPUs < 1 || s.CPUs > MaxCPUs {
		return invalid("cpus", "%d is not between 1 and %d", s.CPUs, MaxCPUs)
	}
	if s.MemoryMiB < MinMemoryMiB || s.MemoryMiB > MaxMemoryMiB {
		return invalid("memory", "%d MiB is not between %d and %d MiB", s.MemoryMiB, MinMemoryMiB, MaxMemoryMiB)
	}
	if err := s.validateResources(); err != nil {
		return err
	}
	if err := checkSocket("qmp socket", s.QMPSocket, true); err != nil {
		return err
	}
	if err := checkSocket("agent socket", s.AgentSocket, false); err != nil {
		return err
	}
	if s.AgentSocket != "" && s.AgentSocket == s.QMPSocket {
		return invalid("agent socket", "%q is also the qmp socket", s.AgentSocket)
	}
	for field, fd := range map[string]int{"console fd": s.ConsoleFD, "qmp fd": s.QMPFD, "agent fd": s.AgentFD, "tpm fd": s.TPMFD} {
		if fd != 0 && fd < 3 {
			return invalid(field, "%d is a standard stream, want 0 (none) or >= 3", fd)
		}
	}
	if s.AgentFD != 0 && s.AgentSocket == "" {
		return invalid("agent fd", "set without an agent socket")
	}
	if err := validateFDSets(s.FDSets); err != nil {
		return err
	}
	if err := s.validateBoot(); err != nil {
		return err
	}
	if err := validateDrives(s.Drives); err != nil {
		return err
	}
	if err := checkControllers(s.Drives); err != nil {
		return err
	}
	if err := validateFirmware(s.Firmware); err != nil {
		return err
	}
	if s.Firmware != nil && s.Kernel != "" {
		return invalid("firmware", "a direct kernel boot takes no firmware")
	}
	if err := validateNICs(s.NICs); err != nil {
		return err
	}
	if err := validateShares(s.Shares); err != nil {
		return err
	}
	if err := validateVFIO(s.VFIO); err != nil {
		return err
	}
	if err := s.validateBalloon(); err != nil {
		return err
	}
	return s.validateMachine()
}

func (s Spec) validateBoot() error {
	if err := checkPath("kernel", s.Kernel, false); err != nil {
		return err
	}
	if err := checkPath("initrd", s.Initrd, false); err != nil {
		return err
	}
	if err := checkText("append", s.Append, 0); err != nil {
		return err
	}
	if s.Kernel == "" && s.Initrd != "" {
		return invalid("initrd", "set without kernel")
	}
	if s.Kernel == "" && s.Append != "" {
		return invalid("append", "set without kernel")
	}
	return nil
}

func validateDrives(drives []Drive) error {
	ids := map[string]bool{}
	boot := map[int]string{}
	for i, d := range drives {
		field := fmt.Sprintf("drive[%d]", i)
		if err := checkID(field+" id", d.ID); err != nil {
			return err
		}
		field = fmt.Sprintf("drive %q", d.ID)
		if ids[d.ID] {
			return invalid(field+" id", "duplicate")
		}
		ids[d.ID] = true
		if err := d.validate(field); err != nil {
			return err
		}
		if d.BootIndex != 0 {
			if other, ok := boot[d.BootIndex]; ok {
				return invalid(field+" boot index", "%d is also used by drive %q", d.BootIndex, other)
			}
			boot[d.BootIndex] = d.ID
		}
	}
	return nil
}

func (d Drive) validate(field string) error {
	if err := checkPath(field+" path", d.Path, true); err != nil {
		return err
	}
	if err := checkFormat(field+" format", d.Format); err != nil {
		return err
	}
	if d.HostDevice && d.Format != FormatRaw {
		return invalid(field+" format", "a host device must be %s, not %s", FormatRaw, d.Format)
	}
	if err := checkPath(field+" backing path", d.BackingPath, false); err != nil {
		return err
	}
	switch {
	case d.BackingPath != "" && d.Format != FormatQCOW2:
		return invalid(field+" backing path", "a %s image cannot have a backing image", d.Format)
	case d.BackingPath != "":
		if err := checkFormat(field+" backing format", d.BackingFormat); err != nil {
			return err
		}
	case d.BackingFormat != "":
		return invalid(field+" backing format", "set without backing path")
	}
	switch d.Driver {
	case "", DriverVirtioBlk, DriverVirtioSCSI, DriverNVMe, DriverSATA, DriverIDE:
	default:
		return invalid(field+" driver", "%q is not %s, %s, %s, %s or %s", d.Driver, DriverVirtioBlk, DriverVirtioSCSI, DriverNVMe, DriverSATA, DriverIDE)
	}
	switch {
	case d.Size < 0 || d.Size%512 != 0:
		return invalid(field+" size", "%d is not a non-negative multiple of 512", d.Size)
	case d.Size > 0 && d.Format != FormatRaw:
		return invalid(field+" size", "only a %s drive can be cut to a size", FormatRaw)
	}
	if d.BootIndex < 0 {
		return invalid(field+" boot index", "%d is negative", d.BootIndex)
	}
	if len(d.Serial) > MaxSerialLen {
		return invalid(field+" serial", "longer than %d characters", MaxSerialLen)
	}
	for _, r := range d.Serial {
		if r <= ' ' || r > '~' {
			return invalid(field+" serial", "%q has a character outside printable ascii", d.Serial)
		}
	}
	return nil
}

func validateNICs(nics []NIC) error {
	ids := map[string]bool{}
	fds := map[int]bool{}
	for i, n := range nics {
		field := fmt.Sprintf("nic[%d]", i)
		if err := checkID(field+" id", n.ID); err != nil {
			return err
		}
		field = fmt.Sprintf("nic %q", n.ID)
		if ids[n.ID] {
			return invalid(field+" id", "duplicate")
		}
		ids[n.ID] = true
		if n.TapFD < 3 {
			return invalid(field+" tap fd", "%d is not an inherited fd (>= 3)", n.TapFD)
		}
		if fds[n.TapFD] {
			return invalid(field+" tap fd", "%d is used by another nic", n.TapFD)
		}
		fds[n.TapFD] = true
		if _, err := canonicalMAC(n.MAC); err != nil {
			return invalid(field+" mac", "%v", err)
		}
		if err := checkNICModel(field+" model", n.Model); err != nil {
			return err
		}
	}
	return nil
}

func validateShares(shares []Share) error {
	ids := map[string]bool{}
	tags := map[string]string{}
	for i, sh := range shares {
		field := fmt.Sprintf("share[%d]", i)
		if err := checkID(field+" id", sh.ID); err != nil {
			return err
		}
		field = fmt.Sprintf("share %q", sh.ID)
		if ids[sh.ID] {
			return invalid(field+" id", "duplicate")
		}
		ids[sh.ID] = true
		if !isIDText(sh.Tag) {
			return invalid(field+" tag", "%q does not match [a-z0-9-]+", sh.Tag)
		}
		if len(sh.Tag) > MaxTagLen {
			return invalid(field+" tag", "%q is longer than %d bytes", sh.Tag, MaxTagLen)
		}
		if other, ok := tags[sh.Tag]; ok {
			return invalid(field+" tag", "%q is also the tag of share %q", sh.Tag, other)
		}
		tags[sh.Tag] = sh.ID
		if err := checkPath(field+" path", sh.Path, true); err != nil {
			return err
		}
	}
	return nil
}

func validateFDSets(sets []AddFD) error {
	seen := map[int]bool{}
	for i, a := range sets {
		field := fmt.Sprintf("fd set entry %d", i)
		if a.Set < 0 {
			return invalid(field, "set %d is negative", a.Set)
		}
		if a.FD < 3 {
			return invalid(field, "fd %d is not an inherited fd (>= 3)", a.FD)
		}
		if seen[a.FD] {
			return invalid(field, "fd %d is filed twice", a.FD)
		}
		seen[a.FD] = true
	}
	return nil
}

func validateVFIO(addrs []string) error {
	seen := map[string]bool{}
	for i, a := range addrs {
		field := fmt.Sprintf("vfio[%d]", i)
		if err := pci.CheckAddress(a); err != nil {
			return invalid(field, "%v", err)
		}
		if seen[a] {
			return invalid(field, "%s is listed twice", a)
		}
		seen[a] = true
	}
	return nil
}

// canonicalMAC parses a unicast Ethernet MAC and returns it as aa:bb:cc:dd:ee:ff.
func canonicalMAC(s string) (string, error) {
	hw, err := net.ParseMAC(s)
	if err != nil {
		return "", fmt.Errorf("%q is not a mac address", s)
	}
	if len(hw) != 6 {
		return "", fmt.Errorf("%q is not a 48-bit mac address", s)
	}
	if hw[0]&1 != 0 {
		return "", fmt.Errorf("%q is a multicast address", s)
	}
	return hw.String(), nil
}

// isIDText reports whether s matches [a-z0-9-]+.
func isIDText(s string) bool {
	return s != "" && strings.IndexFunc(s, func(r rune) bool {
		return (r < 'a' || r > 'z') && (r < '0' || r > '9') && r != '-'
	}) < 0
}

func checkID(field, id string) error {
	if !isIDText(id) {
		return invalid(field, "%q does not match [a-z0-9-]+", id)
	}
	if len(id) > MaxIDLen {
		return invalid(field, "%q is longer than %d characters", id, MaxIDLen)
	}
	return nil
}

func checkFormat(field, format string) error {
	if format != FormatQCOW2 && format != FormatRaw {
		return invalid(field, "%q is not %s or %s", format, FormatQCOW2, FormatRaw)
	}
	return nil
}

// checkText rejects control characters that would break an argv value or a
// log line (newline, NUL and the rest of C0, and DEL); maxLen 0 means no limit.
func checkText(field, s string, maxLen int) error {
	if maxLen > 0 && len(s) > maxLen {
		return invalid(field, "longer than %d bytes", maxLen)
	}
	if i := strings.IndexFunc(s, func(r rune) bool { return r < ' ' && r != '\t' || r == 0x7f }); i >= 0 {
		return invalid(field, "control character %q at byte %d", s[i], i)
	}
	return nil
}

func checkSocket(field, p string, required bool) error {
	if err := checkPath(field, p, required); err != nil {
		return err
	}
	if len(p) > maxUnixPath {
		return invalid(field, "path %q is longer than %d bytes", p, maxUnixPath)
	}
	return nil
}

func checkPath(field, p string, required bool) error {
	if p == "" {
		if required {
			return invalid(field, "must not be empty")
		}
		return nil
	}
	if err := checkText(field, p, 0); err != nil {
		return err
	}
	if !filepath.IsAbs(p) {
		return invalid(field, "%q is not an absolute path", p)
	}
	if filepath.Clean(p) != p {
		return invalid(field, "%q is not a clean path", p)
	}
	if len(p) >= 4096 {
		return invalid(field, "longer than %d bytes", 4095)
	}
	return nil
}

// FDSet collects the files a child process inherits beyond stdio, in the
// order exec.Cmd.ExtraFiles passes them (the first is fd 3).
type FDSet struct {
	files []*os.File
}

// Add appends f and returns the fd number the child will see.
func (s *FDSet) Add(f *os.File) int {
	s.files = append(s.files, f)
	return 2 + len(s.files)
}

// Files returns the files for exec.Cmd.ExtraFiles.
func (s *FDSet) Files() []*os.File {
	return append([]*os.File(nil), s.files...)
}

// Close closes every file in the set (the child keeps its own copies).
func (s *FDSet) Close() error {
	var first error
	for _, f := range s.files {
		if err := f.Close(); err != nil && first == nil {
			first = err
		}
	}
	s.files = nil
	return first
}
