package network

import (
	"encoding/binary"
	"net"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// ICMPv6 message types (RFC 4861).
const (
	icmp6RouterSolicit   = 133
	icmp6RouterAdvert    = 134
	icmp6NeighborSolicit = 135
	icmp6NeighborAdvert  = 136
)

// nextHeaderKey matches IPv6 packets whose fixed header is followed
// directly by proto. u32 offsets are fixed, so a packet with extension
// headers does not match: the classifier of ctl6Program, at the next
// priority, walks their chain.
func nextHeaderKey(proto uint8) nl.TcU32Key {
	return nl.TcU32Key{Mask: 0x0000ff00, Val: uint32(proto) << 8, Off: 4}
}

// icmp6Keys match an ICMPv6 message of type typ.
func icmp6Keys(typ uint8) []nl.TcU32Key {
	return []nl.TcU32Key{
		nextHeaderKey(unix.IPPROTO_ICMPV6),
		{Mask: 0xff000000, Val: uint32(typ) << 24, Off: ipv6HeaderLen},
	}
}

// udp6PortKeys match a UDP datagram to port.
func udp6PortKeys(port uint16) []nl.TcU32Key {
	return []nl.TcU32Key{
		nextHeaderKey(unix.IPPROTO_UDP),
		{Mask: 0x0000ffff, Val: uint32(port), Off: ipv6HeaderLen},
	}
}

// pass6 is a u32 filter at prio that hands matching IPv6 packets to the
// netns stack alone.
func pass6(linkIndex int, prio uint16, keys []nl.TcU32Key) *netlink.U32 {
	return &netlink.U32{
		FilterAttrs: ingressAttrs(linkIndex, prio, unix.ETH_P_IPV6),
		ClassId:     passClass,
		Sel:         u32Sel(keys...),
	}
}

// ctl6U32 are the u32 filters at prio of r for packets without
// extension headers: each match goes up the netns stack alone, except
// that a neighbour advertisement is also copied to r.copyNA.
func ctl6U32(linkIndex int, prio uint16, r ctl6Rules) []netlink.Filter {
	var fs []netlink.Filter
	for _, typ := range r.icmp {
		fs = append(fs, pass6(linkIndex, prio, icmp6Keys(typ)))
	}
	for _, port := range r.ports {
		fs = append(fs, pass6(linkIndex, prio, udp6PortKeys(port)))
	}
	if r.nsTarget != nil {
		ns := icmp6Keys(icmp6NeighborSolicit)
		for i := 0; i < net.IPv6len; i += 4 {
			// The target address follows the ICMPv6 header and 4 reserved bytes.
			ns = append(ns, nl.TcU32Key{Mask: 0xffffffff, Val: binary.BigEndian.Uint32(r.nsTarget[i:]), Off: int32(ipv6HeaderLen + 8 + i)})
		}
		fs = append(fs, pass6(linkIndex, prio, ns))
	}
	if r.copyNA != 0 {
		fs = append(fs, &netlink.U32{
			FilterAttrs: ingressAttrs(linkIndex, prio, unix.ETH_P_IPV6),
			Sel:         u32Sel(icmp6Keys(icmp6NeighborAdvert)...),
			Actions: []netlink.Action{&netlink.MirredAction{
				// TC_ACT_OK after the copy: the frame also goes up the netns stack.
				ActionAttrs:  netlink.ActionAttrs{Action: netlink.TC_ACT_OK},
				MirredAction: netlink.TCA_EGRESS_MIRROR,
				Ifindex:      r.copyNA,
			}},
		})
	}
	return fs
}

// tapFilters6 keep the guest's IPv6 control traffic inside the netns
// (tapRules6): its router solicitations and DHCPv6 go to the responder
// and nowhere else, router advertisements, redirects and DHCPv6 replies
// it might send never reach the pod network, and its neighbour
// solicitations for the router's address (the tap's link-local address,
// tapLL) are answered by the netns alone. u32 filters match packets
// without extension headers; prog, the classifier of ctl6Program loaded
// for tapRules6(tapLL), matches the others, and drops the ambiguous.
func tapFilters6(tapIndex int, tapLL net.IP, prog *ebpf.Program) []netlink.Filter {
	r := tapRules6(tapLL)
	return append(ctl6U32(tapIndex, prioIPv6Local, r), ctl6Filter(tapIndex, prioIPv6Ext, prog))
}

// linkFilters6 keep the pod network's routers and DHCPv6 servers away
// from the guest, whose only ones are the responder's, and give the
// netns a copy of every neighbour advertisement: it routes the guest's
// traffic and must resolve its gateways, but the answers come to the MAC
// it shares with the guest (linkRules6). As on the tap, u32 filters
// match packets without extension headers, and prog, loaded for
// linkRules6(tapIndex), the others.
func linkFilters6(linkIndex, tapIndex int, prog *ebpf.Program) []netlink.Filter {
	r := linkRules6(tapIndex)
	return append(ctl6U32(linkIndex, prioLinkIPv6, r), ctl6Filter(linkIndex, prioLinkIPv6Ext, prog))
}
