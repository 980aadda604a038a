package network

import (
	"errors"
	"testing"

	"github.com/containerd/errdefs"
)

// TestAdoptMACs: the pod's interfaces take a resumed guest's MACs in
// Inspect's order, and Inspect, then the NICs, have them; a wrong count
// or a MAC that is not unicast changes nothing.
func TestAdoptMACs(t *testing.T) {
	ctx := testCtx(t)
	e := newPodEnv(t)
	eth0 := e.addLink("eth0", 99, bridgeLike)
	net1 := e.addLink("net1", 98, sideLink)
	before := e.snapshot()
	for _, bad := range [][]string{
		{"02:00:00:00:00:01"},
		{"02:00:00:00:00:01", "02:00:00:00:00:02", "02:00:00:00:00:03"},
		{"02:00:00:00:00:01", "03:00:00:00:00:02"},
		{"02:00:00:00:00:01", "00:00:00:00:00:00"},
		{"02:00:00:00:00:01", "not-a-mac"},
		{"02:00:00:00:00:01", "02:00:00:00:00:00:00:02"},
	} {
		err := AdoptMACs(e.path, bad)
		if err == nil || !(errdefs.IsInvalidArgument(err) || errdefs.IsFailedPrecondition(err)) {
			t.Errorf("AdoptMACs(%q): %v, want a refusal", bad, err)
		}
		if after := e.snapshot(); after != before {
			t.Fatalf("a refused AdoptMACs(%q) changed the netns\n--- before\n%s\n--- after\n%s", bad, before, after)
		}
	}
	if err := AdoptMACs(e.path, []string{eth0.mac.String(), net1.mac.String()}); err != nil {
		t.Fatalf("AdoptMACs of the MACs they have: %v", err)
	}
	want := []string{"02:42:0a:00:00:07", "02:42:0a:00:00:08"}
	if err := AdoptMACs(e.path, want); err != nil {
		t.Fatalf("AdoptMACs: %v", err)
	}
	pl, err := Inspect(ctx, e.path, Options{})
	if err != nil {
		t.Fatalf("inspect: %v", err)
	}
	n, err := pl.Wire(ctx)
	if err != nil {
		t.Fatalf("wire: %v", err)
	}
	defer n.Teardown(ctx)
	nics := n.NICs()
	if len(nics) != 2 || nics[0].MAC.String() != want[0] || nics[1].MAC.String() != want[1] {
		t.Fatalf("nics %+v, want MACs %v", nics, want)
	}
	if l := nics[0].Lease; l == nil || l.MAC.String() != want[0] {
		t.Errorf("eth0's lease %+v is not for %s", l, want[0])
	}
	if err := AdoptMACs("/proc/self/ns/net", want); err == nil {
		t.Error("AdoptMACs in the caller's own netns")
	}
	if err := AdoptMACs(e.path+"-missing", want); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("AdoptMACs of a missing netns: %v", err)
	}
}
