package network

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

var (
	testPod4    = mustIP("10.99.0.5")
	testPeer4   = mustIP("10.99.0.1")
	testPod6    = net.ParseIP("fd00:99::5")
	testPeer6   = net.ParseIP("fd00:99::1")
	testPodMAC  = net.HardwareAddr{0x02, 0, 0, 0, 0x99, 0x05}
	testPeerMAC = net.HardwareAddr{0x02, 0, 0, 0, 0x99, 0x01}
)

// testSport is the peer's port in hand-built packets: outside the
// ephemeral range, so no connection of the test has it.
const testSport = 999

// tcpHdr is a 20-byte TCP header with flags.
func tcpHdr(sport, dport uint16, flags byte) []byte {
	b := make([]byte, 20)
	binary.BigEndian.PutUint16(b[0:2], sport)
	binary.BigEndian.PutUint16(b[2:4], dport)
	b[12], b[13] = 5<<4, flags
	return b
}

// ipv4Pkt is an IPv4 packet of proto with optWords words of options and the
// fragment field frag (flags and offset), around l4.
func ipv4Pkt(src, dst net.IP, proto byte, optWords int, frag uint16, l4 []byte) []byte {
	hl := ipv4HeaderLen + 4*optWords
	b := make([]byte, hl, hl+len(l4))
	b[0] = 0x40 | byte(hl/4)
	binary.BigEndian.PutUint16(b[2:4], uint16(hl+len(l4)))
	binary.BigEndian.PutUint16(b[6:8], frag)
	b[8], b[9] = 64, proto
	copy(b[12:16], src.To4())
	copy(b[16:20], dst.To4())
	for i := ipv4HeaderLen; i < hl; i++ {
		b[i] = 1 // no-operation options
	}
	binary.BigEndian.PutUint16(b[10:12], ipChecksum(b[:hl]))
	return append(b, l4...)
}

func frame4(pkt []byte) []byte { return ethFrame(testPodMAC, testPeerMAC, etherIP, pkt) }

// frame6To is an IPv6 frame from src to dst whose header says first.
func frame6To(src, dst net.IP, first byte, rest []byte) []byte {
	return ipv6Frame(testPodMAC, testPeerMAC, src, dst, first, 64, rest)
}

// Ports of sockEnv's sockets, each with nothing else on it. The netns is
// the test's own, so they are free; fixed, they let the fuzz corpus aim
// at them.
const (
	portListen4    = 8004 // TCP listener on the pod's IPv4 address
	portListenAny  = 8000 // TCP listener on the wildcard, both families
	portListenLoop = 8001 // TCP listener on 127.0.0.1, as port-forward's
	portListen6    = 8006 // TCP listener on the pod's IPv6 address
	portPeer       = 8080 // TCP listener on the peer's address
	portUDP4       = 5304 // UDP socket on the pod's IPv4 address
	portUDPAny     = 5300 // UDP socket on the wildcard, both families
	portUDPLL      = 547  // UDP socket on the link's link-local address, as the DHCPv6 responder's
	portConn4      = 4444 // the peer's end of a connection to portListen4
	portConn6      = 6666 // the peer's end of a connection to portListen6
	portOut        = 7777 // the pod's end of a connection to the peer's portPeer
	portFree       = 9    // nothing is bound to it
)

// sockEnv is a netns holding the pod's and a peer's addresses on a veth,
// and sockets of every kind the classifier must tell apart.
type sockEnv struct {
	ns             netns.NsHandle
	addrs4, addrs6 []net.IP // the pod's
}

// tcpTuple is one packet's view of a connection: from the peer to the pod.
type tcpTuple struct {
	src, dst     net.IP
	sport, dport int
}

// The connections of sockEnv, as the peer's packets name them.
var (
	conn4 = tcpTuple{testPeer4, testPod4, portConn4, portListen4}
	conn6 = tcpTuple{testPeer6, testPod6, portConn6, portListen6}
	out4  = tcpTuple{testPeer4, testPod4, portPeer, portOut}
)

func newSockEnv(t testing.TB) *sockEnv {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces and loads BPF programs")
	}
	e := &sockEnv{addrs4: []net.IP{mustIP("10.99.0.9"), testPod4}, addrs6: []net.IP{testPod6}}
	var h *netlink.Handle
	e.ns, h = newNS(t)
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "pod0"}, PeerName: "pod1"}); err != nil {
		t.Fatal(err)
	}
	pod0, err := h.LinkByName("pod0")
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"10.99.0.5/24", "10.99.0.9/24", "10.99.0.1/24", "fd00:99::5/64", "fd00:99::1/64", "fe80::99:5/64"} {
		if err := h.AddrAdd(pod0, &netlink.Addr{IPNet: hostNet(a), Flags: unix.IFA_F_NODAD}); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"pod0", "pod1"} {
		l, err := h.LinkByName(name)
		if err == nil {
			err = h.LinkSetUp(l)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	// fd00:99::5/64, fd00:99::1/64, fe80::99:5/64 and the kernel's own
	// link-local address.
	settleLink(t, h, "pod0", 4)
	var (
		mu      sync.Mutex // guards closers, which the accepting goroutines add to
		closers []io.Closer
	)
	keep := func(c io.Closer) {
		mu.Lock()
		defer mu.Unlock()
		closers = append(closers, c)
	}
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range closers {
			_ = c.Close()
		}
	})
	listen := func(network string, ip net.IP, port int) error {
		ln, err := net.ListenTCP(network, &net.TCPAddr{IP: ip, Port: port})
		if err != nil {
			return err
		}
		keep(ln)
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				keep(c)
			}
		}()
		return nil
	}
	udp := func(addr *net.UDPAddr) error {
		c, err := net.ListenUDP("udp", addr)
		if err == nil {
			keep(c)
		}
		return err
	}
	dial := func(c tcpTuple, fromPeer bool) error {
		local, remote := &net.TCPAddr{IP: c.src, Port: c.sport}, &net.TCPAddr{IP: c.dst, Port: c.dport}
		if !fromPeer {
			local, remote = remote, local
		}
		d := net.Dialer{LocalAddr: local, Timeout: 5 * time.Second}
		conn, err := d.Dial("tcp", remote.String())
		if err == nil {
			keep(conn)
		}
		return err
	}
	err = runInNS(e.ns, func() error {
		return errors.Join(
			listen("tcp4", testPod4, portListen4),
			listen("tcp", nil, portListenAny),
			listen("tcp4", net.IPv4(127, 0, 0, 1), portListenLoop),
			listen("tcp6", testPod6, portListen6),
			listen("tcp4", testPeer4, portPeer),
			udp(&net.UDPAddr{IP: testPod4, Port: portUDP4}),
			udp(&net.UDPAddr{Port: portUDPAny}),
			udp(&net.UDPAddr{IP: net.ParseIP("fe80::99:5"), Port: portUDPLL, Zone: "pod0"}),
			dial(conn4, true),
			dial(conn6, true),
			dial(out4, false),
		)
	})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func loadTestSock(t testing.TB, addrs4, addrs6 []net.IP) *ebpf.Program {
	t.Helper()
	prog, err := loadSock(addrs4, addrs6)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { prog.Close() })
	return prog
}

// run runs prog on frame in the netns, whose sockets it looks up.
func (e *sockEnv) run(t testing.TB, prog *ebpf.Program, frame []byte) int32 {
	t.Helper()
	var ret uint32
	err := runInNS(e.ns, func() error {
		var err error
		ret, err = prog.Run(&ebpf.RunOptions{Data: frame})
		return err
	})
	if err != nil {
		t.Fatalf("run on %x: %v", frame, err)
	}
	return int32(ret)
}

// TestSockProgram runs the CNI link's socket classifier (BPF_PROG_TEST_RUN)
// on hand-built frames in a netns with sockets of each kind: what a
// socket of the netns owns goes up its stack, the rest to the guest.
func TestSockProgram(t *testing.T) {
	e := newSockEnv(t)
	prog := loadTestSock(t, e.addrs4, e.addrs6)
	const tcp, udp, icmp = unix.IPPROTO_TCP, unix.IPPROTO_UDP, unix.IPPROTO_ICMP
	const syn, ack, synAck, rst = tcpFlagSYN, tcpFlagACK, tcpFlagSYN | tcpFlagACK, tcpFlagRST
	p := func(n int) uint16 { return uint16(n) }
	seg4 := func(t tcpTuple, flags byte) []byte {
		return frame4(ipv4Pkt(t.src, t.dst, tcp, 0, 0, tcpHdr(p(t.sport), p(t.dport), flags)))
	}
	to4 := func(port int, flags byte) []byte {
		return seg4(tcpTuple{src: testPeer4, dst: testPod4, sport: testSport, dport: port}, flags)
	}
	dgram4 := func(dst net.IP, port int) []byte {
		return frame4(ipv4Pkt(testPeer4, dst, udp, 0, 0, udp6(testSport, p(port), []byte("q"))))
	}
	behind := func(first byte, rest []byte) []byte { return frame6To(testPeer6, testPod6, first, rest) }
	seg6 := func(dport int, flags byte) []byte {
		return frame6To(testPeer6, testPod6, tcp, tcpHdr(testSport, p(dport), flags))
	}
	for _, tc := range []struct {
		name  string
		frame []byte
		want  int32
	}{
		{"syn to a listener on the pod address", to4(portListen4, syn), tcActOK},
		{"syn to a wildcard listener", to4(portListenAny, syn), tcActOK},
		{"syn to the secondary address's wildcard listener", seg4(tcpTuple{testPeer4, mustIP("10.99.0.9"), testSport, portListenAny}, syn), tcActOK},
		{"syn behind ip options", frame4(ipv4Pkt(testPeer4, testPod4, tcp, 3, 0, tcpHdr(testSport, p(portListen4), syn))), tcActOK},
		{"ack to a listener without a connection", to4(portListen4, ack), tcActUnspec},
		{"syn-ack to a listener", to4(portListenAny, synAck), tcActUnspec},
		{"rst to a listener", to4(portListenAny, rst), tcActUnspec},
		{"syn to a port nothing listens on", to4(portFree, syn), tcActUnspec},
		{"syn to a port the netns listens on at 127.0.0.1", to4(portListenLoop, syn), tcActUnspec},
		{"syn to the pod's ipv6 listener's port over ipv4", to4(portListen6, syn), tcActUnspec},
		{"segment of an accepted connection", seg4(conn4, ack), tcActOK},
		{"reply to a connection the netns opened", seg4(out4, synAck), tcActOK},
		{"segment of a connection from another port", seg4(tcpTuple{conn4.src, conn4.dst, conn4.sport + 1, conn4.dport}, ack), tcActUnspec},
		{"syn to a listener at another address", seg4(tcpTuple{testPeer4, mustIP("10.99.0.7"), testSport, portListenAny}, syn), tcActUnspec},
		{"first fragment of a syn", frame4(ipv4Pkt(testPeer4, testPod4, tcp, 0, 0x2000, tcpHdr(testSport, p(portListenAny), syn))), tcActUnspec},
		{"later fragment", frame4(ipv4Pkt(testPeer4, testPod4, tcp, 0, 0x0010, tcpHdr(testSport, p(portListenAny), syn))), tcActUnspec},
		{"tcp header cut short", frame4(ipv4Pkt(testPeer4, testPod4, tcp, 0, 0, tcpHdr(testSport, p(portListenAny), syn)[:13])), tcActUnspec},
		{"udp to a socket on the pod address", dgram4(testPod4, portUDP4), tcActOK},
		{"udp to a wildcard socket", dgram4(testPod4, portUDPAny), tcActOK},
		{"udp to a port nothing is bound to", dgram4(testPod4, portFree), tcActUnspec},
		{"udp broadcast to a wildcard socket", dgram4(mustIP("10.99.0.255"), portUDPAny), tcActUnspec},
		{"udp header cut short", frame4(ipv4Pkt(testPeer4, testPod4, udp, 0, 0, []byte{0x03, 0xe7, 0})), tcActUnspec},
		{"icmp", frame4(ipv4Pkt(testPeer4, testPod4, icmp, 0, 0, []byte{8, 0, 0, 0, 0, 1, 0, 1})), tcActUnspec},
		{"ip options past the end of the packet", frame4(ipv4Pkt(testPeer4, testPod4, tcp, 10, 0, tcpHdr(testSport, p(portListenAny), syn))[:ipv4HeaderLen+4*6]), tcActUnspec},
		{"arp", ethFrame(allOnesMAC, testPeerMAC, etherARP, arpPacket(1, testPeerMAC, testPeer4, make(net.HardwareAddr, 6), testPod4)), tcActUnspec},

		{"ipv6 syn to a listener on the pod address", seg6(portListen6, syn), tcActOK},
		{"ipv6 syn to a wildcard listener", seg6(portListenAny, syn), tcActOK},
		{"ipv6 segment of an accepted connection", frame6To(conn6.src, conn6.dst, tcp, tcpHdr(p(conn6.sport), p(conn6.dport), ack)), tcActOK},
		{"ipv6 ack to a listener", seg6(portListen6, ack), tcActUnspec},
		{"ipv6 syn to a port nothing listens on", seg6(portFree, syn), tcActUnspec},
		{"ipv6 syn behind destination options", frame6To(testPeer6, testPod6, ip6DestOpts, chain(tcpHdr(testSport, p(portListen6), syn), optsHdr(tcp, 0))), tcActOK},
		{"ipv6 syn behind hop-by-hop, routing and ah", frame6To(testPeer6, testPod6, ip6HopByHop, chain(tcpHdr(testSport, p(portListen6), syn), ahHdr(tcp), routingHdr(ip6AH), optsHdr(ip6Routing, 1))), tcActOK},
		{"ipv6 syn behind eight headers", behind(longChain(tcpHdr(testSport, p(portListen6), syn), tcp, 8)), tcActOK},
		{"ipv6 syn behind nine headers", behind(longChain(tcpHdr(testSport, p(portListen6), syn), tcp, 9)), tcActUnspec},
		{"ipv6 syn in a first fragment", frame6To(testPeer6, testPod6, ip6Fragment, chain(tcpHdr(testSport, p(portListen6), syn), fragHdr(tcp, 0, true))), tcActUnspec},
		{"ipv6 chain cut short", frame6To(testPeer6, testPod6, ip6DestOpts, []byte{tcp}), tcActUnspec},
		{"ipv6 udp to a wildcard socket", frame6To(testPeer6, testPod6, udp, udp6(testSport, p(portUDPAny), []byte("q"))), tcActOK},
		{"ipv6 udp to the port of a socket on the link-local address", frame6To(testPeer6, testPod6, udp, udp6(testSport, p(portUDPLL), []byte("q"))), tcActUnspec},
		{"ipv6 udp to the pod's ipv4 socket's port", frame6To(testPeer6, testPod6, udp, udp6(testSport, p(portUDP4), []byte("q"))), tcActUnspec},
		{"ipv6 to another address", frame6To(testPeer6, net.ParseIP("fd00:99::7"), tcp, tcpHdr(testSport, p(portListenAny), syn)), tcActUnspec},
		{"ipv6 multicast udp", frame6To(testPeer6, net.ParseIP("ff02::1"), udp, udp6(testSport, p(portUDPAny), []byte("q"))), tcActUnspec},
		{"icmpv6", frame6To(testPeer6, testPod6, unix.IPPROTO_ICMPV6, icmp6Msg(128, 0, 1, 0, 1)), tcActUnspec},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := e.run(t, prog, tc.frame); got != tc.want {
				t.Errorf("verdict = %d, want %d; frame %x", got, tc.want, tc.frame)
			}
			if got := e.model(tc.frame); got != tc.want {
				t.Errorf("model verdict = %d, want %d", got, tc.want)
			}
		})
	}
}

// TestSockProgramFamilies loads the classifier of links with one family
// or none: the other family's packets, even to a socket, go to the guest.
func TestSockProgramFamilies(t *testing.T) {
	e := newSockEnv(t)
	syn4 := frame4(ipv4Pkt(testPeer4, testPod4, unix.IPPROTO_TCP, 0, 0, tcpHdr(testSport, uint16(portListenAny), tcpFlagSYN)))
	syn6 := frame6To(testPeer6, testPod6, unix.IPPROTO_TCP, tcpHdr(testSport, uint16(portListenAny), tcpFlagSYN))
	for _, tc := range []struct {
		name           string
		addrs4, addrs6 []net.IP
		want4, want6   int32
	}{
		{"ipv4 only", []net.IP{testPod4}, nil, tcActOK, tcActUnspec},
		{"ipv6 only", nil, []net.IP{testPod6}, tcActUnspec, tcActOK},
		{"none", nil, nil, tcActUnspec, tcActUnspec},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prog := loadTestSock(t, tc.addrs4, tc.addrs6)
			if got := e.run(t, prog, syn4); got != tc.want4 {
				t.Errorf("ipv4 syn: verdict %d, want %d", got, tc.want4)
			}
			if got := e.run(t, prog, syn6); got != tc.want6 {
				t.Errorf("ipv6 syn: verdict %d, want %d", got, tc.want6)
			}
		})
	}
}

// model is sockProgram in Go, over the sockets newSockEnv opened.
func (e *sockEnv) model(frame []byte) int32 {
	if len(frame) < etherHeaderLen {
		return tcActUnspec
	}
	var (
		src, dst net.IP
		proto    byte
		l4       []byte
	)
	switch pkt := frame[etherHeaderLen:]; binary.BigEndian.Uint16(frame[12:14]) {
	case etherIP:
		if len(pkt) < ipv4HeaderLen || pkt[0]>>4 != 4 || pkt[0]&0xf < 5 {
			return tcActUnspec
		}
		if pkt[6]&0x3f != 0 || pkt[7] != 0 {
			return tcActUnspec
		}
		src, dst, proto = net.IP(pkt[12:16]), net.IP(pkt[16:20]), pkt[9]
		if !slices.ContainsFunc(e.addrs4, dst.Equal) {
			return tcActUnspec
		}
		l4 = pkt[min(int(pkt[0]&0xf)*4, len(pkt)):]
	case unix.ETH_P_IPV6:
		if len(pkt) < ipv6HeaderLen {
			return tcActUnspec
		}
		src, dst = net.IP(pkt[8:24]), net.IP(pkt[24:40])
		if !slices.ContainsFunc(e.addrs6, dst.Equal) {
			return tcActUnspec
		}
		next, off := pkt[6], ipv6HeaderLen
		for i := 0; next == ip6HopByHop || next == ip6Routing || next == ip6DestOpts || next == ip6AH; i++ {
			if i == maxExtHeaders || off+2 > len(pkt) {
				return tcActUnspec
			}
			n := int(pkt[off+1])
			if next == ip6AH {
				next, off = pkt[off], off+(n+2)*4
			} else {
				next, off = pkt[off], off+(n+1)*8
			}
		}
		proto, l4 = next, pkt[min(off, len(pkt)):]
	default:
		return tcActUnspec
	}
	v4 := dst.To4() != nil
	switch proto {
	case unix.IPPROTO_TCP:
		if len(l4) < tcpFlagsOff+1 {
			return tcActUnspec
		}
		sport, dport := int(binary.BigEndian.Uint16(l4)), int(binary.BigEndian.Uint16(l4[2:]))
		for _, c := range []tcpTuple{conn4, conn6, out4} {
			if c.src.Equal(src) && c.dst.Equal(dst) && c.sport == sport && c.dport == dport {
				return tcActOK
			}
		}
		listening := dport == portListenAny || (v4 && dport == portListen4 && dst.Equal(testPod4)) || (!v4 && dport == portListen6)
		if listening && l4[tcpFlagsOff]&(tcpFlagSYN|tcpFlagACK|tcpFlagRST) == tcpFlagSYN {
			return tcActOK
		}
	case unix.IPPROTO_UDP:
		if len(l4) < 4 {
			return tcActUnspec
		}
		dport := int(binary.BigEndian.Uint16(l4[2:]))
		if dport == portUDPAny || (v4 && dport == portUDP4 && dst.Equal(testPod4)) {
			return tcActOK
		}
	}
	return tcActUnspec
}
