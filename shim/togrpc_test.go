package shim

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
)

// TestToGRPCOneLine: an error that wraps its class and its causes crosses
// the RPC edge as its own message alone, of its class, as containerd
// reads it (errgrpc alone adds each cause on a line of its own).
func TestToGRPCOneLine(t *testing.T) {
	cause := errors.New("dial tcp 10.0.0.1:80: connect: connection refused")
	for _, tc := range []struct {
		name string
		err  error
		is   error
	}{
		{"class and cause", fmt.Errorf("disk-url http://x/d: %w: %w", errdefs.ErrUnavailable, cause), errdefs.ErrUnavailable},
		{"joined", errors.Join(fmt.Errorf("create: %w", errdefs.ErrInvalidArgument), cause), errdefs.ErrInvalidArgument},
		{"cause and deadline", fmt.Errorf("guest agent: %w: %w", cause, context.DeadlineExceeded), context.DeadlineExceeded},
		{"no class", fmt.Errorf("read: %w", cause), errdefs.ErrUnknown},
		{"class and a classed cause", &causeError{errdefs.ErrFailedPrecondition, fmt.Errorf("refused: %w", errdefs.ErrUnavailable)}, errdefs.ErrFailedPrecondition},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := errgrpc.ToNative(toGRPC(tc.err))
			if want := tc.err.Error(); got.Error() != want {
				t.Errorf("message %q, want %q", got.Error(), want)
			}
			if tc.is != errdefs.ErrUnknown && !errors.Is(got, tc.is) {
				t.Errorf("%v is not %v", got, tc.is)
			}
		})
	}
	if toGRPC(nil) != nil {
		t.Error("toGRPC(nil) is not nil")
	}
}

// causeError is an error with a class and a cause, as diskcache makes.
type causeError struct{ kind, cause error }

func (e *causeError) Error() string   { return "disk-url http://x/d: dial tcp: " + e.cause.Error() }
func (e *causeError) Unwrap() []error { return []error{e.kind, e.cause} }
