package network

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// echoServer is a TCP and a UDP server in a netns, on the same address: a
// connection's request, read to EOF, is answered "name: request", and
// so is each datagram. It records where its connections come from.
type echoServer struct {
	t    *testing.T
	name string
	ln   *net.TCPListener
	udp  *net.UDPConn
	wg   sync.WaitGroup

	peers chan *net.TCPAddr // each connection's client, as it is accepted; what does not fit is dropped
}

// serveIn starts a server on addr ("ip:port", port 0 for any) in ns. Its
// ports are closed by stop or at the end of the test.
func serveIn(t *testing.T, ns netns.NsHandle, network, addr, name string) *echoServer {
	t.Helper()
	s := &echoServer{t: t, name: name, peers: make(chan *net.TCPAddr, 16)}
	err := runInNS(ns, func() error {
		ln, err := net.Listen("tcp"+network, addr)
		if err != nil {
			return err
		}
		s.ln = ln.(*net.TCPListener)
		local := s.ln.Addr().(*net.TCPAddr)
		s.udp, err = net.ListenUDP("udp"+network, &net.UDPAddr{IP: local.IP, Port: local.Port, Zone: local.Zone})
		if err != nil {
			_ = s.ln.Close()
		}
		return err
	})
	if err != nil {
		t.Fatalf("%s: listen on %s: %v", name, addr, err)
	}
	t.Cleanup(s.stop)
	s.wg.Go(func() {
		for {
			c, err := s.ln.AcceptTCP()
			if err != nil {
				return
			}
			select {
			case s.peers <- c.RemoteAddr().(*net.TCPAddr):
			default:
			}
			s.wg.Go(func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(15 * time.Second))
				req, err := io.ReadAll(c)
				if err == nil {
					_, _ = fmt.Fprintf(c, "%s: %s", name, req)
				}
			})
		}
	})
	s.wg.Go(func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := s.udp.ReadFromUDP(buf)
			if err != nil {
				return
			}
			_, _ = s.udp.WriteToUDP(fmt.Appendf(nil, "%s: %s", name, buf[:n]), from)
		}
	})
	return s
}

// port is the server's port.
func (s *echoServer) port() int { return s.ln.Addr().(*net.TCPAddr).Port }

// stop closes the server's ports. Idempotent.
func (s *echoServer) stop() {
	_ = s.ln.Close()
	_ = s.udp.Close()
	s.wg.Wait()
}

// ask sends req over TCP to addr from ns, half-closes, and returns the
// reply.
func ask(t *testing.T, ns netns.NsHandle, addr, req string) string {
	t.Helper()
	c, err := dialIn(ns, "tcp", addr)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	return exchange(t, c, addr, req)
}

// exchange sends req on c, connected to addr, half-closes, reads the
// reply and closes c.
func exchange(t *testing.T, c *net.TCPConn, addr, req string) string {
	t.Helper()
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(15 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatalf("write to %s: %v", addr, err)
	}
	if err := c.CloseWrite(); err != nil {
		t.Fatalf("half-close %s: %v", addr, err)
	}
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("read from %s: %v", addr, err)
	}
	return string(got)
}

// askUDP sends req in a datagram to addr from ns and returns the reply.
func askUDP(t *testing.T, ns netns.NsHandle, addr, req string) string {
	t.Helper()
	var c net.Conn
	err := runInNS(ns, func() error {
		var err error
		c, err = net.Dial("udp", addr)
		return err
	})
	if err != nil {
		t.Fatalf("udp to %s: %v", addr, err)
	}
	defer c.Close()
	buf := make([]byte, 2048)
	// Retry once: the first datagram may wait on neighbour resolution.
	for range 2 {
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := io.WriteString(c, req); err != nil {
			t.Fatalf("udp to %s: %v", addr, err)
		}
		if n, err := c.Read(buf); err == nil {
			return string(buf[:n])
		}
	}
	t.Fatalf("no udp reply from %s", addr)
	return ""
}

func hostPort(ip net.IP, port int) string { return net.JoinHostPort(ip.String(), strconv.Itoa(port)) }

// TestSetupNetnsSockets runs a guest kernel behind a wired netns and
// sockets in the netns itself, as the pod's other containers have them:
// what a socket of the netns owns reaches it, everything else reaches the
// guest, as before.
func TestSetupNetnsSockets(t *testing.T) {
	for _, tc := range []struct {
		name string
		kind linkKind
	}{
		{"bridge", bridgeLike},
		{"ptp", ptpLike},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			e := newPodEnv(t)
			pl := e.addLink("eth0", 99, tc.kind)
			before := e.snapshot()
			n := e.setup(ctx)
			nic := n.NICs()[0]
			g := newKernelGuest(t, nic)
			g.configure(t, nic.Lease, true)
			pod := pl.podIP
			guest := serveIn(t, g.ns, "4", ":0", "guest")
			other := serveIn(t, g.ns, "4", ":0", "guest")
			host := serveIn(t, e.host, "4", hostPort(pl.gw, 0), "host")
			checkReplies := func(what string, got, want string) {
				t.Helper()
				if got != want {
					t.Errorf("%s: reply %q, want %q", what, got, want)
				}
			}

			// Nothing listens in the netns: the guest serves its ports.
			checkReplies("tcp to the guest's port", ask(t, e.host, hostPort(pod, guest.port()), "a"), "guest: a")
			checkReplies("udp to the guest's port", askUDP(t, e.host, hostPort(pod, guest.port()), "b"), "guest: b")

			// A socket of the netns on the pod IP takes its port; the
			// guest keeps the others.
			local := serveIn(t, e.pod, "4", hostPort(pod, guest.port()), "netns")
			checkReplies("tcp to the netns's port", ask(t, e.host, hostPort(pod, guest.port()), "c"), "netns: c")
			checkReplies("udp to the netns's port", askUDP(t, e.host, hostPort(pod, guest.port()), "d"), "netns: d")
			checkReplies("tcp to another port", ask(t, e.host, hostPort(pod, other.port()), "e"), "guest: e")
			wild := serveIn(t, e.pod, "", ":0", "netns wildcard")
			checkReplies("tcp to a wildcard socket of the netns", ask(t, e.host, hostPort(pod, wild.port()), "f"), "netns wildcard: f")
			// The pod's containers reach each other at a loopback address
			// port-forward leaves alone.
			checkReplies("tcp within the netns", ask(t, e.pod, hostPort(net.IPv4(127, 0, 0, 2), wild.port()), "f2"), "netns wildcard: f2")
			local.stop()
			checkReplies("tcp once the netns stopped listening", ask(t, e.host, hostPort(pod, guest.port()), "g"), "guest: g")

			// The netns's own connections get their replies; so do the
			// guest's.
			checkReplies("tcp from the netns", ask(t, e.pod, hostPort(pl.gw, host.port()), "h"), "host: h")
			checkReplies("udp from the netns", askUDP(t, e.pod, hostPort(pl.gw, host.port()), "i"), "host: i")
			checkReplies("tcp from the guest", ask(t, g.ns, hostPort(pl.gw, host.port()), "j"), "host: j")
			checkReplies("udp from the guest", askUDP(t, g.ns, hostPort(pl.gw, host.port()), "k"), "host: k")

			// The netns reaches the guest at the pod IP, and through
			// port-forward at its loopback.
			checkReplies("tcp from the netns to the pod ip", ask(t, e.pod, hostPort(pod, other.port()), "l"), "guest: l")
			checkReplies("udp from the netns to the pod ip", askUDP(t, e.pod, hostPort(pod, other.port()), "m"), "guest: m")
			checkReplies("port-forward", ask(t, e.pod, hostPort(net.IPv4(127, 0, 0, 1), other.port()), "n"), "guest: n")

			// The guest reaches the netns's sockets at the tap's
			// link-local address.
			linkLocal := mustIP(n.State().NICs[0].LinkLocal)
			checkReplies("tcp from the guest to the netns", ask(t, g.ns, hostPort(linkLocal, wild.port()), "o"), "netns wildcard: o")
			checkReplies("udp from the guest to the netns", askUDP(t, g.ns, hostPort(linkLocal, wild.port()), "p"), "netns wildcard: p")

			// The shim's own sockets in the netns take nothing of the
			// guest's: a guest port equal to port-forward's listener's
			// port, or to a relayed connection's, is still the guest's.
			checkShimPorts(t, e, n, g, pod, other)

			if err := n.Teardown(ctx); err != nil {
				t.Fatal(err)
			}
			if after := e.snapshot(); after != before {
				t.Errorf("netns differs after teardown\n--- before\n%s\n--- after\n%s", before, after)
			}
		})
	}
}

// checkShimPorts serves in the guest the ports of the shim's sockets in
// the netns, port-forward's, and reaches them from the host.
func checkShimPorts(t *testing.T, e *podEnv, n *Network, g *kernelGuest, pod net.IP, guest *echoServer) {
	t.Helper()
	n.fwdMu.Lock()
	fwd := n.fwd
	n.fwdMu.Unlock()
	if fwd == nil || len(fwd.lns) == 0 {
		t.Fatal("no port-forward")
	}
	// A relayed connection held open: its local port in the netns.
	for len(guest.peers) > 0 {
		<-guest.peers
	}
	c, err := dialIn(e.pod, "tcp4", hostPort(net.IPv4(127, 0, 0, 1), guest.port()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var relay *net.TCPAddr
	select {
	case relay = <-guest.peers:
	case <-time.After(5 * time.Second):
		t.Fatal("the relay never reached the guest")
	}
	if !relay.IP.Equal(mustIP(n.State().NICs[0].LinkLocal)) {
		t.Fatalf("the relay came from %s, not the tap's link-local address", relay)
	}
	for _, port := range []int{fwd.lns[0].Addr().(*net.TCPAddr).Port, relay.Port} {
		s := serveIn(t, g.ns, "", fmt.Sprintf(":%d", port), "guest on a port of the shim")
		if got, want := ask(t, e.host, hostPort(pod, port), "x"), "guest on a port of the shim: x"; got != want {
			t.Errorf("tcp to port %d: reply %q, want %q", port, got, want)
		}
		s.stop()
	}
}

// TestSetupNetnsSocketsIPv6 is TestSetupNetnsSockets over IPv6: the netns
// keeps the pod's IPv6 address local, and reaches the guest at its
// link-local address on the tap.
func TestSetupNetnsSocketsIPv6(t *testing.T) {
	ctx := testCtx(t)
	e := newPodEnv(t)
	pl := e.addLink("eth0", 99, bridgeLike)
	gw, _ := e.addIPv6Gateway(pl, 99)
	e.settle()
	n := e.setup(ctx)
	nic := n.NICs()[0]
	pod := nic.Lease6.IP
	g := newKernelGuest(t, nic)
	if err := g.h.AddrAdd(g.link, &netlink.Addr{IPNet: &net.IPNet{IP: pod, Mask: net.CIDRMask(64, 128)}, Flags: unix.IFA_F_NODAD}); err != nil {
		t.Fatal(err)
	}
	guest := serveIn(t, g.ns, "6", ":0", "guest")
	host := serveIn(t, e.host, "6", hostPort(gw, 0), "host")
	checkReplies := func(what string, got, want string) {
		t.Helper()
		if got != want {
			t.Errorf("%s: reply %q, want %q", what, got, want)
		}
	}
	checkReplies("tcp to the guest's port", ask(t, e.host, hostPort(pod, guest.port()), "a"), "guest: a")
	checkReplies("udp to the guest's port", askUDP(t, e.host, hostPort(pod, guest.port()), "b"), "guest: b")
	local := serveIn(t, e.pod, "6", hostPort(pod, guest.port()), "netns")
	other := serveIn(t, g.ns, "6", ":0", "guest")
	checkReplies("tcp to the netns's port", ask(t, e.host, hostPort(pod, guest.port()), "c"), "netns: c")
	checkReplies("udp to the netns's port", askUDP(t, e.host, hostPort(pod, guest.port()), "d"), "netns: d")
	checkReplies("tcp to another port", ask(t, e.host, hostPort(pod, other.port()), "e"), "guest: e")
	local.stop()
	checkReplies("tcp once the netns stopped listening", ask(t, e.host, hostPort(pod, guest.port()), "f"), "guest: f")
	checkReplies("tcp from the netns", ask(t, e.pod, hostPort(gw, host.port()), "g"), "host: g")
	checkReplies("udp from the netns", askUDP(t, e.pod, hostPort(gw, host.port()), "h"), "host: h")
	checkReplies("tcp from the guest", ask(t, g.ns, hostPort(gw, host.port()), "i"), "host: i")

	// The netns reaches the guest at its link-local address on the tap,
	// and the guest the netns at its router's.
	guestLL := (&net.TCPAddr{IP: eui64LinkLocal(nic.MAC), Port: guest.port(), Zone: "vmtap0"}).String()
	checkReplies("tcp from the netns to the guest", ask(t, e.pod, guestLL, "j"), "guest: j")
	tap, err := e.podH.LinkByName("vmtap0")
	if err != nil {
		t.Fatal(err)
	}
	wild := serveIn(t, e.pod, "", ":0", "netns wildcard")
	router := (&net.TCPAddr{IP: eui64LinkLocal(tap.Attrs().HardwareAddr), Port: wild.port(), Zone: "gtap0"}).String()
	checkReplies("tcp from the guest to the netns", ask(t, g.ns, router, "l"), "netns wildcard: l")

	// The DHCPv6 responder's socket ([fe80::<tap>]:547) takes nothing
	// of the guest's.
	serveIn(t, g.ns, "6", fmt.Sprintf(":%d", dhcp6ServerPort), "guest dhcpv6 port")
	checkReplies("udp to the guest's port 547", askUDP(t, e.host, hostPort(pod, dhcp6ServerPort), "k"), "guest dhcpv6 port: k")
	if err := n.Teardown(ctx); err != nil {
		t.Fatal(err)
	}
}

// tcpChecksum sets the checksum of an IPv4 TCP segment, which the
// receiving stack checks.
func tcpChecksum(src, dst net.IP, seg []byte) []byte {
	pseudo := append(append(append([]byte(nil), src.To4()...), dst.To4()...), 0, unix.IPPROTO_TCP, byte(len(seg)>>8), byte(len(seg)))
	binary.BigEndian.PutUint16(seg[16:18], 0)
	binary.BigEndian.PutUint16(seg[16:18], ipChecksum(append(pseudo, seg...))) // even length: 12 + 20 bytes
	return seg
}

// TestSetupNetnsSocketsLeaveTheRest sends frames from the pod network to
// a pod whose netns has a TCP and a UDP socket on a wildcard port: what
// those sockets do not own still reaches the guest, as before (ICMP, a
// broadcast to the port, a segment to the listening port that opens no
// connection, a fragment, ARP), and a SYN to the port does not.
func TestSetupNetnsSocketsLeaveTheRest(t *testing.T) {
	ctx := testCtx(t)
	e := newPodEnv(t)
	pl := e.addLink("eth0", 99, bridgeLike)
	n := e.setup(ctx)
	nic := n.NICs()[0]
	port := uint16(serveIn(t, e.pod, "", ":0", "netns").port())
	sniff := e.sniff(pl.hostName)
	marked := func(id uint16, pkt []byte) []byte {
		binary.BigEndian.PutUint16(pkt[4:6], id)
		binary.BigEndian.PutUint16(pkt[10:12], 0)
		binary.BigEndian.PutUint16(pkt[10:12], ipChecksum(pkt[:ipv4HeaderLen]))
		return pkt
	}
	from, pod := pl.gw, pl.podIP
	const tcp, udp = unix.IPPROTO_TCP, unix.IPPROTO_UDP
	frames := []struct {
		name    string
		frame   []byte
		toGuest bool
	}{
		{"icmp echo", ethFrame(pl.mac, pl.hostMAC, etherIP, marked(1, ipv4Pkt(from, pod, unix.IPPROTO_ICMP, 0, 0, []byte{8, 0, 0xf7, 0xfe, 0, 1, 0, 0}))), true},
		{"udp broadcast to the port", ethFrame(allOnesMAC, pl.hostMAC, etherIP, marked(2, ipv4Pkt(from, mustIP("10.99.0.255"), udp, 0, 0, udp6(testSport, port, []byte("q"))))), true},
		{"ack to the listening port", ethFrame(pl.mac, pl.hostMAC, etherIP, marked(3, ipv4Pkt(from, pod, tcp, 0, 0, tcpHdr(testSport, port, tcpFlagACK)))), true},
		{"first fragment of a datagram to the port", ethFrame(pl.mac, pl.hostMAC, etherIP, marked(4, ipv4Pkt(from, pod, udp, 0, 0x2000, udp6(testSport, port, make([]byte, 16))))), true},
		{"syn to the listening port", ethFrame(pl.mac, pl.hostMAC, etherIP, marked(5, ipv4Pkt(from, pod, tcp, 0, 0, tcpChecksum(from, pod, tcpHdr(testSport, port, tcpFlagSYN))))), false},
	}
	for _, f := range frames {
		if err := unix.Send(sniff.fd, f.frame, 0); err != nil {
			t.Fatalf("send %s: %v", f.name, err)
		}
	}
	if err := unix.Send(sniff.fd, ethFrame(allOnesMAC, pl.hostMAC, etherARP, arpPacket(1, pl.hostMAC, from, make(net.HardwareAddr, 6), pod)), 0); err != nil {
		t.Fatal(err)
	}
	seen, arp := map[uint16]bool{}, false
	for _, fr := range tapFrames(t, nic.Tap, 500*time.Millisecond) {
		p, ok := parseFrame(fr)
		switch {
		case ok && p.typ == etherIP && p.ipSrc.Equal(from):
			seen[binary.BigEndian.Uint16(fr[etherHeaderLen+4:])] = true
		case ok && p.typ == etherARP && p.arpOp == 1 && p.tpa.Equal(pod):
			arp = true
		}
	}
	for i, f := range frames {
		if seen[uint16(i+1)] != f.toGuest {
			t.Errorf("%s: reached the guest %v, want %v", f.name, seen[uint16(i+1)], f.toGuest)
		}
	}
	if !arp {
		t.Error("the arp request for the pod ip did not reach the guest")
	}
	synAck := false
	for _, fr := range sniff.frames(200 * time.Millisecond) {
		p, ok := parseFrame(fr)
		if ok && p.typ == etherIP && p.proto == tcp && p.ipSrc.Equal(pod) {
			l4 := fr[etherHeaderLen+ipv4HeaderLen:]
			synAck = synAck || binary.BigEndian.Uint16(l4) == port && l4[tcpFlagsOff] == tcpFlagSYN|tcpFlagACK
		}
	}
	if !synAck {
		t.Error("the netns did not answer the syn to its listening port")
	}
}

// TestSetupSocketRouting looks at the routing Wire adds for the netns's
// own sockets, and at what Teardown leaves: a table nothing used, a rule
// per CNI interface with IPv4, ip_nonlocal_bind on, then all as found.
func TestSetupSocketRouting(t *testing.T) {
	for _, tc := range []struct {
		name     string
		nonlocal string
	}{
		{"non-local bind off", "0"},
		{"non-local bind already on", "1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			e := newPodEnv(t)
			eth0 := e.addLink("eth0", 99, bridgeLike)
			net1 := e.addLink("net1", 98, sideLink)
			// The first table planSockets would pick is taken.
			e.podCmd("ip", "route", "add", "blackhole", "10.1.2.0/24", "table", strconv.Itoa(sockTableBase))
			e.podCmd("sh", "-c", "echo "+tc.nonlocal+" > "+sysctlNonlocalBind)
			before := e.snapshot()
			n := e.setup(ctx)
			st := n.State()
			if st.SockTable != sockTableBase+1 || st.NonlocalBind != tc.nonlocal {
				t.Errorf("state: table %d, ip_nonlocal_bind %q; want %d, %q", st.SockTable, st.NonlocalBind, sockTableBase+1, tc.nonlocal)
			}
			table := strconv.Itoa(st.SockTable)
			rules := e.podCmd("ip", "rule", "show", "lookup", table)
			for _, link := range []string{"eth0", "net1"} {
				if want := fmt.Sprintf("%d:\tfrom all iif %s lookup %s", sockRulePref, link, table); !strings.Contains(rules, want) {
					t.Errorf("rules to table %s:\n%s\nwant %q", table, rules, want)
				}
			}
			routes := e.podCmd("ip", "route", "show", "table", table)
			for _, pl := range []podLink{eth0, net1} {
				if want := fmt.Sprintf("local %s dev %s scope host", pl.podIP, pl.name); !strings.Contains(routes, want) {
					t.Errorf("table %s:\n%s\nwant %q", table, routes, want)
				}
			}
			if got := strings.TrimSpace(e.podCmd("cat", sysctlNonlocalBind)); got != "1" {
				t.Errorf("ip_nonlocal_bind = %s while wired, want 1", got)
			}
			if err := n.Teardown(ctx); err != nil {
				t.Fatal(err)
			}
			if after := e.snapshot(); after != before {
				t.Errorf("netns differs after teardown\n--- before\n%s\n--- after\n%s", before, after)
			}
		})
	}
}

// An IPv6-only netns gets no table, rule or setting for IPv4.
func TestSetupSocketRoutingIPv6Only(t *testing.T) {
	ctx := testCtx(t)
	e := newPodEnv(t)
	e.addIPv6OnlyLink("eth0", 99)
	n := e.setup(ctx)
	if st := n.State(); st.SockTable != 0 || st.NonlocalBind != "" {
		t.Errorf("state: table %d, ip_nonlocal_bind %q; want none", st.SockTable, st.NonlocalBind)
	}
	if rules := e.podCmd("ip", "rule"); strings.Contains(rules, "iif") {
		t.Errorf("rules:\n%s", rules)
	}
}
