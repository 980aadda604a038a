package network

import (
	"bytes"
	"encoding/binary"
	"net"
	"slices"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// noSuchIfindex is where the link side's test classifier copies
// neighbour advertisements: no interface has it, so the copy fails and
// nothing leaves the test.
const noSuchIfindex = 0x7ffffff0

// Extension headers for hand-built packets.

// optsHdr is a Hop-by-Hop or Destination Options header of (units+1)*8
// bytes, padded with one PadN option.
func optsHdr(next byte, units int) []byte {
	b := make([]byte, (units+1)*8)
	b[0], b[1] = next, byte(units)
	b[2], b[3] = 1, byte(len(b)-4) // PadN
	return b
}

// routingHdr is a Routing header of an experimental type (RFC 4727)
// with no segments left, which receivers skip.
func routingHdr(next byte) []byte {
	return []byte{next, 0, 253, 0, 0, 0, 0, 0}
}

// fragHdr is a Fragment header; offset is in 8-byte units.
func fragHdr(next byte, offset uint16, more bool) []byte {
	b := []byte{next, 0, 0, 0, 0, 0, 0x12, 0x34}
	v := offset << 3
	if more {
		v |= 1
	}
	binary.BigEndian.PutUint16(b[2:4], v)
	return b
}

// ahHdr is an Authentication Header with a 12-byte ICV: (4+2)*4 bytes.
func ahHdr(next byte) []byte {
	b := make([]byte, 24)
	b[0], b[1] = next, 4
	return b
}

// chain prepends headers to upper: the last header given comes first.
func chain(upper []byte, hdrs ...[]byte) []byte {
	out := bytes.Clone(upper)
	for _, h := range hdrs {
		out = append(bytes.Clone(h), out...)
	}
	return out
}

// longChain is upper, of protocol proto, behind n Destination Options
// headers: the first header's protocol and the packet.
func longChain(upper []byte, proto byte, n int) (byte, []byte) {
	out := upper
	for range n {
		out, proto = chain(out, optsHdr(proto, 0)), ip6DestOpts
	}
	return proto, out
}

func icmp6Msg(typ byte, body ...byte) []byte {
	return append([]byte{typ, 0, 0, 0}, body...)
}

func nsMsg(typ byte, target net.IP) []byte {
	return icmp6Msg(typ, append(make([]byte, 4), target.To16()...)...)
}

func tcpSeg(dport uint16) []byte {
	b := make([]byte, 20)
	binary.BigEndian.PutUint16(b[0:2], 40000)
	binary.BigEndian.PutUint16(b[2:4], dport)
	b[12] = 5 << 4
	return b
}

var (
	testGuestMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x05}
	testTapMAC   = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x01}
	testTapLL    = net.ParseIP("fe80::ff:fe00:1")
	testGuestLL  = net.ParseIP("fe80::ff:fe00:5")
)

// pkt6 is a frame from the guest's link-local address to ff02::1 whose
// IPv6 header says first, followed by rest.
func pkt6(first byte, rest []byte) []byte {
	return ipv6Frame(multicastMAC(net.ParseIP("ff02::1")), testGuestMAC, testGuestLL, net.ParseIP("ff02::1"), first, 255, rest)
}

func loadTestCtl6(t *testing.T, r ctl6Rules) *ebpf.Program {
	t.Helper()
	needRoot(t)
	prog, err := loadCtl6(r)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { prog.Close() })
	return prog
}

func runCtl6(t testing.TB, prog *ebpf.Program, frame []byte) int32 {
	t.Helper()
	ret, err := prog.Run(&ebpf.RunOptions{Data: frame})
	if err != nil {
		t.Fatalf("run on %x: %v", frame, err)
	}
	return int32(ret)
}

type ctl6Case struct {
	name  string
	frame []byte
	want  int32
}

// commonCases hold for both directions: they are not control traffic,
// or are ambiguous.
func commonCases() []ctl6Case {
	const icmp, udp, tcp = unix.IPPROTO_ICMPV6, unix.IPPROTO_UDP, unix.IPPROTO_TCP
	ra := icmp6Msg(icmp6RouterAdvert, make([]byte, 12)...)
	return []ctl6Case{
		{"ordinary udp", pkt6(udp, udp6(5000, 53, []byte("q"))), tcActUnspec},
		{"ordinary udp behind destination options", pkt6(ip6DestOpts, chain(udp6(5000, 53, []byte("q")), optsHdr(udp, 0))), tcActUnspec},
		{"ordinary tcp", pkt6(tcp, tcpSeg(80)), tcActUnspec},
		{"ordinary tcp behind hop-by-hop", pkt6(ip6HopByHop, chain(tcpSeg(80), optsHdr(tcp, 0))), tcActUnspec},
		{"mld report behind hop-by-hop with router alert", pkt6(ip6HopByHop, chain(icmp6Msg(143, make([]byte, 24)...), []byte{icmp, 0, 5, 2, 0, 0, 1, 0})), tcActUnspec},
		{"echo request behind destination options", pkt6(ip6DestOpts, chain(icmp6Msg(128, 0, 1, 0, 1), optsHdr(icmp, 0))), tcActUnspec},
		{"first fragment of ordinary udp", pkt6(ip6Fragment, chain(udp6(5000, 53, make([]byte, 64)), fragHdr(udp, 0, true))), tcActUnspec},
		{"non-first fragment of ordinary udp", pkt6(ip6Fragment, chain(make([]byte, 64), fragHdr(udp, 9, true))), tcActUnspec},
		{"last fragment of ordinary udp", pkt6(ip6Fragment, chain(make([]byte, 13), fragHdr(udp, 9, false))), tcActUnspec},
		{"non-first fragment that looks like an ra", pkt6(ip6Fragment, chain(ra, fragHdr(icmp, 1, false))), tcActUnspec},
		{"non-first fragment behind destination options", pkt6(ip6DestOpts, chain(ra, fragHdr(icmp, 1, true), optsHdr(ip6Fragment, 0))), tcActUnspec},
		{"no next header behind destination options", pkt6(ip6DestOpts, optsHdr(59, 0)), tcActUnspec},
		{"ra behind a chain of nine headers", pkt6(longChain(ra, icmp, 9)), tcActShot},
		{"ordinary udp behind a chain of nine headers", pkt6(longChain(udp6(5000, 53, nil), udp, 9)), tcActShot},
		{"destination options cut after one byte", pkt6(ip6DestOpts, []byte{icmp}), tcActShot},
		{"destination options longer than the frame", pkt6(ip6DestOpts, optsHdr(icmp, 0)[:2]), tcActShot},
		{"destination options whose length runs past the frame", pkt6(ip6DestOpts, append([]byte{icmp, 3}, make([]byte, 14)...)), tcActShot},
		{"icmpv6 cut to 2 bytes behind destination options", pkt6(ip6DestOpts, chain(ra[:2], optsHdr(icmp, 0))), tcActShot},
		{"udp cut to 3 bytes behind destination options", pkt6(ip6DestOpts, chain([]byte{2, 34, 2}, optsHdr(udp, 0))), tcActShot},
		{"fragment header cut short", pkt6(ip6Fragment, []byte{icmp, 0, 0}), tcActShot},
		{"first fragment whose chain does not fit", pkt6(ip6Fragment, chain(optsHdr(icmp, 1)[:8], fragHdr(ip6DestOpts, 0, true))), tcActShot},
		{"ah cut short", pkt6(ip6AH, ahHdr(icmp)[:1]), tcActShot},
	}
}

// TestCtl6ProgramTap runs the guest side's classifier (BPF_PROG_TEST_RUN)
// on hand-built frames: the guest's router discovery, redirects and
// DHCPv6 stay in the netns, with or without extension headers.
func TestCtl6ProgramTap(t *testing.T) {
	prog := loadTestCtl6(t, tapRules6(testTapLL))
	const icmp, udp = unix.IPPROTO_ICMPV6, unix.IPPROTO_UDP
	ra := icmp6Msg(icmp6RouterAdvert, make([]byte, 12)...)
	cases := append(commonCases(),
		ctl6Case{"plain ra", pkt6(icmp, ra), tcActOK},
		ctl6Case{"plain rs", pkt6(icmp, icmp6Msg(icmp6RouterSolicit, 0, 0, 0, 0)), tcActOK},
		ctl6Case{"ra behind destination options", pkt6(ip6DestOpts, chain(ra, optsHdr(icmp, 0))), tcActOK},
		ctl6Case{"ra behind long destination options", pkt6(ip6DestOpts, chain(ra, optsHdr(icmp, 5))), tcActOK},
		ctl6Case{"ra behind hop-by-hop and destination options", pkt6(ip6HopByHop, chain(ra, optsHdr(icmp, 0), optsHdr(ip6DestOpts, 1))), tcActOK},
		ctl6Case{"ra behind routing", pkt6(ip6Routing, chain(ra, routingHdr(icmp))), tcActOK},
		ctl6Case{"ra behind ah", pkt6(ip6AH, chain(ra, ahHdr(icmp))), tcActOK},
		ctl6Case{"ra in a first fragment", pkt6(ip6Fragment, chain(ra, fragHdr(icmp, 0, true))), tcActOK},
		ctl6Case{"ra in an atomic fragment", pkt6(ip6Fragment, chain(ra, fragHdr(icmp, 0, false))), tcActOK},
		ctl6Case{"ra behind a chain of eight headers", pkt6(longChain(ra, icmp, 8)), tcActOK},
		ctl6Case{"rs behind destination options", pkt6(ip6DestOpts, chain(icmp6Msg(icmp6RouterSolicit, 0, 0, 0, 0), optsHdr(icmp, 0))), tcActOK},
		ctl6Case{"redirect behind destination options", pkt6(ip6DestOpts, chain(icmp6Msg(icmp6Redirect, make([]byte, 36)...), optsHdr(icmp, 0))), tcActOK},
		ctl6Case{"dhcpv6 solicit behind destination options", pkt6(ip6DestOpts, chain(udp6(546, 547, []byte{1, 0, 0, 1}), optsHdr(udp, 0))), tcActOK},
		ctl6Case{"dhcpv6 reply behind destination options", pkt6(ip6DestOpts, chain(udp6(547, 546, []byte{7, 0, 0, 1}), optsHdr(udp, 0))), tcActOK},
		ctl6Case{"dhcpv6 in a first fragment", pkt6(ip6Fragment, chain(udp6(546, 547, make([]byte, 64)), fragHdr(udp, 0, true))), tcActOK},
		ctl6Case{"ns for the router behind destination options", pkt6(ip6DestOpts, chain(nsMsg(icmp6NeighborSolicit, testTapLL), optsHdr(icmp, 0))), tcActOK},
		ctl6Case{"plain ns for the router", pkt6(icmp, nsMsg(icmp6NeighborSolicit, testTapLL)), tcActOK},
		ctl6Case{"ns for another address behind destination options", pkt6(ip6DestOpts, chain(nsMsg(icmp6NeighborSolicit, net.ParseIP("fe80::9")), optsHdr(icmp, 0))), tcActUnspec},
		ctl6Case{"ns whose target is cut short", pkt6(ip6DestOpts, chain(nsMsg(icmp6NeighborSolicit, testTapLL)[:20], optsHdr(icmp, 0))), tcActShot},
		ctl6Case{"na behind destination options", pkt6(ip6DestOpts, chain(nsMsg(icmp6NeighborAdvert, testTapLL), optsHdr(icmp, 0))), tcActUnspec},
	)
	checkCtl6(t, prog, tapRules6(testTapLL), cases)
}

// TestCtl6ProgramLink runs the pod network side's classifier: router
// advertisements, redirects and DHCPv6 replies never reach the guest,
// with or without extension headers.
func TestCtl6ProgramLink(t *testing.T) {
	r := linkRules6(noSuchIfindex)
	prog := loadTestCtl6(t, r)
	const icmp, udp = unix.IPPROTO_ICMPV6, unix.IPPROTO_UDP
	ra := icmp6Msg(icmp6RouterAdvert, make([]byte, 12)...)
	cases := append(commonCases(),
		ctl6Case{"plain ra", pkt6(icmp, ra), tcActOK},
		ctl6Case{"ra behind destination options", pkt6(ip6DestOpts, chain(ra, optsHdr(icmp, 0))), tcActOK},
		ctl6Case{"ra behind hop-by-hop and destination options", pkt6(ip6HopByHop, chain(ra, optsHdr(icmp, 0), optsHdr(ip6DestOpts, 0))), tcActOK},
		ctl6Case{"ra behind routing", pkt6(ip6Routing, chain(ra, routingHdr(icmp))), tcActOK},
		ctl6Case{"ra in a first fragment", pkt6(ip6Fragment, chain(ra, fragHdr(icmp, 0, true))), tcActOK},
		ctl6Case{"redirect behind destination options", pkt6(ip6DestOpts, chain(icmp6Msg(icmp6Redirect, make([]byte, 36)...), optsHdr(icmp, 0))), tcActOK},
		ctl6Case{"dhcpv6 reply behind destination options", pkt6(ip6DestOpts, chain(udp6(547, 546, []byte{7, 0, 0, 1}), optsHdr(udp, 0))), tcActOK},
		ctl6Case{"dhcpv6 to a server behind destination options", pkt6(ip6DestOpts, chain(udp6(546, 547, []byte{1, 0, 0, 1}), optsHdr(udp, 0))), tcActUnspec},
		ctl6Case{"na behind destination options", pkt6(ip6DestOpts, chain(nsMsg(icmp6NeighborAdvert, testTapLL), optsHdr(icmp, 0))), tcActOK},
		ctl6Case{"rs behind destination options", pkt6(ip6DestOpts, chain(icmp6Msg(icmp6RouterSolicit, 0, 0, 0, 0), optsHdr(icmp, 0))), tcActUnspec},
		ctl6Case{"ns behind destination options", pkt6(ip6DestOpts, chain(nsMsg(icmp6NeighborSolicit, testTapLL), optsHdr(icmp, 0))), tcActUnspec},
	)
	checkCtl6(t, prog, r, cases)
}

func checkCtl6(t *testing.T, prog *ebpf.Program, r ctl6Rules, cases []ctl6Case) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := runCtl6(t, prog, tc.frame); got != tc.want {
				t.Errorf("verdict = %d, want %d; frame %x", got, tc.want, tc.frame)
			}
			if got := ctl6Model(tc.frame, r); got != tc.want {
				t.Errorf("model verdict = %d, want %d", got, tc.want)
			}
		})
	}
}

// ctl6Model is ctl6Program in Go, for the fuzz target to hold the
// program to.
func ctl6Model(frame []byte, r ctl6Rules) int32 {
	if len(frame) < etherHeaderLen+7 {
		return tcActUnspec
	}
	next, off := frame[etherHeaderLen+6], etherHeaderLen+ipv6HeaderLen
	for i := 0; ; i++ {
		switch next {
		case ip6HopByHop, ip6Routing, ip6DestOpts, ip6AH, ip6Fragment:
		default:
			return ctl6ModelUpper(frame, off, next, r)
		}
		if i == maxExtHeaders {
			return tcActShot
		}
		if next == ip6Fragment {
			if off+4 > len(frame) {
				return tcActShot
			}
			if frame[off+2] != 0 || frame[off+3]&0xf8 != 0 {
				return tcActUnspec
			}
			next, off = frame[off], off+8
			continue
		}
		if off+2 > len(frame) {
			return tcActShot
		}
		n := int(frame[off+1])
		if next == ip6AH {
			next, off = frame[off], off+(n+2)*4
		} else {
			next, off = frame[off], off+(n+1)*8
		}
	}
}

func ctl6ModelUpper(frame []byte, off int, next byte, r ctl6Rules) int32 {
	switch next {
	case unix.IPPROTO_ICMPV6:
		if off+4 > len(frame) {
			return tcActShot
		}
		typ := frame[off]
		if bytes.IndexByte(r.icmp, typ) >= 0 {
			return tcActOK
		}
		if typ == icmp6NeighborSolicit && r.nsTarget != nil {
			if off+8+net.IPv6len > len(frame) {
				return tcActShot
			}
			if bytes.Equal(frame[off+8:off+8+net.IPv6len], r.nsTarget) {
				return tcActOK
			}
			return tcActUnspec
		}
		if typ == icmp6NeighborAdvert && r.copyNA != 0 {
			return tcActOK
		}
	case unix.IPPROTO_UDP:
		if off+4 > len(frame) {
			return tcActShot
		}
		port := binary.BigEndian.Uint16(frame[off+2:])
		for _, p := range r.ports {
			if p == port {
				return tcActOK
			}
		}
	}
	return tcActUnspec
}

// TestFilters6 checks that both sides match the same control traffic
// without extension headers (u32) and behind them (the classifier, at
// the next priority, direct-action).
func TestFilters6(t *testing.T) {
	prog := loadTestCtl6(t, tapRules6(testTapLL))
	for _, tc := range []struct {
		name      string
		fs        []netlink.Filter
		u32, bpf  uint16
		icmpTypes []uint8
		ports     []uint16
	}{
		{"tap", tapFilters6(7, testTapLL, prog), prioIPv6Local, prioIPv6Ext,
			[]uint8{icmp6RouterSolicit, icmp6RouterAdvert, icmp6Redirect, icmp6NeighborSolicit}, []uint16{546, 547}},
		{"link", linkFilters6(3, 7, prog), prioLinkIPv6, prioLinkIPv6Ext,
			[]uint8{icmp6RouterAdvert, icmp6Redirect, icmp6NeighborAdvert}, []uint16{546}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var icmpTypes []uint8
			var ports []uint16
			last := tc.fs[len(tc.fs)-1]
			for _, f := range tc.fs[:len(tc.fs)-1] {
				keys := u32Keys(t, f)
				if f.Attrs().Priority != tc.u32 || f.Attrs().Protocol != unix.ETH_P_IPV6 {
					t.Errorf("u32 filter attrs %+v", f.Attrs())
				}
				switch keys[0].Val >> 8 {
				case unix.IPPROTO_ICMPV6:
					icmpTypes = append(icmpTypes, uint8(keys[1].Val>>24))
				case unix.IPPROTO_UDP:
					ports = append(ports, uint16(keys[1].Val))
				}
			}
			slices.Sort(icmpTypes)
			slices.Sort(tc.icmpTypes)
			slices.Sort(ports)
			if !slices.Equal(icmpTypes, tc.icmpTypes) || !slices.Equal(ports, tc.ports) {
				t.Errorf("u32 matches icmpv6 %v and udp %v, want %v and %v", icmpTypes, ports, tc.icmpTypes, tc.ports)
			}
			b, ok := last.(*netlink.BpfFilter)
			if !ok || !b.DirectAction || b.Priority != tc.bpf || b.Protocol != unix.ETH_P_IPV6 || b.Fd != prog.FD() {
				t.Errorf("last filter %T %+v, want the classifier at priority %d", last, last, tc.bpf)
			}
		})
	}
}
