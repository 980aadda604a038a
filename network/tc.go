package network

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"

	"github.com/containerd/errdefs"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// Filter priorities on a tap's ingress (frames the guest sends). Lower runs
// first; the first match decides. cls_u32 and act_mirred do most of it:
// they are in every kernel that has tc, while gact, flower and matchall may
// not be. A u32 match without actions ends classification with TC_ACT_OK,
// which hands the frame to the netns's own stack and nowhere else. IPv6
// control traffic behind extension headers needs cls_bpf (ctl6Program).
const (
	prioDHCP      = 1 // UDP to port 67: netns stack only (the responder's packet socket saw it already)
	prioARPLocal  = 2 // ARP for the tap's link-local address: netns stack only
	prioIPv6Local = 3 // router discovery, redirects, DHCPv6, neighbour discovery of the tap's address: netns stack only
	prioIPv6Ext   = 4 // the same behind IPv6 extension headers: netns stack only; ambiguous chains: dropped
	prioToNetns   = 5 // destination MAC is the tap's: netns stack only
	prioBroadcast = 6 // broadcast or multicast: copy to the CNI link, and to the netns stack
	prioToLink    = 7 // everything else: to the CNI link
)

// Filter priorities on a CNI link's ingress (frames from the pod network).
const (
	prioLinkDHCP    = 1 // UDP to port 68: never reaches the guest; its only DHCP server is ours
	prioLinkIPv6    = 2 // RAs, redirects and DHCPv6 replies: netns stack only; neighbour advertisements: both
	prioLinkIPv6Ext = 3 // the same behind IPv6 extension headers; ambiguous chains: dropped
	prioLinkARP     = 4 // ARP replies: copy to the tap, and to the netns stack
	prioLinkSocket  = 5 // TCP and UDP that a socket of the netns owns: netns stack only (sockProgram)
	prioLinkToVM    = 6 // everything else: to the tap
)

// arpReply is the ARP operation of a reply (RFC 826).
const arpReply = 2

// passClass (1:1) is the class a passing u32 match reports; clsact ignores
// it, but u32 needs a class or an action to end classification.
const passClass = 1<<16 | 1

// u32Sel returns a terminal u32 selector with the given keys.
func u32Sel(keys ...nl.TcU32Key) *nl.TcU32Sel {
	return &nl.TcU32Sel{Flags: nl.TC_U32_TERMINAL, Nkeys: uint8(len(keys)), Keys: keys}
}

func ingressAttrs(linkIndex int, prio, proto uint16) netlink.FilterAttrs {
	return netlink.FilterAttrs{
		LinkIndex: linkIndex,
		Parent:    netlink.HANDLE_MIN_INGRESS,
		Priority:  prio,
		Protocol:  proto,
	}
}

// udpPortFilters match IPv4 UDP datagrams (first fragments) to port, one
// filter for each possible IPv4 header length, since u32 offsets are fixed.
// With no action they end in the netns stack.
func udpPortFilters(linkIndex int, prio uint16, port uint16) []netlink.Filter {
	var fs []netlink.Filter
	for ihl := 5; ihl <= 15; ihl++ {
		fs = append(fs, &netlink.U32{
			FilterAttrs: ingressAttrs(linkIndex, prio, unix.ETH_P_IP),
			ClassId:     passClass,
			Sel: u32Sel(
				nl.TcU32Key{Mask: 0xff000000, Val: uint32(0x40|ihl) << 24, Off: 0}, // version 4, header length
				nl.TcU32Key{Mask: 0x00001fff, Val: 0, Off: 4},                      // fragment offset 0
				nl.TcU32Key{Mask: 0x00ff0000, Val: unix.IPPROTO_UDP << 16, Off: 8}, // protocol
				nl.TcU32Key{Mask: 0x0000ffff, Val: uint32(port), Off: int32(ihl * 4)},
			),
		})
	}
	return fs
}

// tapFilters is the ingress classification of a tap: frames from the guest.
// linkLocal is nil when the NIC has no IPv4 (no address to answer ARP for).
func tapFilters(tapIndex, linkIndex int, tapMAC net.HardwareAddr, linkLocal net.IP) ([]netlink.Filter, error) {
	if len(tapMAC) != 6 {
		return nil, fmt.Errorf("tap mac %q: %w", tapMAC, errdefs.ErrInvalidArgument)
	}
	fs := udpPortFilters(tapIndex, prioDHCP, 67)
	if ll := linkLocal.To4(); ll != nil {
		fs = append(fs, &netlink.U32{
			FilterAttrs: ingressAttrs(tapIndex, prioARPLocal, unix.ETH_P_ARP),
			ClassId:     passClass,
			// The ARP target protocol address sits 24 bytes into the ARP header.
			Sel: u32Sel(nl.TcU32Key{Mask: 0xffffffff, Val: binary.BigEndian.Uint32(ll), Off: 24}),
		})
	}
	// At ingress u32 offsets count from the network header; the destination
	// MAC starts 14 bytes before it. Keys are 32-bit words at offsets that
	// are multiples of 4: -16 holds 2 bytes before the MAC and its first 2.
	fs = append(fs,
		&netlink.U32{
			FilterAttrs: ingressAttrs(tapIndex, prioToNetns, unix.ETH_P_ALL),
			ClassId:     passClass,
			Sel: u32Sel(
				nl.TcU32Key{Mask: 0x0000ffff, Val: uint32(binary.BigEndian.Uint16(tapMAC[0:2])), Off: -16},
				nl.TcU32Key{Mask: 0xffffffff, Val: binary.BigEndian.Uint32(tapMAC[2:6]), Off: -12},
			),
		},
		&netlink.U32{
			FilterAttrs: ingressAttrs(tapIndex, prioBroadcast, unix.ETH_P_ALL),
			// The group bit of the destination MAC: broadcast and multicast.
			Sel: u32Sel(nl.TcU32Key{Mask: 0x00000100, Val: 0x00000100, Off: -16}),
			Actions: []netlink.Action{&netlink.MirredAction{
				// TC_ACT_OK after the copy: the frame also goes up the netns stack.
				ActionAttrs:  netlink.ActionAttrs{Action: netlink.TC_ACT_OK},
				MirredAction: netlink.TCA_EGRESS_MIRROR,
				Ifindex:      linkIndex,
			}},
		},
		&netlink.U32{
			FilterAttrs: ingressAttrs(tapIndex, prioToLink, unix.ETH_P_ALL),
			Sel:         u32Sel(nl.TcU32Key{}), // matches everything
			Actions:     []netlink.Action{netlink.NewMirredAction(linkIndex)},
		},
	)
	return fs, nil
}

// linkFilters is the ingress classification of a CNI link: frames from the
// pod network all go to the guest, except DHCP replies, which go nowhere,
// and ARP replies, which the netns gets too: the netns's own sockets
// send from the pod IP, which shares the guest's MAC, so the answers to
// the netns's requests come back with the guest's. The filters of the
// IPv6 control traffic (linkFilters6) and of the netns's sockets
// (sockFilter) sit between them.
func linkFilters(linkIndex, tapIndex int) []netlink.Filter {
	fs := udpPortFilters(linkIndex, prioLinkDHCP, 68)
	return append(fs, &netlink.U32{
		FilterAttrs: ingressAttrs(linkIndex, prioLinkARP, unix.ETH_P_ARP),
		// The operation is the low half of the ARP header's second word.
		Sel: u32Sel(nl.TcU32Key{Mask: 0x0000ffff, Val: arpReply, Off: 4}),
		Actions: []netlink.Action{&netlink.MirredAction{
			// TC_ACT_OK after the copy: the frame also goes up the netns stack.
			ActionAttrs:  netlink.ActionAttrs{Action: netlink.TC_ACT_OK},
			MirredAction: netlink.TCA_EGRESS_MIRROR,
			Ifindex:      tapIndex,
		}},
	}, &netlink.U32{
		FilterAttrs: ingressAttrs(linkIndex, prioLinkToVM, unix.ETH_P_ALL),
		Sel:         u32Sel(nl.TcU32Key{}),
		Actions:     []netlink.Action{netlink.NewMirredAction(tapIndex)},
	})
}

func clsact(linkIndex int) *netlink.Clsact {
	return &netlink.Clsact{QdiscAttrs: netlink.QdiscAttrs{
		LinkIndex: linkIndex,
		Handle:    netlink.MakeHandle(0xffff, 0),
		Parent:    netlink.HANDLE_CLSACT,
	}}
}

// hasIngress reports whether link already has an ingress or clsact qdisc.
func hasIngress(p *podNS, link netlink.Link) (bool, error) {
	qs, err := retryDump(func() ([]netlink.Qdisc, error) { return p.h.QdiscList(link) })
	if err != nil {
		return false, fmt.Errorf("list qdiscs of %s: %w", link.Attrs().Name, err)
	}
	for _, q := range qs {
		if q.Attrs().Parent == netlink.HANDLE_INGRESS {
			return true, nil
		}
	}
	return false, nil
}

// installIngress adds a clsact qdisc to link and the filters to it.
func installIngress(p *podNS, link netlink.Link, filters []netlink.Filter) error {
	name := link.Attrs().Name
	if err := p.h.QdiscAdd(clsact(link.Attrs().Index)); err != nil {
		return fmt.Errorf("add clsact qdisc to %s: %w", name, err)
	}
	for _, f := range filters {
		if err := p.h.FilterAdd(f); err != nil {
			return fmt.Errorf("add ingress filter (priority %d) to %s: %w", f.Attrs().Priority, name, err)
		}
	}
	return nil
}

// removeIngress deletes link's clsact qdisc and with it every filter Setup
// added. Setup refuses links that had an ingress qdisc of their own.
func removeIngress(p *podNS, link netlink.Link) error {
	qs, err := retryDump(func() ([]netlink.Qdisc, error) { return p.h.QdiscList(link) })
	if err != nil {
		return fmt.Errorf("list qdiscs of %s: %w", link.Attrs().Name, err)
	}
	for _, q := range qs {
		if q.Type() != "clsact" {
			continue
		}
		if err := p.h.QdiscDel(clsact(link.Attrs().Index)); err != nil && !isNotFound(err) && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("delete clsact qdisc of %s: %w", link.Attrs().Name, err)
		}
	}
	return nil
}
