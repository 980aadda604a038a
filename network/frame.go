package network

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"golang.org/x/net/bpf"
)

const (
	etherHeaderLen = 14
	etherTypeIPv4  = 0x0800
	ipv4HeaderLen  = 20
	udpHeaderLen   = 8
	protoUDP       = 17
	dhcpServerPort = 67
	dhcpClientPort = 68
)

// errNotDHCP marks a frame that is not an unfragmented, untagged
// Ethernet/IPv4/UDP datagram to the DHCP server port.
var errNotDHCP = errors.New("not a dhcp server frame")

// dhcpFilter is a classic BPF program that accepts only untagged Ethernet
// frames carrying unfragmented IPv4/UDP to port 67. Its first two
// instructions refuse VLAN-tagged frames; the rest looks at bytes only.
func dhcpFilter() []bpf.Instruction {
	const accept, drop = 0x40000, 0
	// Jump offsets count instructions to skip; "drop" is the last one.
	prog := []bpf.Instruction{
		/* 0 */ bpf.LoadExtension{Num: bpf.ExtVLANTagPresent},
		/* 1 */ bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: 0, SkipTrue: 9},
		/* 2 */ bpf.LoadAbsolute{Off: 12, Size: 2},
		/* 3 */ bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: etherTypeIPv4, SkipTrue: 7},
		/* 4 */ bpf.LoadAbsolute{Off: etherHeaderLen + 9, Size: 1},
		/* 5 */ bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: protoUDP, SkipTrue: 5},
		/* 6 */ bpf.LoadAbsolute{Off: etherHeaderLen + 6, Size: 2},
		/* 7 */ bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: 0x3fff, SkipTrue: 3},
		/* 8 */ bpf.LoadMemShift{Off: etherHeaderLen},
		/* 9 */ bpf.LoadIndirect{Off: etherHeaderLen + 2, Size: 2},
		/* 10 */ bpf.JumpIf{Cond: bpf.JumpEqual, Val: dhcpServerPort, SkipTrue: 1},
		/* 11 */ bpf.RetConstant{Val: drop},
		/* 12 */ bpf.RetConstant{Val: accept},
	}
	return prog
}

// parseDHCPFrame checks an Ethernet frame and returns its source MAC and
// the payload of the UDP datagram to port 67 it carries. VLAN-tagged,
// fragmented, non-IPv4, non-UDP and inconsistent frames are refused. The UDP
// checksum is not verified: packets from local sockets on veth and tap
// devices often carry a partial (offloaded) one.
func parseDHCPFrame(frame []byte) (net.HardwareAddr, []byte, error) {
	if len(frame) < etherHeaderLen+ipv4HeaderLen+udpHeaderLen {
		return nil, nil, fmt.Errorf("frame of %d bytes: %w", len(frame), errNotDHCP)
	}
	if et := binary.BigEndian.Uint16(frame[12:14]); et != etherTypeIPv4 {
		return nil, nil, fmt.Errorf("ethertype %#04x: %w", et, errNotDHCP)
	}
	src := net.HardwareAddr(append([]byte(nil), frame[6:12]...))
	ip := frame[etherHeaderLen:]
	if v := ip[0] >> 4; v != 4 {
		return nil, nil, fmt.Errorf("ip version %d: %w", v, errNotDHCP)
	}
	ihl := int(ip[0]&0x0f) * 4
	total := int(binary.BigEndian.Uint16(ip[2:4]))
	// Ethernet may pad the frame: the IP total length bounds the datagram.
	if ihl < ipv4HeaderLen || total < ihl+udpHeaderLen || total > len(ip) {
		return nil, nil, fmt.Errorf("ipv4 header length %d, total length %d, %d bytes: %w", ihl, total, len(ip), errNotDHCP)
	}
	ip = ip[:total]
	if binary.BigEndian.Uint16(ip[6:8])&0x3fff != 0 {
		return nil, nil, fmt.Errorf("ipv4 fragment: %w", errNotDHCP)
	}
	if ip[9] != protoUDP {
		return nil, nil, fmt.Errorf("ip protocol %d: %w", ip[9], errNotDHCP)
	}
	if ^inetChecksum(ip[:ihl], 0) != 0 {
		return nil, nil, fmt.Errorf("bad ipv4 header checksum: %w", errNotDHCP)
	}
	udp := ip[ihl:]
	if port := binary.BigEndian.Uint16(udp[2:4]); port != dhcpServerPort {
		return nil, nil, fmt.Errorf("udp port %d: %w", port, errNotDHCP)
	}
	ulen := int(binary.BigEndian.Uint16(udp[4:6]))
	if ulen < udpHeaderLen || ulen > len(udp) {
		return nil, nil, fmt.Errorf("udp length %d of %d bytes: %w", ulen, len(udp), errNotDHCP)
	}
	return src, udp[udpHeaderLen:ulen], nil
}

// dhcpDest is where a reply goes on the wire.
type dhcpDest struct {
	MAC  net.HardwareAddr
	IP   net.IP
	Port uint16
}

// replyDest chooses the destination of reply to req, which came from the
// Ethernet address frameSrc, following RFC 2131 §4.1: to the relay when
// giaddr is set; NAKs broadcast; to ciaddr when set; broadcast when the
// client set the broadcast bit; otherwise unicast to yiaddr at chaddr, which
// needs no ARP because the frame is built here.
func replyDest(req, reply *dhcpv4.DHCPv4, frameSrc net.HardwareAddr) dhcpDest {
	bcast := dhcpDest{MAC: net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, IP: net.IPv4bcast.To4(), Port: dhcpClientPort}
	switch {
	case isNonzeroIPv4(req.GatewayIPAddr):
		return dhcpDest{MAC: frameSrc, IP: req.GatewayIPAddr.To4(), Port: dhcpServerPort}
	case reply.MessageType() == dhcpv4.MessageTypeNak:
		return bcast
	case isNonzeroIPv4(req.ClientIPAddr):
		return dhcpDest{MAC: req.ClientHWAddr, IP: req.ClientIPAddr.To4(), Port: dhcpClientPort}
	case req.IsBroadcast() || !isNonzeroIPv4(reply.YourIPAddr) || len(req.ClientHWAddr) != 6:
		return bcast
	default:
		return dhcpDest{MAC: req.ClientHWAddr, IP: reply.YourIPAddr.To4(), Port: dhcpClientPort}
	}
}

// isNonzeroIPv4 reports whether ip is an IPv4 address other than 0.0.0.0.
func isNonzeroIPv4(ip net.IP) bool {
	v4 := ip.To4()
	return v4 != nil && !v4.IsUnspecified()
}

// buildDHCPFrame returns an Ethernet/IPv4/UDP frame from srcMAC/srcIP port
// 67 to dst carrying payload, with IPv4 and UDP checksums.
func buildDHCPFrame(srcMAC net.HardwareAddr, srcIP net.IP, dst dhcpDest, payload []byte) ([]byte, error) {
	src4, dst4 := srcIP.To4(), dst.IP.To4()
	if len(srcMAC) != 6 || len(dst.MAC) != 6 || src4 == nil || dst4 == nil {
		return nil, fmt.Errorf("build dhcp frame from %s %s to %s %s: invalid address", srcMAC, srcIP, dst.MAC, dst.IP)
	}
	total := ipv4HeaderLen + udpHeaderLen + len(payload)
	if total > 0xffff {
		return nil, fmt.Errorf("build dhcp frame: payload of %d bytes too long", len(payload))
	}
	f := make([]byte, etherHeaderLen+total)
	copy(f[0:6], dst.MAC)
	copy(f[6:12], srcMAC)
	binary.BigEndian.PutUint16(f[12:14], etherTypeIPv4)

	ip := f[etherHeaderLen:]
	ip[0] = 0x45 // version 4, 20-byte header
	ip[1] = 0xc0 // DSCP CS6 (network control), as DHCP servers use
	binary.BigEndian.PutUint16(ip[2:4], uint16(total))
	ip[8] = 64 // TTL
	ip[9] = protoUDP
	copy(ip[12:16], src4)
	copy(ip[16:20], dst4)
	binary.BigEndian.PutUint16(ip[10:12], ^inetChecksum(ip[:ipv4HeaderLen], 0))

	udp := ip[ipv4HeaderLen:]
	binary.BigEndian.PutUint16(udp[0:2], dhcpServerPort)
	binary.BigEndian.PutUint16(udp[2:4], dst.Port)
	binary.BigEndian.PutUint16(udp[4:6], uint16(udpHeaderLen+len(payload)))
	copy(udp[udpHeaderLen:], payload)
	// Pseudo-header: addresses, protocol, UDP length.
	pseudo := uint32(protoUDP) + uint32(udpHeaderLen+len(payload))
	sum := inetChecksum(ip[12:20], pseudo)
	sum = ^inetChecksum(udp, uint32(sum))
	if sum == 0 {
		sum = 0xffff
	}
	binary.BigEndian.PutUint16(udp[6:8], sum)
	return f, nil
}

// inetChecksum is the ones' complement sum of b (RFC 1071) added to initial,
// folded to 16 bits. The checksum field is its complement; a header with a
// correct checksum field sums to 0xffff.
func inetChecksum(b []byte, initial uint32) uint16 {
	sum := initial
	for len(b) >= 2 {
		sum += uint32(b[0])<<8 | uint32(b[1])
		b = b[2:]
	}
	if len(b) == 1 {
		sum += uint32(b[0]) << 8
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return uint16(sum)
}
