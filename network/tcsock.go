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

// Offsets in the kernel's struct bpf_sock (include/uapi/linux/bpf.h).
const bpfSockState = 72 // __u32

// tcpListen is a listening socket's state (include/net/tcp_states.h).
const tcpListen = 10

// TCP header flags (RFC 9293).
const (
	tcpFlagRST = 0x04
	tcpFlagSYN = 0x02
	tcpFlagACK = 0x10
)

// tcpFlagsOff is where the TCP header holds its flags.
const tcpFlagsOff = 13

// currentNetns (BPF_F_CURRENT_NETNS) has a socket lookup search the
// netns of the packet's device.
const currentNetns = -1

// Stack frame of sockProgram, from the frame pointer. The tuples are
// struct bpf_sock_tuple: the source and destination addresses, then
// the ports, in network order. Each is read from the packet as it
// lies, the addresses from the IP header and the ports, with the TCP
// flags, from the upper-layer header. fp-8 is walkStep's.
const (
	sockIP4Hdr = -64             // the IPv4 header's first 20 bytes
	sockTuple4 = sockIP4Hdr + 12 // its addresses, then the ports
	sockL4v4   = sockIP4Hdr + 20 // the first 14 bytes of a TCP header, or 4 of a UDP one
	sockTuple6 = -56             // the IPv6 addresses, then the ports
	sockL4v6   = sockTuple6 + 32
	tuple4Len  = 12 // sizeof(bpf_sock_tuple.ipv4)
	tuple6Len  = 36 // sizeof(bpf_sock_tuple.ipv6)
)

// sockFilter is the direct-action cls_bpf filter that runs prog
// (sockProgram) on every frame arriving on linkIndex, after the control
// traffic's filters and before the redirect to the guest. As with
// ctl6Filter, the kernel holds the program once the filter is added,
// and deleting the clsact qdisc removes both.
func sockFilter(linkIndex int, prog *ebpf.Program) *netlink.BpfFilter {
	return &netlink.BpfFilter{
		FilterAttrs:  ingressAttrs(linkIndex, prioLinkSocket, unix.ETH_P_ALL),
		ClassId:      passClass,
		Fd:           prog.FD(),
		Name:         "vmshim_sock",
		DirectAction: true,
	}
}

// loadSock loads the classifier of a CNI link whose addresses are
// addrs4 and addrs6.
func loadSock(addrs4, addrs6 []net.IP) (*ebpf.Program, error) {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:         "vmshim_sock",
		Type:         ebpf.SchedCLS,
		Instructions: sockProgram(addrs4, addrs6),
		License:      "Dual MIT/GPL",
	})
	if err != nil {
		return nil, fmt.Errorf("load socket classifier: %w", err)
	}
	return prog, nil
}

// sockProgram is a direct-action tc classifier of the frames that
// arrive on a CNI link (from their MAC header). A TCP segment or UDP
// datagram to one of the link's addresses (addrs4, addrs6) that a
// socket of the netns owns goes up the netns stack (tcActOK):
//
//   - TCP: a connection of the netns (established, being opened, or in
//     TIME_WAIT: bpf_skc_lookup_tcp finds them by the exact tuple), or a
//     SYN without ACK to a port the netns listens on at that address or
//     at a wildcard. Any other segment to a listening port still belongs
//     to the guest, whose own connections may use the same port;
//   - UDP: a socket bound to the port at that address or a wildcard,
//     or connected to the sender (bpf_sk_lookup_udp).
//
// Everything else gets no verdict (tcActUnspec), and the filters after
// it send it to the guest, as before: other protocols, other addresses
// (broadcast, multicast), a frame with a VLAN tag, fragments (the
// netns would never see the rest), an IPv6 chain of more than
// maxExtHeaders headers, and anything cut short. Each packet costs at
// most one socket lookup, whose reference is released at once.
func sockProgram(addrs4, addrs6 []net.IP) asm.Instructions {
	// Loads read network-order bytes in host order; so are the constants.
	ip4 := int32(binary.NativeEndian.Uint16([]byte{0x08, 0x00}))
	ip6 := int32(binary.NativeEndian.Uint16([]byte{0x86, 0xdd}))
	if len(addrs4) == 0 && len(addrs6) == 0 {
		return asm.Instructions{asm.Mov.Imm(asm.R0, tcActUnspec), asm.Return()}
	}
	insns := asm.Instructions{
		asm.Mov.Reg(regSkb, asm.R1),
		asm.LoadMem(asm.R2, regSkb, skbVlanPresent, asm.Word),
		asm.JNE.Imm32(asm.R2, 0, "next"),
		asm.LoadMem(asm.R2, regSkb, skbProtocol, asm.Word),
	}
	if len(addrs4) > 0 {
		insns = append(insns, asm.JEq.Imm32(asm.R2, ip4, "ip4"))
	}
	if len(addrs6) > 0 {
		insns = append(insns, asm.JEq.Imm32(asm.R2, ip6, "ip6"))
	}
	insns = append(insns, asm.Ja.Label("next"))
	if len(addrs4) > 0 {
		insns = append(insns, sockIPv4(addrs4)...)
	}
	if len(addrs6) > 0 {
		insns = append(insns, sockIPv6(addrs6)...)
	}
	return append(insns,
		asm.Mov.Imm(asm.R0, tcActOK).WithSymbol("pass"),
		asm.Return(),
		asm.Mov.Imm(asm.R0, tcActUnspec).WithSymbol("next"),
		asm.Return(),
	)
}

// sockIPv4 reads an IPv4 packet's header and, for an unfragmented
// packet to one of addrs, its TCP or UDP ports.
func sockIPv4(addrs []net.IP) asm.Instructions {
	hdr := loadAt(etherHeaderLen, sockIP4Hdr, ipv4HeaderLen, "next")
	hdr[0] = hdr[0].WithSymbol("ip4")
	insns := append(hdr,
		// Version 4, and a header length of at least 5 words, which
		// places the upper-layer header.
		asm.LoadMem(asm.R2, asm.RFP, sockIP4Hdr, asm.Byte),
		asm.Mov.Reg(asm.R3, asm.R2),
		asm.And.Imm(asm.R3, 0xf0),
		asm.JNE.Imm(asm.R3, 0x40, "next"),
		asm.And.Imm(asm.R2, 0x0f),
		asm.JLT.Imm(asm.R2, 5, "next"),
		asm.LSh.Imm(asm.R2, 2),
		asm.Add.Imm(asm.R2, etherHeaderLen),
		asm.Mov.Reg(regOff, asm.R2),
		// More fragments, or a fragment offset: a fragment.
		asm.LoadMem(asm.R2, asm.RFP, sockIP4Hdr+6, asm.Byte),
		asm.And.Imm(asm.R2, 0x3f),
		asm.JNE.Imm(asm.R2, 0, "next"),
		asm.LoadMem(asm.R2, asm.RFP, sockIP4Hdr+7, asm.Byte),
		asm.JNE.Imm(asm.R2, 0, "next"),
		asm.LoadMem(asm.R2, asm.RFP, sockIP4Hdr+16, asm.Word),
	)
	for _, a := range addrs {
		insns = append(insns, asm.JEq.Imm32(asm.R2, int32(binary.NativeEndian.Uint32(a.To4())), "dst4"))
	}
	insns = append(insns,
		asm.Ja.Label("next"),
		asm.LoadMem(regNext, asm.RFP, sockIP4Hdr+9, asm.Byte).WithSymbol("dst4"),
		asm.JEq.Imm(regNext, unix.IPPROTO_TCP, "tcp4"),
		asm.JEq.Imm(regNext, unix.IPPROTO_UDP, "udp4"),
		asm.Ja.Label("next"),
	)
	insns = append(insns, sockLookupTCP("tcp4", sockTuple4, tuple4Len, sockL4v4)...)
	return append(insns, sockLookupUDP("udp4", sockTuple4, tuple4Len, sockL4v4)...)
}

// sockIPv6 reads an IPv6 packet's addresses and, for a packet to one of
// addrs, walks its extension headers (walkStep, as ctl6Program does) to
// its TCP or UDP ports.
func sockIPv6(addrs []net.IP) asm.Instructions {
	hdr := loadAt(etherHeaderLen+8, sockTuple6, 2*net.IPv6len, "next")
	hdr[0] = hdr[0].WithSymbol("ip6")
	insns := hdr
	// Address i's comparison starts at dst6addr<i>; a mismatch goes on
	// to the next one's.
	for i, a := range addrs {
		for w := 0; w < net.IPv6len; w += 4 {
			ld := asm.LoadMem(asm.R2, asm.RFP, int16(sockTuple6+net.IPv6len+w), asm.Word)
			if w == 0 && i > 0 {
				ld = ld.WithSymbol(fmt.Sprintf("dst6addr%d", i))
			}
			insns = append(insns, ld,
				asm.JNE.Imm32(asm.R2, int32(binary.NativeEndian.Uint32(a.To16()[w:w+4])), fmt.Sprintf("dst6addr%d", i+1)))
		}
		insns = append(insns, asm.Ja.Label("dst6"))
	}
	insns = append(insns, asm.Ja.Label("next").WithSymbol(fmt.Sprintf("dst6addr%d", len(addrs))))
	next := loadAt(etherHeaderLen+6, -8, 1, "next")
	next[0] = next[0].WithSymbol("dst6")
	insns = append(insns, next...)
	insns = append(insns,
		asm.LoadMem(regNext, asm.RFP, -8, asm.Byte),
		asm.Mov.Imm(regOff, etherHeaderLen+ipv6HeaderLen),
	)
	for i := 0; i < maxExtHeaders; i++ {
		insns = append(insns, walkStep(i, "next", false)...)
	}
	// Past the bound: an extension header still to walk.
	insns = append(insns,
		asm.JEq.Imm(regNext, ip6HopByHop, "next").WithSymbol(fmt.Sprintf("hdr%d", maxExtHeaders)),
		asm.JEq.Imm(regNext, ip6Routing, "next"),
		asm.JEq.Imm(regNext, ip6Fragment, "next"),
		asm.JEq.Imm(regNext, ip6AH, "next"),
		asm.JEq.Imm(regNext, ip6DestOpts, "next"),
		asm.JEq.Imm(regNext, unix.IPPROTO_TCP, "tcp6").WithSymbol("upper"),
		asm.JEq.Imm(regNext, unix.IPPROTO_UDP, "udp6"),
		asm.Ja.Label("next"),
	)
	insns = append(insns, sockLookupTCP("tcp6", sockTuple6, tuple6Len, sockL4v6)...)
	return append(insns, sockLookupUDP("udp6", sockTuple6, tuple6Len, sockL4v6)...)
}

// sockLookupTCP, at label, reads the ports and flags of the TCP header at
// regOff to l4, completing the tuple at fp+tuple, and looks the
// connection up.
func sockLookupTCP(label string, tuple int16, size int32, l4 int16) asm.Instructions {
	insns := loadRel(0, l4, tcpFlagsOff+1, "next")
	insns[0] = insns[0].WithSymbol(label)
	insns = append(insns, sockLookup(asm.FnSkcLookupTcp, tuple, size)...)
	return append(insns,
		asm.LoadMem(regOff, asm.R0, bpfSockState, asm.Word),
		asm.Mov.Reg(asm.R1, asm.R0),
		asm.FnSkRelease.Call(),
		asm.JNE.Imm(regOff, tcpListen, "pass"),
		// A listener takes only what opens a connection.
		asm.LoadMem(asm.R2, asm.RFP, l4+tcpFlagsOff, asm.Byte),
		asm.And.Imm(asm.R2, tcpFlagSYN|tcpFlagACK|tcpFlagRST),
		asm.JEq.Imm(asm.R2, tcpFlagSYN, "pass"),
		asm.Ja.Label("next"),
	)
}

// sockLookupUDP, at label, reads the ports of the UDP header at regOff
// to l4 and looks for a socket that takes the datagram.
func sockLookupUDP(label string, tuple int16, size int32, l4 int16) asm.Instructions {
	insns := loadRel(0, l4, 4, "next")
	insns[0] = insns[0].WithSymbol(label)
	insns = append(insns, sockLookup(asm.FnSkLookupUdp, tuple, size)...)
	return append(insns,
		asm.Mov.Reg(asm.R1, asm.R0),
		asm.FnSkRelease.Call(),
		asm.Ja.Label("pass"),
	)
}

// sockLookup calls fn(skb, fp+tuple, size, currentNetns, 0); no socket
// jumps to "next". The caller releases the one found, in R0.
func sockLookup(fn asm.BuiltinFunc, tuple int16, size int32) asm.Instructions {
	return asm.Instructions{
		asm.Mov.Reg(asm.R1, regSkb),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, int32(tuple)),
		asm.Mov.Imm(asm.R3, size),
		asm.Mov.Imm(asm.R4, currentNetns),
		asm.Mov.Imm(asm.R5, 0),
		fn.Call(),
		asm.JEq.Imm(asm.R0, 0, "next"),
	}
}
