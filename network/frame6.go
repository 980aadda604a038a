package network

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"

	"golang.org/x/net/bpf"
)

const (
	etherTypeIPv6   = 0x86dd
	ipv6HeaderLen   = 40
	dhcp6ServerPort = 547
	dhcp6ClientPort = 546
)

// errNotDHCP6 marks a frame that is not an untagged Ethernet/IPv6/UDP
// datagram, without extension headers, from a link-local address to the
// DHCPv6 server port.
var errNotDHCP6 = errors.New("not a dhcpv6 server frame")

// dhcp6Filter is a classic BPF program that accepts only untagged
// Ethernet frames carrying IPv6 whose next header is UDP, to port 547.
// Like dhcpFilter, its first two instructions refuse VLAN-tagged frames.
// A datagram behind extension headers is refused: clients send none.
func dhcp6Filter() []bpf.Instruction {
	const accept, drop = 0x40000, 0
	// Jump offsets count instructions to skip; "drop" is the one before
	// last.
	return []bpf.Instruction{
		/* 0 */ bpf.LoadExtension{Num: bpf.ExtVLANTagPresent},
		/* 1 */ bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: 0, SkipTrue: 6},
		/* 2 */ bpf.LoadAbsolute{Off: 12, Size: 2},
		/* 3 */ bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: etherTypeIPv6, SkipTrue: 4},
		/* 4 */ bpf.LoadAbsolute{Off: etherHeaderLen + 6, Size: 1},
		/* 5 */ bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: protoUDP, SkipTrue: 2},
		/* 6 */ bpf.LoadAbsolute{Off: etherHeaderLen + ipv6HeaderLen + 2, Size: 2},
		/* 7 */ bpf.JumpIf{Cond: bpf.JumpEqual, Val: dhcp6ServerPort, SkipTrue: 1},
		/* 8 */ bpf.RetConstant{Val: drop},
		/* 9 */ bpf.RetConstant{Val: accept},
	}
}

// parseDHCP6Frame checks an Ethernet frame and returns its source MAC, its
// IPv6 source address and the payload of the UDP datagram to port 547 it
// carries. Frames that are VLAN-tagged, not IPv6, with extension headers,
// not UDP, inconsistent in their lengths, or from an address other than a
// link-local unicast one (a client's, RFC 8415 §13.1) are refused. The
// UDP checksum is not verified: packets from local sockets on veth and
// tap devices often carry a partial (offloaded) one. The payload is part
// of frame; src and srcIP are copies.
func parseDHCP6Frame(frame []byte) (src net.HardwareAddr, srcIP net.IP, payload []byte, err error) {
	if len(frame) < etherHeaderLen+ipv6HeaderLen+udpHeaderLen {
		return nil, nil, nil, fmt.Errorf("frame of %d bytes: %w", len(frame), errNotDHCP6)
	}
	if et := binary.BigEndian.Uint16(frame[12:14]); et != etherTypeIPv6 {
		return nil, nil, nil, fmt.Errorf("ethertype %#04x: %w", et, errNotDHCP6)
	}
	ip := frame[etherHeaderLen:]
	if v := ip[0] >> 4; v != 6 {
		return nil, nil, nil, fmt.Errorf("ip version %d: %w", v, errNotDHCP6)
	}
	if ip[6] != protoUDP {
		return nil, nil, nil, fmt.Errorf("ipv6 next header %d: %w", ip[6], errNotDHCP6)
	}
	// Ethernet may pad the frame: the payload length bounds the datagram.
	// A jumbogram's payload length of 0 is refused too.
	plen := int(binary.BigEndian.Uint16(ip[4:6]))
	if plen < udpHeaderLen || plen > len(ip)-ipv6HeaderLen {
		return nil, nil, nil, fmt.Errorf("ipv6 payload length %d of %d bytes: %w", plen, len(ip)-ipv6HeaderLen, errNotDHCP6)
	}
	if from := net.IP(ip[8:24]); !from.IsLinkLocalUnicast() {
		return nil, nil, nil, fmt.Errorf("ipv6 source %s: %w", from, errNotDHCP6)
	}
	udp := ip[ipv6HeaderLen : ipv6HeaderLen+plen]
	if port := binary.BigEndian.Uint16(udp[2:4]); port != dhcp6ServerPort {
		return nil, nil, nil, fmt.Errorf("udp port %d: %w", port, errNotDHCP6)
	}
	if ulen := int(binary.BigEndian.Uint16(udp[4:6])); ulen != plen {
		return nil, nil, nil, fmt.Errorf("udp length %d in an ipv6 payload of %d: %w", ulen, plen, errNotDHCP6)
	}
	src = append(net.HardwareAddr(nil), frame[6:12]...)
	srcIP = append(net.IP(nil), ip[8:24]...)
	return src, srcIP, udp[udpHeaderLen:], nil
}
