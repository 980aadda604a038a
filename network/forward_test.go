package network

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// fwdEnv is a "pod" netns joined by a veth pair to a "guest" netns that
// runs TCP servers.
type fwdEnv struct {
	pod, guest netns.NsHandle
	p          *podNS
	guestIP    net.IP
}

func newFwdEnv(t *testing.T) *fwdEnv {
	t.Helper()
	needRoot(t)
	e := &fwdEnv{guestIP: mustIP("10.99.0.2")}
	var podH, guestH *netlink.Handle
	e.pod, podH = newNS(t)
	e.guest, guestH = newNS(t)
	veth := &netlink.Veth{
		LinkAttrs: netlink.LinkAttrs{Name: "fwd0"},
		PeerName:  "fwd1", PeerNamespace: netlink.NsFd(int(e.guest)),
	}
	if err := podH.LinkAdd(veth); err != nil {
		t.Fatalf("add veth: %v", err)
	}
	for _, s := range []struct {
		h    *netlink.Handle
		name string
		addr string
	}{{podH, "fwd0", "10.99.0.1/24"}, {guestH, "fwd1", "10.99.0.2/24"}} {
		l, err := s.h.LinkByName(s.name)
		if err == nil {
			err = s.h.AddrAdd(l, &netlink.Addr{IPNet: hostNet(s.addr)})
		}
		if err == nil {
			err = s.h.LinkSetUp(l)
		}
		if err != nil {
			t.Fatalf("configure %s: %v", s.name, err)
		}
	}
	p, err := openNS(fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), int(e.pod)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	e.p = p
	return e
}

// serveGuest runs a TCP server on port inside the guest netns. Each
// connection reads its request to EOF, then answers "name: request".
func (e *fwdEnv) serveGuest(t *testing.T, name string) int {
	t.Helper()
	var ln net.Listener
	err := runInNS(e.guest, func() error {
		var err error
		ln, err = net.Listen("tcp4", e.guestIP.String()+":0")
		return err
	})
	if err != nil {
		t.Fatalf("listen in guest: %v", err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		_ = ln.Close()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				req, err := io.ReadAll(c)
				if err != nil {
					return
				}
				_, _ = fmt.Fprintf(c, "%s: %s", name, req)
			})
		}
	})
	return ln.Addr().(*net.TCPAddr).Port
}

// dialPod connects to addr from inside the pod netns.
func (e *fwdEnv) dialPod(network, addr string) (*net.TCPConn, error) {
	return dialIn(e.pod, network, addr)
}

// dialIn connects to addr from inside ns.
func dialIn(ns netns.NsHandle, network, addr string) (*net.TCPConn, error) {
	var c net.Conn
	err := runInNS(ns, func() error {
		var err error
		c, err = net.DialTimeout(network, addr, 5*time.Second)
		return err
	})
	if err != nil {
		return nil, err
	}
	return c.(*net.TCPConn), nil
}

// ask sends req to addr in the pod netns, half-closes, and reads the reply.
func (e *fwdEnv) ask(t *testing.T, network, addr, req string) string {
	t.Helper()
	c, err := e.dialPod(network, addr)
	if err != nil {
		t.Fatalf("dial %s in pod: %v", addr, err)
	}
	return exchange(t, c, addr, req)
}

func testLogger() *logrus.Entry {
	logger, _ := logtest.NewNullLogger()
	logger.SetLevel(logrus.DebugLevel)
	return logrus.NewEntry(logger)
}

func startTestForwarder(t *testing.T, e *fwdEnv) *forwarder {
	t.Helper()
	f, err := startForwarder(testCtx(t), e.p, fixedGuest(e.guestIP), nil, testLogger())
	if err != nil {
		t.Fatalf("start forwarder: %v", err)
	}
	t.Cleanup(func() { _ = f.Close() })
	return f
}

func TestForwarder(t *testing.T) {
	setNS := checkNoLeaks(t)
	t.Cleanup(func() {
		// Relays copy with splice(2) through pipes the runtime pools and
		// closes only once they are collected.
		runtime.GC()
		runtime.GC()
	})
	e := newFwdEnv(t)
	setNS(e.pod)
	port1, port2 := e.serveGuest(t, "one"), e.serveGuest(t, "two")
	f := startTestForwarder(t, e)

	big := strings.Repeat("0123456789", 100000)
	for _, tc := range []struct {
		name, network, addr, req, want string
	}{
		{"port1", "tcp4", fmt.Sprintf("127.0.0.1:%d", port1), "ping", "one: ping"},
		{"port2", "tcp4", fmt.Sprintf("127.0.0.1:%d", port2), "pong", "two: pong"},
		{"empty request", "tcp4", fmt.Sprintf("127.0.0.1:%d", port1), "", "one: "},
		{"large request", "tcp4", fmt.Sprintf("127.0.0.1:%d", port2), big, "two: " + big},
		{"ipv6 loopback", "tcp6", fmt.Sprintf("[::1]:%d", port1), "six", "one: six"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := e.ask(t, tc.network, tc.addr, tc.req); got != tc.want {
				t.Errorf("reply = %.40q (%d bytes), want %.40q (%d bytes)", got, len(got), tc.want, len(tc.want))
			}
		})
	}

	t.Run("concurrent", func(t *testing.T) {
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Go(func() {
				port, name := port1, "one"
				if i%2 == 1 {
					port, name = port2, "two"
				}
				req := fmt.Sprintf("req%d", i)
				if got, want := e.ask(t, "tcp4", fmt.Sprintf("127.0.0.1:%d", port), req), name+": "+req; got != want {
					t.Errorf("reply = %q, want %q", got, want)
				}
			})
		}
		wg.Wait()
	})

	t.Run("no server in guest", func(t *testing.T) {
		c, err := e.dialPod("tcp4", "127.0.0.1:1")
		if errors.Is(err, syscall.ECONNRESET) {
			return // the reset came before connect returned
		}
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(15 * time.Second))
		if got, err := io.ReadAll(c); err == nil || len(got) != 0 {
			t.Errorf("read = %q, %v; want a reset", got, err)
		}
	})

	// A relay still open when the forwarder closes is ended.
	open, err := e.dialPod("tcp4", fmt.Sprintf("127.0.0.1:%d", port1))
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer open.Close()
	if _, err := io.WriteString(open, "pending"); err != nil {
		t.Fatal(err)
	}

	if err := f.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	_ = open.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadAll(open); err == nil {
		t.Error("relay open across Close still works")
	}
	for _, a := range []struct{ network, addr string }{
		{"tcp4", fmt.Sprintf("127.0.0.1:%d", port1)},
		{"tcp6", fmt.Sprintf("[::1]:%d", port2)},
	} {
		c, err := e.dialPod(a.network, a.addr)
		if err == nil {
			c.Close()
		}
		if !errors.Is(err, unix.ECONNREFUSED) {
			t.Errorf("dial %s after close: %v, want connection refused", a.addr, err)
		}
	}
}

func TestForwarderLeavesOtherTraffic(t *testing.T) {
	e := newFwdEnv(t)
	port := e.serveGuest(t, "guest")
	startTestForwarder(t, e)
	// Connections to other addresses of the netns are not steered.
	if got := e.ask(t, "tcp4", fmt.Sprintf("%s:%d", e.guestIP, port), "direct"); got != "guest: direct" {
		t.Errorf("direct reply = %q", got)
	}
	var ln net.Listener
	err := runInNS(e.pod, func() error {
		var err error
		ln, err = net.Listen("tcp4", "10.99.0.1:0")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			_, _ = io.WriteString(c, "local")
			c.Close()
		}
	}()
	c, err := e.dialPod("tcp4", ln.Addr().String())
	if err != nil {
		t.Fatalf("dial local listener: %v", err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if got, err := io.ReadAll(c); err != nil || string(got) != "local" {
		t.Errorf("local listener reply = %q, %v", got, err)
	}
}

func TestForwarderStopsWithContext(t *testing.T) {
	e := newFwdEnv(t)
	e.serveGuest(t, "guest")
	ctx, cancel := context.WithCancel(context.Background())
	f, err := startForwarder(ctx, e.p, fixedGuest(e.guestIP), nil, testLogger())
	if err != nil {
		t.Fatalf("start forwarder: %v", err)
	}
	defer f.Close()
	cancel()
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := e.dialPod("tcp4", "127.0.0.1:80")
		if err == nil {
			c.Close()
		}
		if errors.Is(err, unix.ECONNREFUSED) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("dial after cancel: %v, want connection refused", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := f.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
}

func TestStartForwarderNoGuest(t *testing.T) {
	e := newFwdEnv(t)
	if _, err := startForwarder(testCtx(t), e.p, fixedGuest(nil), nil, testLogger()); err == nil {
		t.Fatal("started without a guest address")
	}
}

func TestSetupStartsForwarder(t *testing.T) {
	e := newPodEnv(t)
	e.addLink("eth0", 41, bridgeLike)
	n := e.setup(testCtx(t))
	n.fwdMu.Lock()
	fwd := n.fwd
	n.fwdMu.Unlock()
	if fwd == nil {
		t.Fatal("setup started no port-forward")
	}
	if !fwd.guest().IP.Equal(n.NICs()[0].Lease.IP) {
		t.Errorf("forwarder guest = %s, want %s", fwd.guest(), n.NICs()[0].Lease.IP)
	}
	// Nothing answers behind the tap: the connection is accepted, and the
	// pending dial to the guest is cut short by Teardown.
	c, err := dialIn(e.pod, "tcp4", "127.0.0.1:22")
	if err != nil {
		t.Fatalf("dial loopback in pod: %v", err)
	}
	defer c.Close()
	start := time.Now()
	if err := n.Teardown(testCtx(t)); err != nil {
		t.Fatalf("teardown: %v", err)
	}
	if d := time.Since(start); d > forwardDialTimeout/2 {
		t.Errorf("teardown took %s, waiting for a guest dial", d)
	}
	c2, err := dialIn(e.pod, "tcp4", "127.0.0.1:22")
	if err == nil {
		c2.Close()
	}
	if !errors.Is(err, unix.ECONNREFUSED) {
		t.Errorf("dial after teardown: %v, want connection refused", err)
	}
}

// TestForwarderLocalPort: a port the caller serves itself (a VM's VNC
// server) goes to its handler even when the guest serves it too; other
// ports still reach the guest.
func TestForwarderLocalPort(t *testing.T) {
	setNS := checkNoLeaks(t)
	e := newFwdEnv(t)
	setNS(e.pod)
	guestPort, localPort := e.serveGuest(t, "guest"), e.serveGuest(t, "guest too")
	local := map[int]func(*net.TCPConn){localPort: func(c *net.TCPConn) {
		defer c.Close()
		_, _ = c.Write([]byte("local"))
	}}
	f, err := startForwarder(testCtx(t), e.p, fixedGuest(e.guestIP), local, testLogger())
	if err != nil {
		t.Fatalf("start forwarder: %v", err)
	}
	t.Cleanup(func() { _ = f.Close() })
	if got := e.ask(t, "tcp4", fmt.Sprintf("127.0.0.1:%d", localPort), ""); got != "local" {
		t.Errorf("port %d served by its handler: reply %q, want %q", localPort, got, "local")
	}
	if got := e.ask(t, "tcp4", fmt.Sprintf("127.0.0.1:%d", guestPort), "hi"); got != "guest: hi" {
		t.Errorf("port %d of the guest: reply %q", guestPort, got)
	}
}

// TestForwarderNetnsListeners: a port a socket of the netns listens on
// (a container beside the VM) is served by it, through either loopback
// address, and the guest gets the others, and that port again once the
// socket is gone; a guest port equal to the forwarder's own listener's
// is still the guest's.
func TestForwarderNetnsListeners(t *testing.T) {
	e := newFwdEnv(t)
	port, other := e.serveGuest(t, "guest"), e.serveGuest(t, "guest")
	f := startTestForwarder(t, e)
	ask := func(addr, req, want string) {
		t.Helper()
		if got := e.ask(t, "tcp", addr, req); got != want {
			t.Errorf("%s: reply %q, want %q", addr, got, want)
		}
	}
	netns := serveIn(t, e.pod, "", fmt.Sprintf(":%d", port), "netns")
	ask(fmt.Sprintf("127.0.0.1:%d", port), "a", "netns: a")
	ask(fmt.Sprintf("[::1]:%d", port), "b", "netns: b")
	ask(fmt.Sprintf("127.0.0.1:%d", other), "c", "guest: c")
	netns.stop()
	ask(fmt.Sprintf("127.0.0.1:%d", port), "d", "guest: d")

	loop := serveIn(t, e.pod, "4", fmt.Sprintf("127.0.0.1:%d", other), "netns loopback")
	ask(fmt.Sprintf("127.0.0.1:%d", other), "e", "netns loopback: e")
	ask(fmt.Sprintf("[::1]:%d", other), "f", "guest: f") // nothing of the netns on ::1
	loop.stop()

	own := f.lns[0].Addr().(*net.TCPAddr).Port
	serveIn(t, e.guest, "4", fmt.Sprintf("%s:%d", e.guestIP, own), "guest on the forwarder's port")
	ask(fmt.Sprintf("127.0.0.1:%d", own), "g", "guest on the forwarder's port: g")

	// Nothing is left in the map of own ports.
	var k uint32
	var v uint8
	if it := f.own.Iterate(); it.Next(&k, &v) {
		t.Errorf("map of own ports still holds %#x", k)
	}
}
