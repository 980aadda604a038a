package network

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/nclient4"
	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

const (
	testServerIf = "dhcps0"
	testClientIf = "dhcpc0"
	testSinkIf   = "dhcpx0" // tc redirects everything dhcps0 receives here
)

// newTestNetns creates an unnamed network namespace holding a veth pair
// dhcps0 (serverMAC) — dhcpc0 (clientMAC), both up. Like the tap in
// production, dhcps0 has a tc ingress filter that redirects every frame it
// receives (to the veth pair dhcpx0 — dhcpx1), so the namespace's own stack
// never sees them: only a packet socket that taps frames before tc ingress
// can answer. It touches nothing outside that namespace; the namespace goes
// away once the returned handle and every socket in it are closed.
func newTestNetns(t *testing.T, serverMAC, clientMAC net.HardwareAddr) (netns.NsHandle, int) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates a network namespace, a veth pair and packet sockets")
	}
	ns, err := makeNS(nil)
	if errors.Is(err, unix.EPERM) {
		t.Skipf("cannot create a network namespace here (no CAP_SYS_ADMIN): %v", err)
	}
	if err != nil {
		t.Fatalf("create netns: %v", err)
	}
	t.Cleanup(func() { _ = ns.Close() })

	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatalf("netlink handle in test netns: %v", err)
	}
	defer h.Close()
	veth := &netlink.Veth{
		LinkAttrs:        netlink.LinkAttrs{Name: testServerIf, HardwareAddr: serverMAC},
		PeerName:         testClientIf,
		PeerHardwareAddr: clientMAC,
	}
	if err := h.LinkAdd(veth); err != nil {
		t.Fatalf("add veth pair in test netns: %v", err)
	}
	sink := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: testSinkIf}, PeerName: "dhcpx1"}
	if err := h.LinkAdd(sink); err != nil {
		t.Fatalf("add sink veth pair in test netns: %v", err)
	}
	var serverIdx, sinkIdx int
	for _, name := range []string{testServerIf, testClientIf, testSinkIf, "dhcpx1"} {
		l, err := h.LinkByName(name)
		if err != nil {
			t.Fatalf("find %s in test netns: %v", name, err)
		}
		if err := h.LinkSetUp(l); err != nil {
			t.Fatalf("set %s up: %v", name, err)
		}
		switch name {
		case testServerIf:
			serverIdx = l.Attrs().Index
		case testSinkIf:
			sinkIdx = l.Attrs().Index
		}
	}
	ingress := &netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{
		LinkIndex: serverIdx,
		Handle:    netlink.MakeHandle(0xffff, 0),
		Parent:    netlink.HANDLE_INGRESS,
	}}
	if err := h.QdiscAdd(ingress); err != nil {
		t.Fatalf("add ingress qdisc to %s: %v", testServerIf, err)
	}
	redirect := &netlink.U32{
		FilterAttrs: netlink.FilterAttrs{
			LinkIndex: serverIdx,
			Parent:    netlink.MakeHandle(0xffff, 0),
			Priority:  1,
			Protocol:  unix.ETH_P_ALL,
		},
		Actions: []netlink.Action{netlink.NewMirredAction(sinkIdx)},
	}
	if err := h.FilterAdd(redirect); err != nil {
		t.Fatalf("add tc redirect on %s: %v", testServerIf, err)
	}
	return ns, serverIdx
}

// newTestResponder opens a responder on dhcps0 inside ns.
func newTestResponder(t *testing.T, ns netns.NsHandle, idx int, serverMAC net.HardwareAddr, lease *Lease, log *logrus.Entry) *Responder {
	t.Helper()
	var r *Responder
	err := runInNS(ns, func() (err error) {
		r, err = NewResponder(idx, serverMAC, *lease, log)
		return err
	})
	if err != nil {
		t.Fatalf("NewResponder: %v", err)
	}
	return r
}

// newTestClient opens an nclient4 client on dhcpc0 inside ns, speaking
// with hardware address mac.
func newTestClient(t *testing.T, ns netns.NsHandle, mac net.HardwareAddr, timeout time.Duration, retries int) *nclient4.Client {
	t.Helper()
	var c *nclient4.Client
	err := runInNS(ns, func() (err error) {
		c, err = nclient4.New(testClientIf, nclient4.WithHWAddr(mac), nclient4.WithTimeout(timeout), nclient4.WithRetry(retries))
		return err
	})
	if err != nil {
		t.Fatalf("nclient4 on %s: %v", testClientIf, err)
	}
	return c
}

// serve runs r.Serve in a goroutine and returns its result channel.
func serve(ctx context.Context, r *Responder) <-chan error {
	done := make(chan error, 1)
	go func() { done <- r.Serve(ctx) }()
	return done
}

// stillServing checks that Serve has not returned after a short while,
// which also lets it block in its read.
func stillServing(t *testing.T, done <-chan error) {
	t.Helper()
	select {
	case err := <-done:
		t.Fatalf("Serve returned early: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
}

// waitServe waits a short while for Serve to return and checks it returned nil.
func waitServe(t *testing.T, done <-chan error, why string) {
	t.Helper()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Serve after %s = %v, want nil", why, err)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("Serve did not return after %s", why)
	}
}

// waitLog waits a short while for a log entry that match accepts.
func waitLog(t *testing.T, hook *logtest.Hook, match func(e *logrus.Entry) bool) {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		for _, e := range hook.AllEntries() {
			if match(e) {
				return
			}
		}
	}
	t.Error("expected log entry not found")
}

// netnsRefs reports how this process still refers to the network namespace
// with inode ino: open descriptors and threads inside it.
func netnsRefs(ino uint64) []string {
	want := fmt.Sprintf("net:[%d]", ino)
	var refs []string
	for _, glob := range []string{"/proc/self/fd/*", "/proc/self/task/*/ns/net"} {
		paths, _ := filepath.Glob(glob)
		for _, p := range paths {
			if l, err := os.Readlink(p); err == nil && l == want {
				refs = append(refs, p)
			}
		}
	}
	return refs
}

// openFDs counts this process's open descriptors.
func openFDs() int {
	ents, _ := os.ReadDir("/proc/self/fd")
	return len(ents)
}

// checkNoLeaks registers, before the test's other cleanups, a final check
// that goroutines, descriptors and references to the test netns are gone.
func checkNoLeaks(t *testing.T) func(ns netns.NsHandle) {
	t.Helper()
	// Start the runtime poller so its descriptors are part of the baseline.
	if pr, pw, err := os.Pipe(); err == nil {
		_ = pr.Close()
		_ = pw.Close()
	}
	goroutines, fds := runtime.NumGoroutine(), openFDs()
	var ino uint64
	t.Cleanup(func() {
		deadline := time.Now().Add(5 * time.Second)
		for {
			g, f, refs := runtime.NumGoroutine(), openFDs(), netnsRefs(ino)
			if g <= goroutines && f <= fds && len(refs) == 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Errorf("leak: %d goroutines (had %d), %d fds (had %d), netns refs %v", g, goroutines, f, fds, refs)
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
	return func(ns netns.NsHandle) {
		var st unix.Stat_t
		if err := unix.Fstat(int(ns), &st); err != nil {
			t.Fatalf("stat netns: %v", err)
		}
		ino = st.Ino
	}
}

// testServer is a responder serving in a test netns of its own, its log
// captured at debug level.
type testServer struct {
	ns     netns.NsHandle
	lease  *Lease
	hook   *logtest.Hook
	done   <-chan error
	cancel context.CancelFunc // stops it
}

// serveInTestNetns starts a testServer in a netns checked for leaks.
func serveInTestNetns(t *testing.T) *testServer {
	t.Helper()
	setNS := checkNoLeaks(t)
	srv := &testServer{lease: testLease(t)}
	serverMAC := net.HardwareAddr{0x02, 0x00, 0x00, 0x00, 0x00, 0x01}
	ns, idx := newTestNetns(t, serverMAC, srv.lease.MAC)
	srv.ns = ns
	setNS(srv.ns)
	logger, hook := logtest.NewNullLogger()
	logger.SetLevel(logrus.DebugLevel)
	srv.hook = hook
	r := newTestResponder(t, ns, idx, serverMAC, srv.lease, logrus.NewEntry(logger))
	t.Cleanup(func() { _ = r.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	srv.done, srv.cancel = serve(ctx, r), cancel
	return srv
}

func TestResponderRoundTrip(t *testing.T) {
	srv := serveInTestNetns(t)
	defer srv.cancel()
	ns, lease, hook, done, cancel := srv.ns, srv.lease, srv.hook, srv.done, srv.cancel

	client := newTestClient(t, ns, lease.MAC, 2*time.Second, 3)
	defer client.Close()

	reqCtx, reqCancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer reqCancel()
	got, err := client.Request(reqCtx, dhcpv4.WithBroadcast(true))
	if err != nil {
		t.Fatalf("DISCOVER/OFFER/REQUEST/ACK: %v", err)
	}
	ack := got.ACK
	if !ack.YourIPAddr.Equal(lease.IP) || !got.Offer.YourIPAddr.Equal(lease.IP) {
		t.Errorf("offered %s, acked %s, want %s", got.Offer.YourIPAddr, ack.YourIPAddr, lease.IP)
	}
	if !bytes.Equal(ack.SubnetMask(), lease.Mask) {
		t.Errorf("mask %s, want %s", ack.SubnetMask(), lease.Mask)
	}
	if rt := ack.Router(); len(rt) != 1 || !rt[0].Equal(lease.Gateway) {
		t.Errorf("router %v, want %s", rt, lease.Gateway)
	}
	wantRoutes := []string{"0.0.0.0/0 via 192.0.2.1", "169.254.1.1/32 via 0.0.0.0", "198.51.100.0/24 via 192.0.2.254"}
	var gotRoutes []string
	for _, rt := range ack.ClasslessStaticRoute() {
		gotRoutes = append(gotRoutes, fmt.Sprintf("%s via %s", rt.Dest, rt.Router))
	}
	if fmt.Sprint(gotRoutes) != fmt.Sprint(wantRoutes) {
		t.Errorf("routes %v, want %v", gotRoutes, wantRoutes)
	}
	if mtu := ack.Options.Get(dhcpv4.OptionInterfaceMTU); !bytes.Equal(mtu, []byte{0x05, 0xaa}) {
		t.Errorf("mtu option %v, want 1450", mtu)
	}
	if dns := ack.DNS(); fmt.Sprint(dns) != fmt.Sprint(lease.DNS) {
		t.Errorf("dns %v, want %v", dns, lease.DNS)
	}
	if h := ack.HostName(); h != lease.Hostname {
		t.Errorf("hostname %q, want %q", h, lease.Hostname)
	}
	if s := ack.DomainSearch(); s == nil || fmt.Sprint(s.Labels) != fmt.Sprint(lease.Search) {
		t.Errorf("search %v, want %v", s, lease.Search)
	}
	if lt := ack.IPAddressLeaseTime(0); lt != DefaultLeaseTime {
		t.Errorf("lease time %s, want %s", lt, DefaultLeaseTime)
	}
	if !ack.ServerIdentifier().Equal(lease.ServerID) {
		t.Errorf("server id %s, want %s", ack.ServerIdentifier(), lease.ServerID)
	}

	t.Run("garbage does not stop serve", func(t *testing.T) {
		frames := [][]byte{clientFrame(t, []byte("not dhcp")), clientFrame(t, make([]byte, 300))}
		err := sendRawFrames(ns, rawFrame{testClientIf, frames[0]}, rawFrame{testClientIf, frames[1]})
		if err != nil {
			t.Fatalf("send garbage on %s: %v", testClientIf, err)
		}
		waitLog(t, hook, func(e *logrus.Entry) bool { return e.Message == "dhcp packet dropped" })
	})

	t.Run("unicast offer without broadcast bit", func(t *testing.T) {
		offer, err := client.DiscoverOffer(reqCtx)
		if err != nil {
			t.Fatalf("discover: %v", err)
		}
		if offer.IsBroadcast() || !offer.YourIPAddr.Equal(lease.IP) {
			t.Errorf("offer %s", offer.Summary())
		}
	})

	t.Run("renew", func(t *testing.T) {
		renewed, err := client.Renew(reqCtx, got)
		if err != nil {
			t.Fatalf("renew: %v", err)
		}
		if !renewed.ACK.YourIPAddr.Equal(lease.IP) || !renewed.ACK.ClientIPAddr.Equal(lease.IP) {
			t.Errorf("renew acked yiaddr %s ciaddr %s", renewed.ACK.YourIPAddr, renewed.ACK.ClientIPAddr)
		}
	})

	t.Run("inform", func(t *testing.T) {
		informed, err := client.Inform(reqCtx, lease.IP)
		if err != nil {
			t.Fatalf("inform: %v", err)
		}
		if !informed.YourIPAddr.IsUnspecified() || informed.Options.Has(dhcpv4.OptionIPAddressLeaseTime) {
			t.Errorf("inform ack carries a lease: %s", informed.Summary())
		}
		if rt := informed.Router(); len(rt) != 1 || !rt[0].Equal(lease.Gateway) {
			t.Errorf("inform ack router %v", rt)
		}
	})

	t.Run("wrong address gets nak", func(t *testing.T) {
		offer := *got.Offer
		offer.YourIPAddr = net.ParseIP("192.0.2.99").To4()
		_, err := client.RequestFromOffer(reqCtx, &offer)
		var nak *nclient4.ErrNak
		if !errors.As(err, &nak) {
			t.Fatalf("request for 192.0.2.99: %v, want a NAK", err)
		}
	})

	t.Run("foreign mac gets no answer", func(t *testing.T) {
		foreign := newTestClient(t, ns, net.HardwareAddr{0x52, 0x54, 0x00, 0xaa, 0xbb, 0xcc}, time.Second, 1)
		defer foreign.Close()
		fctx, fcancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer fcancel()
		if offer, err := foreign.DiscoverOffer(fctx); err == nil {
			t.Fatalf("foreign mac got an offer: %s", offer.Summary())
		}
		// The responder saw the DISCOVER and chose to ignore it.
		waitLog(t, hook, func(e *logrus.Entry) bool {
			return e.Message == "dhcp message ignored" && e.Data["mac"] == "52:54:00:aa:bb:cc"
		})
	})

	waitLog(t, hook, func(e *logrus.Entry) bool {
		return e.Level == logrus.InfoLevel && e.Message == "dhcp lease given" &&
			e.Data["mac"] == lease.MAC.String() && e.Data["ip"] == lease.IP.String()
	})

	cancel()
	waitServe(t, done, "context cancel")
}

func TestResponderStops(t *testing.T) {
	setNS := checkNoLeaks(t)
	lease := testLease(t)
	serverMAC := net.HardwareAddr{0x02, 0x00, 0x00, 0x00, 0x00, 0x01}
	ns, idx := newTestNetns(t, serverMAC, lease.MAC)
	setNS(ns)

	t.Run("close", func(t *testing.T) {
		r := newTestResponder(t, ns, idx, serverMAC, lease, nil)
		done := serve(context.Background(), r)
		stillServing(t, done)
		if err := r.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		waitServe(t, done, "Close")
		if err := r.Close(); err != nil {
			t.Errorf("second Close: %v", err)
		}
		if err := r.Serve(context.Background()); err != nil {
			t.Errorf("Serve after Close = %v, want nil", err)
		}
	})

	t.Run("cancelled context", func(t *testing.T) {
		r := newTestResponder(t, ns, idx, serverMAC, lease, nil)
		defer r.Close()
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		waitServe(t, serve(ctx, r), "an already cancelled context")
		// Serve again with a live context, then cancel it while blocked.
		ctx, cancel = context.WithCancel(context.Background())
		done := serve(ctx, r)
		stillServing(t, done)
		cancel()
		waitServe(t, done, "context cancel")
	})
}

// TestResponderIgnoresFramesToGuest sends a DISCOVER from the lease's MAC
// out of dhcps0, as tc does with what the pod network sends to the VM. The
// socket bound to all protocols sees it, and must leave it alone.
func TestResponderIgnoresFramesToGuest(t *testing.T) {
	srv := serveInTestNetns(t)
	defer srv.cancel()
	ns, lease, hook, done, cancel := srv.ns, srv.lease, srv.hook, srv.done, srv.cancel

	toGuest := requestFrame(t, lease.MAC, testMessage(t, lease.MAC, dhcpv4.MessageTypeDiscover).ToBytes())
	marker := clientFrame(t, []byte("not dhcp"))
	// The first frame leaves dhcps0; the marker, received on dhcps0 after
	// it, shows the responder got past it.
	err := sendRawFrames(ns, rawFrame{testServerIf, toGuest}, rawFrame{testClientIf, marker})
	if err != nil {
		t.Fatalf("send frames: %v", err)
	}
	waitLog(t, hook, func(e *logrus.Entry) bool { return e.Message == "dhcp packet dropped" })
	for _, e := range hook.AllEntries() {
		if e.Data["mac"] != nil {
			t.Errorf("responder handled a frame sent to the guest: %s %v", e.Message, e.Data)
		}
	}
	cancel()
	waitServe(t, done, "context cancel")
}

func TestNewResponderErrors(t *testing.T) {
	lease := testLease(t)
	mac := net.HardwareAddr{0x02, 0, 0, 0, 0, 1}
	noIP := *lease
	noIP.IP = nil
	for _, tc := range []struct {
		name    string
		ifindex int
		mac     net.HardwareAddr
		lease   Lease
	}{
		{"zero ifindex", 0, mac, *lease},
		{"short mac", 1, mac[:2], *lease},
		{"lease without ip", 1, mac, noIP},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := NewResponder(tc.ifindex, tc.mac, tc.lease, nil); !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("NewResponder = %v, want ErrInvalidArgument", err)
			}
		})
	}

	t.Run("missing interface", func(t *testing.T) {
		ns, _ := newTestNetns(t, mac, lease.MAC)
		err := runInNS(ns, func() error {
			r, err := NewResponder(9999, mac, *lease, nil)
			if err == nil {
				_ = r.Close()
			}
			return err
		})
		if !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("NewResponder on ifindex 9999 = %v, want ErrNotFound", err)
		}
	})
}

// rawFrame is a frame to send, broadcast, out of an interface by name.
type rawFrame struct {
	ifName string
	frame  []byte
}

// sendRawFrames sends frames, in order, through an AF_PACKET socket in ns.
func sendRawFrames(ns netns.NsHandle, frames ...rawFrame) error {
	return runInNS(ns, func() error {
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		for _, f := range frames {
			ifc, err := net.InterfaceByName(f.ifName)
			if err != nil {
				return err
			}
			to := &unix.SockaddrLinklayer{Ifindex: ifc.Index, Halen: 6}
			copy(to.Addr[:], broadcastMAC)
			if err := unix.Sendto(fd, f.frame, 0, to); err != nil {
				return err
			}
		}
		return nil
	})
}
