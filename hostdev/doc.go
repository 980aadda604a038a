// Package hostdev finds the host devices a container's spec gives it and
// decides which the VM gets, with what access: block devices as disks,
// VFIO groups as PCI passthrough; a privileged container's wholesale host
// devices are withheld. It reads the host's sysfs and nothing else.
package hostdev

import (
	"fmt"

	"github.com/containerd/errdefs"
)

// invalidf returns a one-line error that is errdefs.ErrInvalidArgument.
func invalidf(format string, args ...any) error {
	return errdefs.ErrInvalidArgument.WithMessage(fmt.Sprintf(format, args...))
}
