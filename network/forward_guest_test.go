package network

import (
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// kernelGuest plays the VM with a kernel network stack: a netns of its own
// whose tap (the guest NIC, with the CNI interface's MAC) is joined to the
// pod's tap fd by a frame pump, as QEMU's virtio-net joins the guest to it.
type kernelGuest struct {
	ns   netns.NsHandle
	h    *netlink.Handle
	link netlink.Link
}

// newKernelGuest makes the guest netns and pumps frames between its NIC
// and the pod's tap fd until the test ends.
func newKernelGuest(t *testing.T, nic NIC) *kernelGuest {
	t.Helper()
	g := &kernelGuest{}
	g.ns, g.h = newNS(t)
	var tap *os.File
	err := runInNS(g.ns, func() error {
		tt := &netlink.Tuntap{
			LinkAttrs:  netlink.LinkAttrs{Name: "gtap0"},
			Mode:       netlink.TUNTAP_MODE_TAP,
			Flags:      netlink.TUNTAP_NO_PI | netlink.TUNTAP_TUN_EXCL,
			NonPersist: true,
			Queues:     1,
		}
		// The tap is made in the netns of the thread opening /dev/net/tun.
		if err := netlink.LinkAdd(tt); err != nil {
			return err
		}
		if len(tt.Fds) != 1 {
			return fmt.Errorf("got %d tap fds", len(tt.Fds))
		}
		tap = tt.Fds[0]
		return nil
	})
	if err != nil {
		t.Fatalf("guest tap: %v", err)
	}
	t.Cleanup(func() { tap.Close() })
	if g.link, err = g.h.LinkByName("gtap0"); err != nil {
		t.Fatal(err)
	}
	for what, err := range map[string]error{
		"mac": g.h.LinkSetHardwareAddr(g.link, nic.MAC),
		"mtu": g.h.LinkSetMTU(g.link, nic.Lease.MTU),
		"up":  g.h.LinkSetUp(g.link),
	} {
		if err != nil {
			t.Fatalf("guest nic %s: %v", what, err)
		}
	}
	pumpFrames(t, nic.Tap, tap)
	return g
}

// pumpFrames copies frames both ways between the pod's tap fd, whose
// frames carry a virtio-net header, and the guest's, whose frames do not,
// until the test ends. Frames that cannot be written are lost, as on a
// wire.
func pumpFrames(t *testing.T, podTap, guestTap *os.File) {
	t.Helper()
	var (
		stopped atomic.Bool
		wg      sync.WaitGroup
	)
	pump := func(dst, src *os.File, strip, add int) {
		buf := make([]byte, 65536)
		for {
			n, err := src.Read(buf[add:])
			if stopped.Load() {
				return
			}
			if err != nil {
				if errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, os.ErrClosed) {
					return
				}
				continue
			}
			if n < strip {
				continue
			}
			// buf[:add] stays zero: a virtio-net header asking for nothing.
			frame := buf[:add+n]
			_, _ = dst.Write(frame[strip:])
		}
	}
	for _, f := range []*os.File{podTap, guestTap} {
		if err := f.SetReadDeadline(time.Time{}); err != nil {
			t.Fatal(err)
		}
	}
	wg.Go(func() { pump(guestTap, podTap, vnetHdrLen, 0) })
	wg.Go(func() { pump(podTap, guestTap, 0, vnetHdrLen) })
	t.Cleanup(func() {
		stopped.Store(true)
		past := time.Unix(1, 0)
		_ = podTap.SetReadDeadline(past)
		_ = guestTap.SetReadDeadline(past)
		wg.Wait()
	})
}

// configure gives the guest what its DHCP client would take from lease:
// the address and prefix, and either only a default route through the
// router (option 3) or the classless static routes (option 121), on-link
// ones first.
func (g *kernelGuest) configure(t *testing.T, lease *Lease, classless bool) {
	t.Helper()
	idx := g.link.Attrs().Index
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: lease.IP, Mask: lease.Mask}}
	if err := g.h.AddrAdd(g.link, addr); err != nil {
		t.Fatalf("guest address %s: %v", addr.IPNet, err)
	}
	routes := []*netlink.Route{{LinkIndex: idx, Gw: lease.Gateway}}
	if classless {
		routes = nil
		for _, onLink := range []bool{true, false} {
			for _, r := range lease.Routes {
				if (r.Gw == nil) != onLink {
					continue
				}
				nr := &netlink.Route{LinkIndex: idx, Dst: r.Dst, Gw: r.Gw}
				if onLink {
					nr.Scope = netlink.SCOPE_LINK
				}
				routes = append(routes, nr)
			}
		}
	}
	for _, r := range routes {
		if err := g.h.RouteAdd(r); err != nil {
			t.Fatalf("guest route %s: %v", r, err)
		}
	}
}

// TestForwardToKernelGuest forwards the pod netns's loopback, through a
// wired netns, to a guest kernel configured from its lease: one that
// applied only the router option and one that applied the classless
// routes. Both must connect and carry data both ways, and nothing meant
// for the netns may leave it toward the pod network.
func TestForwardToKernelGuest(t *testing.T) {
	for _, tc := range []struct {
		name      string
		classless bool
	}{
		{"router option only", false},
		{"classless routes", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			setNS := checkNoLeaks(t)
			t.Cleanup(func() {
				// Relays copy with splice(2) through pipes the runtime
				// pools and closes only once they are collected.
				runtime.GC()
				runtime.GC()
			})
			e := newPodEnv(t)
			setNS(e.pod)
			pl := e.addLink("eth0", 42, bridgeLike)
			n := e.setup(testCtx(t))
			nic := n.NICs()[0]
			if nic.Lease == nil || nic.Lease.Gateway == nil {
				t.Fatalf("lease %+v has no router", nic.Lease)
			}
			linkLocal := mustIP(n.State().NICs[0].LinkLocal)
			g := newKernelGuest(t, nic)
			g.configure(t, nic.Lease, tc.classless)
			// How the guest answers the relay's source: through its
			// default router, or on-link as option 121 says.
			routes, err := g.h.RouteGet(linkLocal)
			if err != nil || len(routes) != 1 {
				t.Fatalf("guest route to %s: %v %v", linkLocal, routes, err)
			}
			if via := routes[0].Gw; tc.classless != (via == nil) || (via != nil && !via.Equal(pl.gw)) {
				t.Fatalf("guest routes %s via %v, want classless=%v", linkLocal, via, tc.classless)
			}
			sniff := e.sniff(pl.hostName)

			fe := &fwdEnv{pod: e.pod, guest: g.ns, guestIP: nic.Lease.IP}
			port := fe.serveGuest(t, "guest")
			big := strings.Repeat("0123456789", 50000)
			for _, req := range []string{"ping", big} {
				addr := fmt.Sprintf("127.0.0.1:%d", port)
				if got, want := fe.ask(t, "tcp4", addr, req), "guest: "+req; got != want {
					t.Errorf("reply = %.40q (%d bytes), want %.40q (%d bytes)", got, len(got), want, len(want))
				}
			}

			for _, f := range sniff.frames(200 * time.Millisecond) {
				if p, _ := parseFrame(f); p.typ == etherIP && p.ipDst.Equal(linkLocal) {
					t.Errorf("a packet for the netns's %s left it toward the pod network: %x", linkLocal, f)
					break
				}
			}
		})
	}
}
