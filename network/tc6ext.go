package network

import (
	"encoding/binary"
	"fmt"
	"net"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Verdicts of a direct-action tc classifier (include/uapi/linux/pkt_cls.h).
const (
	tcActUnspec = -1 // no verdict: the next filter decides
	tcActOK     = 0  // the frame goes up the netns stack, and nowhere else
	tcActShot   = 2  // the frame is dropped
)

// IPv6 extension headers the classifier walks (RFC 8200, RFC 4302).
const (
	ip6HopByHop = 0
	ip6Routing  = 43
	ip6Fragment = 44
	ip6AH       = 51
	ip6DestOpts = 60
)

// maxExtHeaders is how many extension headers the classifier walks. A
// packet whose chain is longer is dropped: Linux itself gives up on
// chains far shorter than the packet allows, and no real traffic of a
// pod carries more than a few.
const maxExtHeaders = 8

// icmp6Redirect is the ICMPv6 type of a redirect (RFC 4861).
const icmp6Redirect = 137

// ctl6Rules are what one direction of a NIC does with IPv6 control
// traffic: those matches go up the netns stack alone instead of
// crossing to the other side. Both the u32 filters (packets without
// extension headers) and the classifier (packets with them) are built
// from them, so the two paths cannot disagree.
type ctl6Rules struct {
	icmp     []uint8  // ICMPv6 types
	ports    []uint16 // UDP destination ports
	nsTarget net.IP   // neighbour solicitations for this target; nil: none
	copyNA   int      // ifindex that also gets a copy of every neighbour advertisement; 0: none
}

// tapRules6 hold the guest's router discovery, redirects and DHCPv6 in
// the netns, where the responder is, and keep its neighbour
// solicitations for the router's address (the tap's, tapLL) there.
func tapRules6(tapLL net.IP) ctl6Rules {
	return ctl6Rules{
		icmp:     []uint8{icmp6RouterSolicit, icmp6RouterAdvert, icmp6Redirect},
		ports:    []uint16{dhcp6ServerPort, dhcp6ClientPort},
		nsTarget: tapLL.To16(),
	}
}

// linkRules6 keep the pod network's router advertisements, redirects and
// DHCPv6 replies away from the guest, whose only router and DHCPv6
// server are the netns's, and give the tap a copy of every neighbour
// advertisement.
func linkRules6(tapIndex int) ctl6Rules {
	return ctl6Rules{
		icmp:   []uint8{icmp6RouterAdvert, icmp6Redirect},
		ports:  []uint16{dhcp6ClientPort},
		copyNA: tapIndex,
	}
}

// ctl6Filter is the direct-action cls_bpf filter at prio that runs prog
// (ctl6Program) on the IPv6 frames arriving on linkIndex. The kernel
// holds the program once the filter is added; deleting the clsact qdisc
// removes both.
func ctl6Filter(linkIndex int, prio uint16, prog *ebpf.Program) *netlink.BpfFilter {
	return &netlink.BpfFilter{
		FilterAttrs:  ingressAttrs(linkIndex, prio, unix.ETH_P_IPV6),
		ClassId:      passClass,
		Fd:           prog.FD(),
		Name:         "vmshim_ctl6",
		DirectAction: true,
	}
}

// loadCtl6 loads the classifier of r.
func loadCtl6(r ctl6Rules) (*ebpf.Program, error) {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:         "vmshim_ctl6",
		Type:         ebpf.SchedCLS,
		Instructions: ctl6Program(r),
		License:      "Dual MIT/GPL",
	})
	if err != nil {
		return nil, fmt.Errorf("load ipv6 control classifier: %w", err)
	}
	return prog, nil
}

// Registers of ctl6Program; R6 to R9 survive helper calls.
const (
	regSkb  = asm.R6 // the __sk_buff
	regOff  = asm.R7 // frame offset of the header being read
	regNext = asm.R8 // its protocol number
)

// ctl6Program is a direct-action tc classifier of IPv6 frames (from
// their MAC header, as tc ingress sees them). It walks the extension
// header chain, up to maxExtHeaders headers, to the upper-layer header,
// and hands a match of r to the netns stack alone (tcActOK); everything
// else gets no verdict (tcActUnspec), and the filters after it send it
// on as ordinary traffic. Ambiguous packets are dropped (tcActShot):
//
//   - a chain longer than maxExtHeaders;
//   - a chain cut short by the end of the frame, before the upper-layer
//     header, or an ICMPv6 or UDP header (first 4 bytes) missing from it,
//     or a neighbour solicitation without its target. In a first fragment
//     this is a chain that does not fit, which RFC 7112 forbids.
//
// A fragment other than the first (offset not 0) carries no header of
// the chain past the fragment header, so it gets no verdict: ordinary
// fragmented traffic still flows. A control message cannot be smuggled
// through in such fragments, since its first fragment, which holds the
// chain and the upper-layer header, is classified like a whole packet;
// without it nothing reassembles (receivers discard overlapping
// fragments, RFC 5722, as Linux does).
//
// The walk is unrolled: no loop for the verifier to bound.
func ctl6Program(r ctl6Rules) asm.Instructions {
	insns := asm.Instructions{
		asm.Mov.Reg(regSkb, asm.R1),
	}
	// The fixed header's Next Header field.
	insns = append(insns, loadAt(etherHeaderLen+6, -8, 1, "next")...)
	insns = append(insns,
		asm.LoadMem(regNext, asm.RFP, -8, asm.Byte),
		asm.Mov.Imm(regOff, etherHeaderLen+ipv6HeaderLen),
	)
	for i := 0; i < maxExtHeaders; i++ {
		insns = append(insns, walkStep(i, "drop", true)...)
	}
	// Past the bound: an extension header still to walk is ambiguous.
	last := fmt.Sprintf("hdr%d", maxExtHeaders)
	insns = append(insns,
		asm.JEq.Imm(regNext, ip6HopByHop, "drop").WithSymbol(last),
		asm.JEq.Imm(regNext, ip6Routing, "drop"),
		asm.JEq.Imm(regNext, ip6Fragment, "drop"),
		asm.JEq.Imm(regNext, ip6AH, "drop"),
		asm.JEq.Imm(regNext, ip6DestOpts, "drop"),
	)
	insns = append(insns, upperLayer(r)...)
	return append(insns,
		asm.Mov.Imm(asm.R0, tcActOK).WithSymbol("pass"),
		asm.Return(),
		asm.Mov.Imm(asm.R0, tcActUnspec).WithSymbol("next"),
		asm.Return(),
		asm.Mov.Imm(asm.R0, tcActShot).WithSymbol("drop"),
		asm.Return(),
	)
}

// loadAt copies n bytes of the frame at off to the stack at fp+stack; a
// frame too short jumps to fail.
func loadAt(off int32, stack int16, n int32, fail string) asm.Instructions {
	return loadBytes(asm.Mov.Imm(asm.R2, off), nil, stack, n, fail)
}

// loadRel is loadAt at off bytes past regOff.
func loadRel(off int32, stack int16, n int32, fail string) asm.Instructions {
	return loadBytes(asm.Mov.Reg(asm.R2, regOff), asm.Instructions{asm.Add.Imm(asm.R2, off)}, stack, n, fail)
}

// loadBytes calls bpf_skb_load_bytes(skb, R2, fp+stack, n), R2 set by
// setOff and adjust.
func loadBytes(setOff asm.Instruction, adjust asm.Instructions, stack int16, n int32, fail string) asm.Instructions {
	insns := asm.Instructions{asm.Mov.Reg(asm.R1, regSkb), setOff}
	insns = append(insns, adjust...)
	return append(insns,
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, int32(stack)),
		asm.Mov.Imm(asm.R4, n),
		asm.FnSkbLoadBytes.Call(),
		asm.JNE.Imm(asm.R0, 0, fail),
	)
}

// walkStep is header i of the chain: an extension header moves regOff
// past itself and regNext to what follows it; anything else is the
// upper layer. A header cut short by the end of the frame jumps to cut.
// With firstFragments, a fragment header of a first fragment is walked
// past and any other fragment jumps to "next"; without, every fragment
// does.
func walkStep(i int, cut string, firstFragments bool) asm.Instructions {
	sym := func(s string) string { return fmt.Sprintf("%s%d", s, i) }
	insns := asm.Instructions{
		asm.JEq.Imm(regNext, ip6HopByHop, sym("ext")).WithSymbol(sym("hdr")),
		asm.JEq.Imm(regNext, ip6Routing, sym("ext")),
		asm.JEq.Imm(regNext, ip6DestOpts, sym("ext")),
		asm.JEq.Imm(regNext, ip6AH, sym("ah")),
		asm.JEq.Imm(regNext, ip6Fragment, sym("frag")),
		asm.Ja.Label("upper"),
	}
	// Hop-by-Hop, Routing, Destination Options: Next Header, then the
	// length in 8-octet units, not counting the first 8 octets.
	ext := loadRel(0, -8, 2, cut)
	ext[0] = ext[0].WithSymbol(sym("ext"))
	insns = append(insns, ext...)
	insns = append(insns,
		asm.LoadMem(asm.R2, asm.RFP, -7, asm.Byte),
		asm.Add.Imm(asm.R2, 1),
		asm.LSh.Imm(asm.R2, 3),
		asm.Ja.Label(sym("len")),
	)
	// AH: the length is in 4-octet units, minus 2.
	ah := loadRel(0, -8, 2, cut)
	ah[0] = ah[0].WithSymbol(sym("ah"))
	insns = append(insns, ah...)
	insns = append(insns,
		asm.LoadMem(asm.R2, asm.RFP, -7, asm.Byte),
		asm.Add.Imm(asm.R2, 2),
		asm.LSh.Imm(asm.R2, 2),
		asm.LoadMem(regNext, asm.RFP, -8, asm.Byte).WithSymbol(sym("len")),
		asm.Add.Reg(regOff, asm.R2),
		asm.Ja.Label(fmt.Sprintf("hdr%d", i+1)),
	)
	if !firstFragments {
		return append(insns, asm.Ja.Label("next").WithSymbol(sym("frag")))
	}
	// Fragment: 8 octets; bytes 2 and 3 hold the offset in their top 13
	// bits. Past a fragment that is not the first there is no header.
	frag := loadRel(0, -8, 4, cut)
	frag[0] = frag[0].WithSymbol(sym("frag"))
	insns = append(insns, frag...)
	return append(insns,
		asm.LoadMem(asm.R2, asm.RFP, -6, asm.Byte),
		asm.JNE.Imm(asm.R2, 0, "next"),
		asm.LoadMem(asm.R2, asm.RFP, -5, asm.Byte),
		asm.And.Imm(asm.R2, 0xf8),
		asm.JNE.Imm(asm.R2, 0, "next"),
		asm.LoadMem(regNext, asm.RFP, -8, asm.Byte),
		asm.Add.Imm(regOff, 8),
		asm.Ja.Label(fmt.Sprintf("hdr%d", i+1)),
	)
}

// upperLayer classifies the upper-layer header at regOff, of protocol
// regNext, by r.
func upperLayer(r ctl6Rules) asm.Instructions {
	insns := asm.Instructions{
		asm.JEq.Imm(regNext, unix.IPPROTO_ICMPV6, "icmp").WithSymbol("upper"),
		asm.JEq.Imm(regNext, unix.IPPROTO_UDP, "udp"),
		asm.Ja.Label("next"),
	}
	icmp := loadRel(0, -8, 4, "drop")
	icmp[0] = icmp[0].WithSymbol("icmp")
	insns = append(insns, icmp...)
	insns = append(insns, asm.LoadMem(asm.R2, asm.RFP, -8, asm.Byte))
	for _, typ := range r.icmp {
		insns = append(insns, asm.JEq.Imm(asm.R2, int32(typ), "pass"))
	}
	if r.nsTarget != nil {
		insns = append(insns, asm.JEq.Imm(asm.R2, icmp6NeighborSolicit, "ns"))
	}
	if r.copyNA != 0 {
		insns = append(insns, asm.JEq.Imm(asm.R2, icmp6NeighborAdvert, "na"))
	}
	insns = append(insns, asm.Ja.Label("next"))
	if r.nsTarget != nil {
		// The target follows the ICMPv6 header and 4 reserved bytes.
		ns := loadRel(8, -24, net.IPv6len, "drop")
		ns[0] = ns[0].WithSymbol("ns")
		insns = append(insns, ns...)
		for i := 0; i < net.IPv6len; i += 4 {
			// Loads read network-order bytes in host order; so is the constant.
			want := int32(binary.NativeEndian.Uint32(r.nsTarget[i : i+4]))
			insns = append(insns,
				asm.LoadMem(asm.R2, asm.RFP, int16(-24+i), asm.Word),
				asm.JNE.Imm32(asm.R2, want, "next"),
			)
		}
		insns = append(insns, asm.Ja.Label("pass"))
	}
	if r.copyNA != 0 {
		// bpf_clone_redirect(skb, copyNA, 0): a copy out of that link,
		// as mirred's egress mirror; the frame itself goes up the stack.
		insns = append(insns,
			asm.Mov.Reg(asm.R1, regSkb).WithSymbol("na"),
			asm.Mov.Imm(asm.R2, int32(r.copyNA)),
			asm.Mov.Imm(asm.R3, 0),
			asm.FnCloneRedirect.Call(),
			asm.Ja.Label("pass"),
		)
	}
	// UDP: the destination port, in bytes 2 and 3.
	udp := loadRel(0, -8, 4, "drop")
	udp[0] = udp[0].WithSymbol("udp")
	insns = append(insns, udp...)
	insns = append(insns,
		asm.LoadMem(asm.R2, asm.RFP, -6, asm.Byte),
		asm.LSh.Imm(asm.R2, 8),
		asm.LoadMem(asm.R3, asm.RFP, -5, asm.Byte),
		asm.Or.Reg(asm.R2, asm.R3),
	)
	for _, port := range r.ports {
		insns = append(insns, asm.JEq.Imm(asm.R2, int32(port), "pass"))
	}
	return append(insns, asm.Ja.Label("next"))
}
