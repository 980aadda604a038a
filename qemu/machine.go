package qemu

import "strings"

// Machines a VM runs on.
const (
	// MachineQ35 is a PC with PCI Express: every device, firmware and
	// hot-plug. It is the default.
	MachineQ35 = "q35"
	// MachineMicroVM is QEMU's minimal machine for a direct kernel boot:
	// no PCI and no firmware to run, virtio devices on MMIO, described
	// to the guest in ACPI. It starts sooner and boots a kernel sooner
	// than q35, and needs less of QEMU; the guest kernel must have
	// virtio-mmio (CONFIG_VIRTIO_MMIO, built in or in its initrd).
	MachineMicroVM = "microvm"
)

// MachineType is the machine of a Spec that names none.
const MachineType = MachineQ35

// microVM reports whether s runs on the microvm machine.
func (s Spec) microVM() bool { return s.Machine == MachineMicroVM }

// machineArgs renders -machine: the machine, its RAM backend, and
// firmware flash or Secure Boot's SMM. q35 goes without what no VM of
// the shim's uses: the SMBus, VMware's I/O port unless the VM has a
// screen, and the built-in AHCI controller unless a drive is on SATA. microvm keeps its serial port, for the
// console, and its RTC.
func (s Spec) machineArgs() []string {
	if s.microVM() {
		return []string{"-machine", MachineMicroVM + ",isa-serial=on,rtc=on,pcie=off" + s.machineMemory() + s.memMerge()}
	}
	m := MachineQ35 + s.machineMemory() + s.memMerge() + ",smbus=off"
	if !s.VNC {
		m += ",vmport=off" // a screen's guest may drive its mouse through it
	}
	if !s.onSATA() {
		m += ",sata=off"
	}
	if fw := s.Firmware; fw != nil {
		if fw.SecureBoot {
			m += ",smm=on"
		}
		m += ",pflash0=" + FirmwareCodeNode + ",pflash1=" + FirmwareVarsNode
	}
	return []string{"-machine", m}
}

// memMerge is the -machine option that keeps guest RAM from KSM, when
// the VM asks.
func (s Spec) memMerge() string {
	if s.Unmergeable {
		return ",mem-merge=off"
	}
	return ""
}

// onSATA reports whether a drive of s is on the SATA controller.
func (s Spec) onSATA() bool {
	for _, d := range s.Drives {
		if d.Driver == DriverSATA {
			return true
		}
	}
	return false
}

// virtioDevice is the virtio device driver for s's machine: pci's
// "virtio-blk-pci", or microvm's MMIO "virtio-blk-device".
func (s Spec) virtioDevice(pci string) string {
	if s.microVM() {
		return strings.TrimSuffix(pci, "-pci") + "-device"
	}
	return pci
}

// validateMachine checks the machine, and that a microvm needs nothing
// it lacks.
func (s Spec) validateMachine() error {
	switch s.Machine {
	case "", MachineQ35:
		return nil
	case MachineMicroVM:
	default:
		return invalid("machine", "%q is not %s or %s", s.Machine, MachineQ35, MachineMicroVM)
	}
	lacks := func(what string) error { return invalid("machine", "%s has no %s", MachineMicroVM, what) }
	switch {
	case s.Kernel == "":
		return invalid("machine", "%s boots a kernel directly, and this VM boots a disk", MachineMicroVM)
	case s.Firmware != nil:
		return lacks("firmware")
	case s.VNC:
		return lacks("display")
	case s.TPMFD != 0:
		return lacks("TPM")
	case s.Windows:
		return lacks("devices for Windows")
	case len(s.VFIO) > 0:
		return lacks("PCI bus for passed-through host devices")
	case s.ResizeMiB > 0:
		return lacks("virtio-mem to resize guest RAM")
	case s.hotplug() || s.PluggedCPUs > s.CPUs:
		return lacks("vCPU hot-plug")
	case len(s.NUMA) > 0:
		return lacks("NUMA nodes")
	}
	for _, n := range s.NICs {
		if n.Model != "" && n.Model != NICVirtio {
			return lacks(n.Model + " NIC")
		}
	}
	for _, d := range s.Drives {
		if d.Driver != "" && d.Driver != DriverVirtioBlk && d.Driver != DriverVirtioSCSI {
			return lacks(d.Driver + " disk controller")
		}
	}
	return nil
}
