package image

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/containerd/errdefs"
)

// checkOneLine checks an error is invalid-argument and one line of UTF-8:
// the shim's errors reach kubectl describe through gRPC.
func checkOneLine(t *testing.T, err error) {
	t.Helper()
	msg := err.Error()
	if msg == "" || strings.ContainsAny(msg, "\n\r") || !utf8.ValidString(msg) {
		t.Fatalf("error is not one line of UTF-8: %q", msg)
	}
	if !errdefs.IsInvalidArgument(err) {
		t.Fatalf("error is not invalid-argument: %v", err)
	}
}
