package network

import (
	"encoding/binary"
	"fmt"
	"net"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// TCX verdicts (include/uapi/linux/bpf.h).
const (
	tcxNext = -1 // run the next program, then the clsact filters
	tcxPass = 0  // skip the clsact filters: the frame goes up the netns stack
)

// Offsets in the kernel's struct __sk_buff (include/uapi/linux/bpf.h).
const (
	skbPktType     = 4  // __u32
	skbProtocol    = 16 // __u32 holding a __be16
	skbVlanPresent = 20 // __u32
)

// frameIPv4Dst is where an untagged Ethernet frame carries the IPv4
// destination address. A tc program sees the frame from its MAC header.
const frameIPv4Dst = etherHeaderLen + 16

// steerReplies makes the guest's packets to the relay's source address
// reach the netns stack, however the guest routes them.
//
// The relay dials the guest from the tap's link-local address. A guest
// that applied the classless routes (DHCP option 121) reaches it on-link:
// it asks ARP for it, the netns answers with the tap's MAC, and the tap's
// clsact filters pass the frames to the netns stack. A guest that applied
// only the router option (3) sends them to its default router's MAC: the
// filters would send them out the CNI interface, where nothing answers,
// and the netns stack would drop them anyway as meant for another host.
// The program attached here (TCX, on the tap's ingress, before the clsact
// filters) hands every IPv4 packet to that address to the netns stack as
// addressed to it. The address is the netns's own and exists nowhere
// else, so no other traffic is affected.
//
// It returns the relay's source address. Like the sk_lookup program, the
// program is held only by the link's fd and is detached by Close, by the
// tap's deletion, or by the process dying.
func (f *forwarder) steerReplies() (net.IP, error) {
	guest := f.guest().IP
	routes, err := f.p.h.RouteGet(guest)
	if err != nil {
		return nil, fmt.Errorf("route to guest %s in netns %s: %w", guest, f.p.path, err)
	}
	if len(routes) == 0 || routes[0].Src.To4() == nil {
		return nil, fmt.Errorf("route to guest %s in netns %s has no ipv4 source: %w", guest, f.p.path, errdefs.ErrNotFound)
	}
	src := routes[0].Src.To4()
	tap, err := f.p.h.LinkByIndex(routes[0].LinkIndex)
	if err != nil {
		return nil, fmt.Errorf("find the link to guest %s: %w", guest, err)
	}
	if !isOwnTap(tap) {
		return nil, fmt.Errorf("route to guest %s goes through %s, not a tap of ours: %w", guest, tap.Attrs().Name, errdefs.ErrFailedPrecondition)
	}
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:         "vmshim_reply",
		Type:         ebpf.SchedCLS,
		AttachType:   ebpf.AttachTCXIngress,
		Instructions: replyProgram(src),
		License:      "Dual MIT/GPL",
	})
	if err != nil {
		return nil, fmt.Errorf("load tc program: %w", err)
	}
	var l link.Link
	// The kernel reads the interface index in the caller's netns.
	err = f.p.do(func() error {
		var err error
		l, err = link.AttachTCX(link.TCXOptions{
			Interface: tap.Attrs().Index, Program: prog, Attach: ebpf.AttachTCXIngress,
		})
		return err
	})
	if err != nil {
		_ = prog.Close()
		return nil, fmt.Errorf("attach tc program to the ingress of %s (tcx, linux 6.6 or later): %w", tap.Attrs().Name, err)
	}
	f.replyProg, f.replyLink = prog, l
	return src, nil
}

// replyProgram is the TCX ingress program of steerReplies: an untagged
// IPv4 frame to dst goes up the netns stack, marked as addressed to this
// host if it was sent to another MAC; any other frame goes on to the
// clsact filters.
func replyProgram(dst net.IP) asm.Instructions {
	// Loads read network-order bytes in host order; so are the constants.
	ip4 := int32(binary.NativeEndian.Uint16([]byte{0x08, 0x00}))
	addr := int32(binary.NativeEndian.Uint32(dst.To4()))
	return asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.LoadMem(asm.R2, asm.R6, skbProtocol, asm.Word),
		asm.JNE.Imm32(asm.R2, ip4, "next"),
		asm.LoadMem(asm.R2, asm.R6, skbVlanPresent, asm.Word),
		asm.JNE.Imm32(asm.R2, 0, "next"),

		// bpf_skb_load_bytes(skb, frameIPv4Dst, fp-4, 4)
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.Mov.Imm(asm.R2, frameIPv4Dst),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, -4),
		asm.Mov.Imm(asm.R4, 4),
		asm.FnSkbLoadBytes.Call(),
		asm.JNE.Imm(asm.R0, 0, "next"),
		asm.LoadMem(asm.R2, asm.RFP, -4, asm.Word),
		asm.JNE.Imm32(asm.R2, addr, "next"),

		// bpf_skb_change_type(skb, PACKET_HOST) for a frame to another MAC
		asm.LoadMem(asm.R2, asm.R6, skbPktType, asm.Word),
		asm.JNE.Imm32(asm.R2, unix.PACKET_OTHERHOST, "pass"),
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.Mov.Imm(asm.R2, unix.PACKET_HOST),
		asm.FnSkbChangeType.Call(),

		asm.Mov.Imm(asm.R0, tcxPass).WithSymbol("pass"),
		asm.Return(),
		asm.Mov.Imm(asm.R0, tcxNext).WithSymbol("next"),
		asm.Return(),
	}
}
