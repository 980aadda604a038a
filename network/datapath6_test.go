package network

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv6"
	"github.com/mdlayher/ndp"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// addIPv6Gateway gives pl's host side the pod prefix's first address
// and the pod a default route through it, as the bridge plugin does for
// an IPv6 range, and the host netns an address outside the prefix.
func (e *podEnv) addIPv6Gateway(pl podLink, octet int) (gw, remote net.IP) {
	t := e.t
	t.Helper()
	gw, remote = net.ParseIP(fmt.Sprintf("fd00:%d::1", octet)), net.ParseIP("fd00:77::1")
	hl, err := e.hostH.LinkByName(pl.hostName)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.hostH.AddrAdd(hl, &netlink.Addr{IPNet: &net.IPNet{IP: gw, Mask: net.CIDRMask(64, 128)}, Flags: unix.IFA_F_NODAD}); err != nil {
		t.Fatal(err)
	}
	lo, err := e.hostH.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	if err := e.hostH.AddrAdd(lo, &netlink.Addr{IPNet: &net.IPNet{IP: remote, Mask: net.CIDRMask(128, 128)}}); err != nil {
		t.Fatal(err)
	}
	l, err := e.podH.LinkByName(pl.name)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.podH.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: gw}); err != nil {
		t.Fatal(err)
	}
	return gw, remote
}

// ipv6Frame is an Ethernet frame with an IPv6 packet; a UDP payload gets
// its checksum, which IPv6 requires.
func ipv6Frame(dst, src net.HardwareAddr, srcIP, dstIP net.IP, next, hops byte, payload []byte) []byte {
	ip := make([]byte, 40, 40+len(payload))
	ip[0] = 0x60
	binary.BigEndian.PutUint16(ip[4:6], uint16(len(payload)))
	ip[6], ip[7] = next, hops
	copy(ip[8:24], srcIP.To16())
	copy(ip[24:40], dstIP.To16())
	payload = bytes.Clone(payload)
	if next == unix.IPPROTO_UDP {
		var sum uint32
		add := func(b []byte) {
			for i := 0; i < len(b); i += 2 {
				w := uint32(b[i]) << 8
				if i+1 < len(b) {
					w |= uint32(b[i+1])
				}
				sum += w
			}
		}
		add(ip[8:40])
		sum += uint32(len(payload)) + unix.IPPROTO_UDP
		add(payload)
		for sum > 0xffff {
			sum = sum>>16 + sum&0xffff
		}
		binary.BigEndian.PutUint16(payload[6:8], ^uint16(sum))
	}
	return ethFrame(dst, src, 0x86dd, append(ip, payload...))
}

func udp6(sport, dport uint16, payload []byte) []byte {
	b := make([]byte, 8, 8+len(payload))
	binary.BigEndian.PutUint16(b[0:2], sport)
	binary.BigEndian.PutUint16(b[2:4], dport)
	binary.BigEndian.PutUint16(b[4:6], uint16(8+len(payload)))
	return append(b, payload...)
}

// multicastMAC is the Ethernet address of an IPv6 multicast group.
func multicastMAC(group net.IP) net.HardwareAddr {
	g := group.To16()
	return net.HardwareAddr{0x33, 0x33, g[12], g[13], g[14], g[15]}
}

// frame6 is the little of an IPv6 frame the tests look at.
type frame6 struct {
	dst, src     net.HardwareAddr
	srcIP, dstIP net.IP
	next, hops   byte
	payload      []byte
}

func parseFrame6(b []byte) (frame6, bool) {
	if len(b) < 14+40 || binary.BigEndian.Uint16(b[12:14]) != 0x86dd {
		return frame6{}, false
	}
	ip := b[14:]
	end := 40 + int(binary.BigEndian.Uint16(ip[4:6]))
	if end > len(ip) {
		return frame6{}, false
	}
	return frame6{dst: b[0:6], src: b[6:12], srcIP: net.IP(ip[8:24]), dstIP: net.IP(ip[24:40]),
		next: ip[6], hops: ip[7], payload: ip[40:end]}, true
}

// guest6 plays an IPv6 guest on the tap: it answers neighbour
// solicitations for its addresses.
type guest6 struct {
	*guest
	ll, ip net.IP
}

// expect6 reads frames until match accepts an IPv6 one.
func (g *guest6) expect6(what string, match func(frame6) bool) frame6 {
	g.t.Helper()
	var got frame6
	g.read(what, func(frame []byte) bool {
		f, ok := parseFrame6(frame)
		if !ok {
			return false
		}
		if match(f) {
			got = f
			return true
		}
		if f.next == unix.IPPROTO_ICMPV6 && len(f.payload) > 0 && f.payload[0] == icmp6NeighborSolicit {
			g.answerNS(f)
		}
		return false
	})
	return got
}

func (g *guest6) answerNS(f frame6) {
	m, err := ndp.ParseMessage(f.payload)
	ns, ok := m.(*ndp.NeighborSolicitation)
	if err != nil || !ok {
		return
	}
	target := net.IP(ns.TargetAddress.AsSlice())
	if !target.Equal(g.ll) && !target.Equal(g.ip) {
		return
	}
	na := &ndp.NeighborAdvertisement{Solicited: true, Override: true, TargetAddress: ns.TargetAddress,
		Options: []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Target, Addr: g.mac}}}
	src, _ := netip.AddrFromSlice(target)
	dst, _ := netip.AddrFromSlice(f.srcIP)
	b, err := ndp.MarshalMessageChecksum(na, src, dst)
	if err != nil {
		g.t.Fatal(err)
	}
	g.send(ipv6Frame(f.src, g.mac, target, f.srcIP, unix.IPPROTO_ICMPV6, 255, b))
}

// TestSetupIPv6 plays an IPv6 guest on the tap of a dual-stack pod: the
// router advertisement and the DHCPv6 exchange give it the pod's
// address; its traffic to an address off the pod's prefix goes through
// the netns to the gateway; and no router discovery or DHCPv6 frame, the
// guest's or the responder's, reaches the host side.
func TestSetupIPv6(t *testing.T) {
	ctx := testCtx(t)
	e := newPodEnv(t)
	pl := e.addLink("eth0", 99, bridgeLike)
	_, remote := e.addIPv6Gateway(pl, 99)
	before := e.snapshot()
	n := e.setup(ctx)
	nic := n.NICs()[0]
	podIP := net.ParseIP("fd00:99::5")
	l6 := nic.Lease6
	if l6 == nil || !l6.IP.Equal(podIP) || !l6.Router || len(l6.OnLink) != 1 || l6.OnLink[0].String() != "fd00:99::/64" ||
		l6.MTU != 1400 || len(l6.DNS) != 1 || !l6.DNS[0].Equal(net.ParseIP("fd00::10")) {
		t.Fatalf("lease6 = %+v", l6)
	}
	tap, err := e.podH.LinkByName("vmtap0")
	if err != nil {
		t.Fatal(err)
	}
	router := eui64LinkLocal(tap.Attrs().HardwareAddr)
	g := &guest6{guest: &guest{t: t, tap: nic.Tap, mac: nic.MAC}, ll: eui64LinkLocal(nic.MAC), ip: podIP}
	sniff := e.sniff(pl.hostName)

	// Router discovery: the advertisement sent when the responder starts,
	// then the answer to a solicitation.
	g.expect6("unsolicited router advertisement", func(f frame6) bool {
		return f.next == unix.IPPROTO_ICMPV6 && len(f.payload) > 0 && f.payload[0] == icmp6RouterAdvert
	})
	rs := &ndp.RouterSolicitation{Options: []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Source, Addr: g.mac}}}
	allRouters := net.ParseIP("ff02::2")
	llAddr, _ := netip.AddrFromSlice(g.ll)
	b, err := ndp.MarshalMessageChecksum(rs, llAddr, netip.MustParseAddr("ff02::2"))
	if err != nil {
		t.Fatal(err)
	}
	g.send(ipv6Frame(multicastMAC(allRouters), g.mac, g.ll, allRouters, unix.IPPROTO_ICMPV6, 255, b))
	f := g.expect6("router advertisement", func(f frame6) bool {
		return f.next == unix.IPPROTO_ICMPV6 && len(f.payload) > 0 && f.payload[0] == icmp6RouterAdvert
	})
	m, err := ndp.ParseMessage(f.payload)
	if err != nil {
		t.Fatal(err)
	}
	ra := m.(*ndp.RouterAdvertisement)
	if !f.srcIP.Equal(router) || f.hops != 255 || f.src.String() != tap.Attrs().HardwareAddr.String() ||
		!ra.ManagedConfiguration || ra.RouterLifetime == 0 {
		t.Errorf("router advertisement from %s (%s), hop limit %d: %+v", f.srcIP, f.src, f.hops, ra)
	}
	var pio *ndp.PrefixInformation
	for _, o := range ra.Options {
		if p, ok := o.(*ndp.PrefixInformation); ok {
			pio = p
		}
	}
	if pio == nil || pio.Prefix.String() != "fd00:99::" || pio.PrefixLength != 64 || !pio.OnLink || pio.AutonomousAddressConfiguration {
		t.Errorf("prefix information %+v", pio)
	}

	// The router's address resolves to the tap, as a router's: a guest
	// drops its default route through a neighbour that says it is not.
	rtr, _ := netip.AddrFromSlice(router)
	snm, err := ndp.SolicitedNodeMulticast(rtr)
	if err != nil {
		t.Fatal(err)
	}
	ns := &ndp.NeighborSolicitation{TargetAddress: rtr, Options: []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Source, Addr: g.mac}}}
	if b, err = ndp.MarshalMessageChecksum(ns, llAddr, snm); err != nil {
		t.Fatal(err)
	}
	g.send(ipv6Frame(multicastMAC(net.IP(snm.AsSlice())), g.mac, g.ll, net.IP(snm.AsSlice()), unix.IPPROTO_ICMPV6, 255, b))
	f = g.expect6("neighbour advertisement for the router", func(f frame6) bool {
		return f.next == unix.IPPROTO_ICMPV6 && len(f.payload) > 0 && f.payload[0] == icmp6NeighborAdvert
	})
	if m, err := ndp.ParseMessage(f.payload); err != nil || !m.(*ndp.NeighborAdvertisement).Router ||
		m.(*ndp.NeighborAdvertisement).TargetAddress != rtr || f.src.String() != tap.Attrs().HardwareAddr.String() {
		t.Errorf("neighbour advertisement from %s: %+v, %v; want the router flag", f.src, m, err)
	}

	// DHCPv6: solicit, then request.
	sol, err := dhcpv6.NewSolicit(g.mac)
	if err != nil {
		t.Fatal(err)
	}
	allServers := net.ParseIP("ff02::1:2")
	g.send(ipv6Frame(multicastMAC(allServers), g.mac, g.ll, allServers, unix.IPPROTO_UDP, 1, udp6(546, 547, sol.ToBytes())))
	f = g.expect6("dhcpv6 advertise", func(f frame6) bool {
		return f.next == unix.IPPROTO_UDP && len(f.payload) > 8 && binary.BigEndian.Uint16(f.payload[2:4]) == 546
	})
	adv, err := dhcpv6.MessageFromBytes(f.payload[8:])
	if err != nil {
		t.Fatal(err)
	}
	if !f.srcIP.Equal(router) || !f.dstIP.Equal(g.ll) || adv.Type() != dhcpv6.MessageTypeAdvertise {
		t.Fatalf("dhcpv6 %s from %s to %s", adv.Type(), f.srcIP, f.dstIP)
	}
	if ia := adv.Options.OneIANA(); ia == nil || ia.Options.OneAddress() == nil || !ia.Options.OneAddress().IPv6Addr.Equal(podIP) {
		t.Errorf("advertise: %s", adv.Summary())
	}
	req, err := dhcpv6.NewRequestFromAdvertise(adv)
	if err != nil {
		t.Fatal(err)
	}
	g.send(ipv6Frame(multicastMAC(allServers), g.mac, g.ll, allServers, unix.IPPROTO_UDP, 1, udp6(546, 547, req.ToBytes())))
	f = g.expect6("dhcpv6 reply", func(f frame6) bool {
		return f.next == unix.IPPROTO_UDP && len(f.payload) > 8 && binary.BigEndian.Uint16(f.payload[2:4]) == 546
	})
	if reply, err := dhcpv6.MessageFromBytes(f.payload[8:]); err != nil || reply.Type() != dhcpv6.MessageTypeReply ||
		reply.Options.OneIANA() == nil || !reply.Options.OneIANA().Options.OneAddress().IPv6Addr.Equal(podIP) {
		t.Errorf("reply %v: %v", reply, err)
	}

	// The guest to an address off its prefix: through its router, the
	// netns, which resolves the gateway and forwards.
	hostConn := e.udpIn(e.host, "udp6", &net.UDPAddr{IP: remote, Port: 7011}, nil)
	g.send(ipv6Frame(tap.Attrs().HardwareAddr, g.mac, podIP, remote, unix.IPPROTO_UDP, 64, udp6(5011, 7011, []byte("hello routed"))))
	readUDP(t, hostConn, "hello routed", podIP)
	// And the answer comes straight back to the guest.
	if _, err := hostConn.WriteToUDP([]byte("hello back"), &net.UDPAddr{IP: podIP, Port: 5011}); err != nil {
		t.Fatal(err)
	}
	g.expect6("the routed reply", func(f frame6) bool {
		return f.next == unix.IPPROTO_UDP && f.dstIP.Equal(podIP) && bytes.HasSuffix(f.payload, []byte("hello back"))
	})

	for _, fr := range sniff.frames(300 * time.Millisecond) {
		f, ok := parseFrame6(fr)
		if !ok || len(f.payload) < 4 {
			continue
		}
		if f.next == unix.IPPROTO_ICMPV6 && (f.payload[0] == icmp6RouterSolicit || f.payload[0] == icmp6RouterAdvert) {
			t.Errorf("router discovery left the pod netns: %x", fr)
		}
		if port := binary.BigEndian.Uint16(f.payload[2:4]); f.next == unix.IPPROTO_UDP && (port == 546 || port == 547) {
			t.Errorf("dhcpv6 left the pod netns: %x", fr)
		}
	}
	if err := n.Teardown(ctx); err != nil {
		t.Fatal(err)
	}
	if after := e.snapshot(); after != before {
		t.Errorf("netns differs after teardown\n--- before\n%s\n--- after\n%s", before, after)
	}
}

// On a kernel without force_forwarding, Wire turns IPv6 forwarding on for
// the whole netns and undo puts back what each interface had.
func TestSetupIPv6ForwardingWholeNetns(t *testing.T) {
	ctx := testCtx(t)
	e := newPodEnv(t)
	e.addLink("eth0", 99, bridgeLike)
	forwarding := func(iface string) string {
		return strings.TrimSpace(e.podCmd("cat", sysctl6(iface, "forwarding")))
	}
	e.podCmd("sh", "-c", "echo 1 > "+sysctl6("lo", "forwarding"))
	old := haveForceForwarding
	haveForceForwarding = func() bool { return false }
	defer func() { haveForceForwarding = old }()
	e.settle()
	n := e.setup(ctx)
	if st := n.State(); st.Forwarding6["all"] != "0" || st.Forwarding6["lo"] != "1" || st.Forwarding6["eth0"] != "0" {
		t.Errorf("recorded forwarding %v", st.Forwarding6)
	}
	if got := forwarding("all"); got != "1" {
		t.Errorf("all.forwarding = %s while wired, want 1", got)
	}
	if err := n.Teardown(ctx); err != nil {
		t.Fatal(err)
	}
	for iface, want := range map[string]string{"all": "0", "default": "0", "lo": "1", "eth0": "0"} {
		if got := forwarding(iface); got != want {
			t.Errorf("%s.forwarding = %s after teardown, want %s", iface, got, want)
		}
	}
}

// A netns whose new interfaces start without IPv6 still gets a router
// on the tap when the CNI interface has IPv6.
func TestSetupIPv6NewLinksWithout(t *testing.T) {
	ctx := testCtx(t)
	e := newPodEnv(t)
	e.addLink("eth0", 99, bridgeLike)
	e.podCmd("sh", "-c", "echo 1 > "+sysctl6("default", "disable_ipv6"))
	e.settle()
	n := e.setup(ctx)
	if l := n.NICs()[0].Lease6; l == nil || !l.IP.Equal(net.ParseIP("fd00:99::5")) {
		t.Fatalf("lease6 %+v", l)
	}
	tap, err := e.podH.LinkByName("vmtap0")
	if err != nil {
		t.Fatal(err)
	}
	if addrs, _ := e.podH.AddrList(tap, netlink.FAMILY_V6); len(addrs) != 1 {
		t.Errorf("tap ipv6 addresses %v, want the router's", addrs)
	}
	if err := n.Teardown(ctx); err != nil {
		t.Fatal(err)
	}
}
