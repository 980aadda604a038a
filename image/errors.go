package image

import (
	"fmt"
	"strings"

	"github.com/containerd/errdefs"
)

// invalidf returns a one-line error that is errdefs.ErrInvalidArgument.
func invalidf(format string, args ...any) error {
	return errdefs.ErrInvalidArgument.WithMessage(oneLine(fmt.Sprintf(format, args...)))
}

// notFoundf returns a one-line error that is errdefs.ErrNotFound.
func notFoundf(format string, args ...any) error {
	return errdefs.ErrNotFound.WithMessage(oneLine(fmt.Sprintf(format, args...)))
}

// preconditionf returns a one-line error that is errdefs.ErrFailedPrecondition.
func preconditionf(format string, args ...any) error {
	return errdefs.ErrFailedPrecondition.WithMessage(oneLine(fmt.Sprintf(format, args...)))
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
