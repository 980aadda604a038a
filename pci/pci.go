// Package pci checks the PCI function addresses that pass from the host's
// sysfs (host-device discovery) to QEMU's command line (VFIO passthrough):
// one rule for both sides.
package pci

import "fmt"

// CheckAddress checks that a is a PCI function address as sysfs
// names it: DDDD:BB:DD.F in lower-case hex, device at most 1f, function at most 7.
func CheckAddress(a string) error {
	if len(a) != len("0000:00:00.0") || a[4] != ':' || a[7] != ':' || a[10] != '.' {
		return fmt.Errorf("%q is not a pci address DDDD:BB:DD.F", a)
	}
	for _, i := range []int{0, 1, 2, 3, 5, 6, 8, 9, 11} {
		if c := a[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return fmt.Errorf("%q is not a pci address DDDD:BB:DD.F in lower-case hex", a)
		}
	}
	if a[8] > '1' {
		return fmt.Errorf("%q has a device number above 1f", a)
	}
	if a[11] > '7' {
		return fmt.Errorf("%q has a function number above 7", a)
	}
	return nil
}
