package network

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// setup wires the pod netns and waits until port-forward has started (or
// failed to), which Setup leaves to a goroutine.
func (e *podEnv) setup(ctx context.Context) *Network {
	e.t.Helper()
	n, err := Setup(ctx, e.path, Options{Hostname: "vm-pod", ResolvConf: e.resolvConf})
	if err != nil {
		e.t.Fatalf("setup: %v", err)
	}
	e.t.Cleanup(func() { _ = n.Teardown(context.Background()) })
	<-n.fwdTried
	return n
}

func TestSetup(t *testing.T) {
	for _, tc := range []struct {
		name string
		kind linkKind
		mask int
	}{
		{"bridge", bridgeLike, 24},
		{"ptp", ptpLike, 32},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			e := newPodEnv(t)
			pl := e.addLink("eth0", 99, tc.kind)
			before := e.snapshot()
			n := e.setup(ctx)

			nics := n.NICs()
			if len(nics) != 1 {
				t.Fatalf("got %d nics, want 1", len(nics))
			}
			nic := nics[0]
			if nic.Name != "eth0" || nic.MAC.String() != pl.mac.String() || nic.Tap == nil {
				t.Fatalf("nic = %+v, want eth0 with mac %s and a tap", nic, pl.mac)
			}
			checkLease(t, nic.Lease, pl, tc.mask, tc.kind)
			checkWired(t, e, pl)

			exerciseDataPath(t, e, nic, pl)
			checkFilterHits(t, e)

			if err := n.Teardown(ctx); err != nil {
				t.Fatalf("teardown: %v", err)
			}
			if after := e.snapshot(); after != before {
				t.Errorf("netns differs after teardown\n--- before\n%s\n--- after\n%s", before, after)
			}
			if err := n.Teardown(ctx); err != nil {
				t.Errorf("second teardown: %v", err)
			}
		})
	}
}

func checkLease(t *testing.T, l *Lease, pl podLink, mask int, kind linkKind) {
	t.Helper()
	if l == nil {
		t.Fatal("no lease")
	}
	if !l.IP.Equal(pl.podIP) || !slices.Equal(l.Mask, net.CIDRMask(mask, 32)) || !l.Gateway.Equal(pl.gw) ||
		!l.ServerID.Equal(pl.gw) || l.MTU != 1400 || l.Hostname != "vm-pod" || l.LeaseTime != 24*time.Hour ||
		l.MAC.String() != pl.mac.String() {
		t.Errorf("lease = %+v", l)
	}
	if len(l.DNS) != 1 || !l.DNS[0].Equal(mustIP("10.96.0.10")) ||
		!slices.Equal(l.Search, []string{"default.svc.cluster.local", "svc.cluster.local"}) {
		t.Errorf("lease dns %v search %v", l.DNS, l.Search)
	}
	var got []string
	for _, r := range l.Routes {
		got = append(got, routeString(r))
	}
	want := []string{"169.254.1.1/32 on-link", "default via " + pl.gw.String()}
	if kind == ptpLike {
		want = append([]string{pl.gw.String() + "/32 on-link"}, want...)
	}
	if !slices.Equal(got, want) {
		t.Errorf("lease routes = %q, want %q", got, want)
	}
}

func routeString(r Route) string {
	dst := "default"
	if r.Dst != nil {
		dst = r.Dst.String()
	}
	if r.Gw == nil {
		return dst + " on-link"
	}
	return dst + " via " + r.Gw.String()
}

// checkWired looks at the netns as Setup left it.
func checkWired(t *testing.T, e *podEnv, pl podLink) {
	t.Helper()
	link, err := e.podH.LinkByName(pl.name)
	if err != nil {
		t.Fatal(err)
	}
	addrs, _ := e.podH.AddrList(link, netlink.FAMILY_V4)
	if len(addrs) == 0 {
		t.Errorf("%s lost its ipv4 addresses", pl.name)
	}
	for _, a := range addrs {
		routes, err := e.podH.RouteGet(a.IP)
		if err != nil || len(routes) != 1 || routes[0].LinkIndex == link.Attrs().Index || routes[0].Type == unix.RTN_LOCAL {
			t.Errorf("the netns still routes %s to itself: %+v %v", a.IP, routes, err)
		}
	}
	if addrs, _ := e.podH.AddrList(link, netlink.FAMILY_V6); !slices.ContainsFunc(addrs, func(a netlink.Addr) bool {
		return strings.HasPrefix(a.IP.String(), "fd00:")
	}) {
		t.Errorf("%s lost its ipv6 address: %v", pl.name, addrs)
	}
	tap, err := e.podH.LinkByName("vmtap0")
	if err != nil {
		t.Fatalf("no tap: %v", err)
	}
	if tap.Attrs().MTU != 1400 || tap.Type() != "tuntap" || tap.Attrs().Flags&net.FlagUp == 0 {
		t.Errorf("tap = %s mtu %d flags %v", tap.Type(), tap.Attrs().MTU, tap.Attrs().Flags)
	}
	// The link-local address the netns reaches the guest from, and the
	// router address of the guest's IPv6.
	router := eui64LinkLocal(tap.Attrs().HardwareAddr).String() + "/64"
	addrs, _ = e.podH.AddrList(tap, netlink.FAMILY_ALL)
	var got []string
	for _, a := range addrs {
		got = append(got, a.IPNet.String())
	}
	if !slices.Equal(got, []string{"169.254.1.1/32", router}) {
		t.Errorf("tap addresses = %v, want 169.254.1.1/32 and %s", got, router)
	}
	for key, want := range map[string]string{"force_forwarding": "1", "forwarding": "1", "accept_ra": "0"} {
		if got := strings.TrimSpace(e.podCmd("cat", sysctl6("vmtap0", key))); got != want {
			t.Errorf("vmtap0 %s = %s, want %s", key, got, want)
		}
	}
	routes, _ := e.podH.RouteList(tap, netlink.FAMILY_V4)
	if !slices.ContainsFunc(routes, func(r netlink.Route) bool {
		return r.Dst.String() == pl.podIP.String()+"/32" && r.Src.Equal(mustIP("169.254.1.1"))
	}) {
		t.Errorf("no host route to %s via tap: %v", pl.podIP, routes)
	}
}

func TestSetupTwoInterfacesAndRecord(t *testing.T) {
	ctx := testCtx(t)
	e := newPodEnv(t)
	eth0 := e.addLink("eth0", 99, bridgeLike)
	net1 := e.addLink("net1", 98, sideLink)
	before := e.snapshot()
	pl, err := Inspect(ctx, e.path, Options{})
	if err != nil {
		t.Fatalf("inspect: %v", err)
	}
	recorded := pl.State()
	if after := e.snapshot(); after != before {
		t.Errorf("inspect changed the netns\n--- before\n%s\n--- after\n%s", before, after)
	}
	n, err := pl.Wire(ctx)
	if err != nil {
		t.Fatalf("wire: %v", err)
	}
	defer n.Teardown(ctx)
	if _, err := pl.Wire(ctx); err == nil {
		t.Error("a plan wired twice")
	}
	nics := n.NICs()
	if len(nics) != 2 || nics[0].Name != "eth0" || nics[1].Name != "net1" {
		t.Fatalf("nics = %+v, want eth0 then net1", nics)
	}
	if nics[1].MAC.String() != net1.mac.String() || nics[0].MAC.String() != eth0.mac.String() {
		t.Errorf("nic macs %s %s", nics[0].MAC, nics[1].MAC)
	}
	l := nics[1].Lease
	if l == nil || l.Gateway != nil || !l.ServerID.Equal(mustIP("169.254.1.2")) || len(l.DNS) != 0 ||
		len(l.Routes) != 1 || routeString(l.Routes[0]) != "169.254.1.2/32 on-link" {
		t.Errorf("net1 lease = %+v", l)
	}
	if got, want := mustJSON(t, recorded), mustJSON(t, n.State()); got != want {
		t.Errorf("planned state differs from State():\n%s\n%s", got, want)
	}
	if err := n.Teardown(ctx); err != nil {
		t.Fatal(err)
	}
	if after := e.snapshot(); after != before {
		t.Errorf("netns differs after teardown\n--- before\n%s\n--- after\n%s", before, after)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestInspectThenClose checks that a plan that is closed instead of wired
// leaves the netns as it was, and cannot be wired afterwards.
func TestInspectThenClose(t *testing.T) {
	ctx := testCtx(t)
	e := newPodEnv(t)
	e.addLink("eth0", 99, bridgeLike)
	before := e.snapshot()
	pl, err := Inspect(ctx, e.path, Options{})
	if err != nil {
		t.Fatalf("inspect: %v", err)
	}
	pl.Close()
	pl.Close()
	if _, err := pl.Wire(ctx); err == nil {
		t.Error("a closed plan was wired")
	}
	if after := e.snapshot(); after != before {
		t.Errorf("netns changed although the plan was closed\n--- before\n%s\n--- after\n%s", before, after)
	}
}

func TestSetupEmptyNetns(t *testing.T) {
	ctx := testCtx(t)
	e := newPodEnv(t)
	n := e.setup(ctx)
	if len(n.NICs()) != 0 || len(n.State().NICs) != 0 {
		t.Errorf("nics = %+v, want none", n.NICs())
	}
	if err := n.Teardown(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestSetupRefusesBusyLink(t *testing.T) {
	ctx := testCtx(t)
	e := newPodEnv(t)
	e.addLink("eth0", 99, bridgeLike)
	e.podCmd("tc", "qdisc", "add", "dev", "eth0", "clsact")
	before := e.snapshot()
	_, err := Setup(ctx, e.path, Options{})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("setup error = %v, want failed precondition", err)
	}
	if after := e.snapshot(); after != before {
		t.Errorf("netns changed\n--- before\n%s\n--- after\n%s", before, after)
	}
}

func TestRestoreAfterCrash(t *testing.T) {
	ctx := testCtx(t)
	e := newPodEnv(t)
	e.addLink("eth0", 99, ptpLike)
	e.addLink("net1", 98, sideLink)
	before := e.snapshot()
	n := e.setup(ctx)
	raw := mustJSON(t, n.State())
	t.Logf("state: %s", raw)

	// The shim dies: its responders and fds go away, the netns stays wired.
	n.cancel()
	for _, r := range n.responders {
		r.Close()
	}
	n.wg.Wait()
	n.closeTaps()
	n.p.Close()
	n.done = true

	var st State
	if err := json.Unmarshal([]byte(raw), &st); err != nil {
		t.Fatal(err)
	}
	if e.snapshot() == before {
		t.Fatal("netns looks untouched after setup")
	}
	for i := range 2 {
		if err := Restore(ctx, &st); err != nil {
			t.Fatalf("restore %d: %v", i, err)
		}
		if after := e.snapshot(); after != before {
			t.Errorf("netns differs after restore %d\n--- before\n%s\n--- after\n%s", i, before, after)
		}
	}
}

func TestRestoreMissingNetns(t *testing.T) {
	ctx := testCtx(t)
	st := &State{NetNS: t.TempDir() + "/gone", NICs: []NICState{{Link: "eth0", Tap: "vmtap0"}}}
	if err := Restore(ctx, st); err != nil {
		t.Errorf("restore of a missing netns: %v", err)
	}
	if err := Restore(ctx, nil); err != nil {
		t.Errorf("restore of nil state: %v", err)
	}
}

func TestSetupCycles(t *testing.T) {
	ctx := testCtx(t)
	e := newPodEnv(t)
	e.addLink("eth0", 99, bridgeLike)
	count := func() (links, qdiscs, fds int) {
		ls, err := e.podH.LinkList()
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range ls {
			qs, err := e.podH.QdiscList(l)
			if err != nil {
				t.Fatal(err)
			}
			qdiscs += len(qs)
		}
		ents, _ := os.ReadDir("/proc/self/fd")
		return len(ls), qdiscs, len(ents)
	}
	cycle := func() {
		n, err := Setup(ctx, e.path, Options{ResolvConf: e.resolvConf})
		if err != nil {
			t.Fatalf("setup: %v", err)
		}
		if err := n.Teardown(ctx); err != nil {
			t.Fatalf("teardown: %v", err)
		}
	}
	before := e.snapshot()
	cycle() // warm up the runtime poller and netlink
	links, qdiscs, fds := count()
	for range 20 {
		cycle()
	}
	l2, q2, f2 := count()
	if l2 != links || q2 != qdiscs || f2 > fds {
		t.Errorf("after 20 cycles: %d links (had %d), %d qdiscs (had %d), %d fds (had %d)", l2, links, q2, qdiscs, f2, fds)
	}
	if after := e.snapshot(); after != before {
		t.Errorf("netns differs after cycles\n--- before\n%s\n--- after\n%s", before, after)
	}
}

// A tap QEMU still holds is deleted all the same.
func TestTeardownWhileTapHeld(t *testing.T) {
	ctx := testCtx(t)
	e := newPodEnv(t)
	e.addLink("eth0", 99, bridgeLike)
	before := e.snapshot()
	n := e.setup(ctx)
	held, err := unix.Dup(int(n.NICs()[0].Tap.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(held)
	if err := n.Teardown(ctx); err != nil {
		t.Fatalf("teardown: %v", err)
	}
	if after := e.snapshot(); after != before {
		t.Errorf("netns differs after teardown\n--- before\n%s\n--- after\n%s", before, after)
	}
}

// An interface without IPv4 still becomes a NIC, with no lease, no
// IPv4 link-local address and no DHCP responder: the tap has only the
// IPv6 router's address.
func TestSetupWithoutIPv4(t *testing.T) {
	ctx := testCtx(t)
	e := newPodEnv(t)
	e.addIPv6OnlyLink("eth0", 99)
	before := e.snapshot()
	n := e.setup(ctx)
	nics := n.NICs()
	if len(nics) != 1 || nics[0].Lease != nil || nics[0].Tap == nil {
		t.Fatalf("nics = %+v, want one without lease", nics)
	}
	tap, err := e.podH.LinkByName("vmtap0")
	if err != nil {
		t.Fatal(err)
	}
	if addrs, _ := e.podH.AddrList(tap, netlink.FAMILY_ALL); len(addrs) != 1 || !addrs[0].IP.IsLinkLocalUnicast() || nics[0].Lease6 == nil {
		t.Errorf("tap addresses %v, lease6 %+v: want only the IPv6 router's", addrs, nics[0].Lease6)
	}
	if err := n.Teardown(ctx); err != nil {
		t.Fatal(err)
	}
	if after := e.snapshot(); after != before {
		t.Errorf("netns differs after teardown\n--- before\n%s\n--- after\n%s", before, after)
	}
}
