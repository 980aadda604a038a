package diskcache

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
)

// TestErrorOverGRPC shows an error with a cause crosses gRPC (as the
// shim's create errors do) as one line that starts with its message, of
// the same kind, and still matches its cause here.
func TestErrorOverGRPC(t *testing.T) {
	for _, err := range []error{
		errorf(errdefs.ErrUnavailable, io.ErrUnexpectedEOF, "disk-url http://h/d: download interrupted at 5 bytes"),
		errorf(context.DeadlineExceeded, errors.New("took longer than 1s (config download_timeout)"), "disk-url http://h/d: download stopped at 5 bytes"),
	} {
		back := errgrpc.ToNative(errgrpc.ToGRPC(err))
		if !strings.HasPrefix(back.Error(), err.Error()) {
			t.Errorf("over gRPC %q became %q", err, back)
		}
		checkOneLine(t, back)
		if errdefs.Resolve(back) != errdefs.Resolve(err) {
			t.Errorf("%q: kind %v became %v", err, errdefs.Resolve(err), errdefs.Resolve(back))
		}
	}
	err := errorf(errdefs.ErrUnavailable, io.ErrUnexpectedEOF, "x")
	if !errors.Is(err, io.ErrUnexpectedEOF) || !errdefs.IsUnavailable(err) {
		t.Fatalf("%v does not match its cause and kind", err)
	}
	var nf interface{ NotFound() }
	if !errors.As(errorf(errdefs.ErrUnavailable, errdefs.ErrNotFound, "outer"), &nf) {
		t.Fatal("errors.As does not reach the cause")
	}
}
