package cloudinit

import (
	"fmt"
	"strings"

	"github.com/containerd/errdefs"
)

// invalidf returns a one-line error that is errdefs.ErrInvalidArgument.
func invalidf(format string, args ...any) error {
	msg := strings.Join(strings.Fields(fmt.Sprintf(format, args...)), " ")
	return errdefs.ErrInvalidArgument.WithMessage(msg)
}
