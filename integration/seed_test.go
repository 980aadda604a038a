package integration

import (
	"context"
	"strings"
	"testing"
)

// TestGuestFindsSeed: a busybox guest, as CirrOS- and Alpine-style images
// are, finds the NoCloud seed the shim writes by its label, with busybox's
// own volume_id (findfs), not util-linux's.
func TestGuestFindsSeed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*bootTimeout)
	defer cancel()
	v := startVM(ctx, t, imageKernelAgent)
	v.console.waitFor(ctx, t, markerAgent)
	dev := strings.TrimSpace(runExec(ctx, t, v, "findfs", "findfs", "LABEL=cidata"))
	t.Logf("busybox findfs LABEL=cidata: %q", dev)
	if !strings.HasPrefix(dev, "/dev/") {
		t.Fatalf("busybox findfs LABEL=cidata found %q, want the seed's device", dev)
	}
}
