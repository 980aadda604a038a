package qemu

import "fmt"

// Disk controllers for guests without virtio drivers.
const (
	// DriverSATA attaches the disk (or CD-ROM) to an AHCI controller.
	DriverSATA = "sata"
	// DriverIDE attaches the disk (or CD-ROM) to a PIIX3 IDE controller.
	DriverIDE = "ide"
)

// Controllers the SATA and IDE drivers put their drives on, and how many
// drives each takes.
const (
	SATAController = "sata0"
	IDEController  = "ide0"
	maxSATADrives  = 6 // the AHCI controller's ports
	maxIDEDrives   = 4 // two buses, a master and a slave each
)

// NIC models a NIC may name.
const (
	NICVirtio  = "virtio"
	NICE1000   = "e1000"
	NICE1000E  = "e1000e"
	NICRTL8139 = "rtl8139"
)

// nicDevices are the QEMU devices of the NIC models.
var nicDevices = map[string]string{"": "virtio-net-pci", NICVirtio: "virtio-net-pci", NICE1000: "e1000", NICE1000E: "e1000e", NICRTL8139: "rtl8139"}

// checkNICModel validates a NIC's model.
func checkNICModel(field, model string) error {
	if _, ok := nicDevices[model]; !ok {
		return invalid(field, "%q is not %s, %s, %s or %s", model, NICVirtio, NICE1000, NICE1000E, NICRTL8139)
	}
	return nil
}

// checkControllers checks the drives fit on the SATA and IDE controllers
// and that CD-ROMs are on a bus that has them.
func checkControllers(drives []Drive) error {
	counts := map[string]int{}
	for _, d := range drives {
		counts[d.Driver]++
		if d.CDROM {
			switch {
			case d.Driver != DriverSATA && d.Driver != DriverIDE && d.Driver != DriverVirtioSCSI:
				return invalid(fmt.Sprintf("drive %q driver", d.ID), "a CD-ROM goes on %s, %s or %s, not %q", DriverSATA, DriverIDE, DriverVirtioSCSI, d.Driver)
			case !d.ReadOnly || d.Format != FormatRaw || d.BackingPath != "":
				return invalid(fmt.Sprintf("drive %q", d.ID), "a CD-ROM is a read-only raw image")
			}
		}
	}
	if n := counts[DriverSATA]; n > maxSATADrives {
		return invalid("drives", "%d on %s, more than its %d ports", n, DriverSATA, maxSATADrives)
	}
	if n := counts[DriverIDE]; n > maxIDEDrives {
		return invalid("drives", "%d on %s, more than its %d places", n, DriverIDE, maxIDEDrives)
	}
	return nil
}

// controllerArgs adds the controller a drive's driver needs, once.
func (s Spec) controllerArgs(driver string, made map[string]bool) []string {
	if made[driver] {
		return nil
	}
	made[driver] = true
	switch driver {
	case DriverVirtioSCSI:
		return []string{"-device", s.virtioDevice("virtio-scsi-pci") + ",id=" + SCSIController}
	case DriverSATA:
		return []string{"-device", "ahci,id=" + SATAController}
	case DriverIDE:
		return []string{"-device", "piix3-ide,id=" + IDEController}
	}
	return nil
}

// ataOpts are the device options of the n-th drive on the SATA or IDE
// controller.
func ataOpts(d Drive, driver string, n int) opts {
	dev := "ide-hd"
	if d.CDROM {
		dev = "ide-cd"
	}
	if driver == DriverSATA {
		return opts{dev, fmt.Sprintf("bus=%s.%d", SATAController, n)}
	}
	return opts{dev, fmt.Sprintf("bus=%s.%d", IDEController, n/2), fmt.Sprintf("unit=%d", n%2)}
}
