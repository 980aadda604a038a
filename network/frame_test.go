package network

import (
	"bytes"
	"encoding/binary"
	"net"
	"testing"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"golang.org/x/net/bpf"
)

var (
	testServerMAC = net.HardwareAddr{0x02, 0x00, 0x00, 0x00, 0x00, 0x01}
	testClientMAC = net.HardwareAddr{0x52, 0x54, 0x00, 0x12, 0x34, 0x56}
	broadcastMAC  = net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
)

// clientFrame is a DISCOVER-like frame from the client to port 67.
func clientFrame(t *testing.T, payload []byte) []byte {
	t.Helper()
	f, err := buildDHCPFrame(testClientMAC, net.IPv4zero, dhcpDest{MAC: broadcastMAC, IP: net.IPv4bcast, Port: dhcpServerPort}, payload)
	if err != nil {
		t.Fatal(err)
	}
	// buildDHCPFrame writes source port 67; a client uses 68.
	binary.BigEndian.PutUint16(f[etherHeaderLen+ipv4HeaderLen:], dhcpClientPort)
	fixUDPChecksum(f)
	return f
}

// fixUDPChecksum recomputes the UDP checksum of an untagged frame with a
// 20-byte IPv4 header.
func fixUDPChecksum(f []byte) {
	ip := f[etherHeaderLen:]
	udp := ip[ipv4HeaderLen:]
	binary.BigEndian.PutUint16(udp[6:8], 0)
	sum := inetChecksum(ip[12:20], uint32(protoUDP)+uint32(len(udp)))
	binary.BigEndian.PutUint16(udp[6:8], ^inetChecksum(udp, uint32(sum)))
}

func TestBuildDHCPFrame(t *testing.T) {
	payload := bytes.Repeat([]byte{0xab}, 301) // odd length exercises checksum padding
	dst := dhcpDest{MAC: testClientMAC, IP: ip4("192.0.2.10"), Port: dhcpClientPort}
	f, err := buildDHCPFrame(testServerMAC, ip4("169.254.1.1"), dst, payload)
	if err != nil {
		t.Fatal(err)
	}
	if len(f) != etherHeaderLen+ipv4HeaderLen+udpHeaderLen+len(payload) {
		t.Fatalf("frame length %d", len(f))
	}
	if !bytes.Equal(f[0:6], testClientMAC) || !bytes.Equal(f[6:12], testServerMAC) || binary.BigEndian.Uint16(f[12:14]) != 0x0800 {
		t.Errorf("ethernet header % x", f[:14])
	}
	ip := f[etherHeaderLen:]
	if ip[0] != 0x45 || ip[9] != 17 || ip[8] == 0 || int(binary.BigEndian.Uint16(ip[2:4])) != len(ip) ||
		!net.IP(ip[12:16]).Equal(ip4("169.254.1.1")) || !net.IP(ip[16:20]).Equal(ip4("192.0.2.10")) {
		t.Errorf("ipv4 header % x", ip[:20])
	}
	if inetChecksum(ip[:20], 0) != 0xffff {
		t.Error("bad ipv4 header checksum")
	}
	udp := ip[20:]
	if binary.BigEndian.Uint16(udp[0:2]) != 67 || binary.BigEndian.Uint16(udp[2:4]) != 68 || int(binary.BigEndian.Uint16(udp[4:6])) != len(udp) {
		t.Errorf("udp header % x", udp[:8])
	}
	if inetChecksum(udp, uint32(inetChecksum(ip[12:20], uint32(protoUDP)+uint32(len(udp))))) != 0xffff {
		t.Error("bad udp checksum")
	}
	if !bytes.Equal(udp[8:], payload) {
		t.Error("payload differs")
	}

	if _, err := buildDHCPFrame(testServerMAC, net.ParseIP("2001:db8::1"), dst, payload); err == nil {
		t.Error("ipv6 source accepted")
	}
	if _, err := buildDHCPFrame(testServerMAC, ip4("169.254.1.1"), dhcpDest{MAC: testClientMAC[:3], IP: ip4("192.0.2.10")}, payload); err == nil {
		t.Error("short destination mac accepted")
	}
}

func TestParseDHCPFrame(t *testing.T) {
	payload := []byte("a dhcp message")
	good := clientFrame(t, payload)
	mutate := func(f func(b []byte)) []byte {
		b := append([]byte(nil), good...)
		f(b)
		return b
	}
	fixIPChecksum := func(b []byte) {
		h := b[etherHeaderLen : etherHeaderLen+int(b[etherHeaderLen]&0x0f)*4]
		binary.BigEndian.PutUint16(h[10:12], 0)
		binary.BigEndian.PutUint16(h[10:12], ^inetChecksum(h, 0))
	}
	withIPOptions := func() []byte {
		// A 24-byte IPv4 header (one NOP-padded option word).
		b := append([]byte(nil), good[:etherHeaderLen+ipv4HeaderLen]...)
		b = append(b, 1, 1, 1, 0)
		b = append(b, good[etherHeaderLen+ipv4HeaderLen:]...)
		b[etherHeaderLen] = 0x46
		binary.BigEndian.PutUint16(b[etherHeaderLen+2:], uint16(len(b)-etherHeaderLen))
		fixIPChecksum(b)
		return b
	}

	for _, tc := range []struct {
		name  string
		frame []byte
		ok    bool
	}{
		{"good", good, true},
		{"ethernet padding", append(append([]byte(nil), good...), make([]byte, 18)...), true},
		{"ip options", withIPOptions(), true},
		{"truncated", good[:40], false},
		{"empty", nil, false},
		{"vlan tagged", mutate(func(b []byte) { binary.BigEndian.PutUint16(b[12:], 0x8100) }), false},
		{"ipv6 ethertype", mutate(func(b []byte) { binary.BigEndian.PutUint16(b[12:], 0x86dd) }), false},
		{"ip version 6", mutate(func(b []byte) { b[14] = 0x65; fixIPChecksum(b) }), false},
		{"ihl too small", mutate(func(b []byte) { b[14] = 0x44; fixIPChecksum(b) }), false},
		{"total length beyond frame", mutate(func(b []byte) {
			binary.BigEndian.PutUint16(b[16:], uint16(len(b)))
			fixIPChecksum(b)
		}), false},
		{"more fragments", mutate(func(b []byte) { b[20] = 0x20; fixIPChecksum(b) }), false},
		{"fragment offset", mutate(func(b []byte) { b[21] = 0x10; fixIPChecksum(b) }), false},
		{"tcp", mutate(func(b []byte) { b[23] = 6; fixIPChecksum(b) }), false},
		{"bad ip checksum", mutate(func(b []byte) { b[24] ^= 0xff }), false},
		{"port 68", mutate(func(b []byte) { binary.BigEndian.PutUint16(b[36:], 68) }), false},
		{"udp length beyond datagram", mutate(func(b []byte) { binary.BigEndian.PutUint16(b[38:], 0x1000) }), false},
		{"udp length below header", mutate(func(b []byte) { binary.BigEndian.PutUint16(b[38:], 4) }), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src, got, err := parseDHCPFrame(tc.frame)
			if !tc.ok {
				if err == nil {
					t.Fatal("frame accepted")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(src, testClientMAC) || !bytes.Equal(got, payload) {
				t.Errorf("got src %s payload %q", src, got)
			}
		})
	}
}

// filterVM assembles prog, checks that it starts with the VLAN check, and
// returns x/net/bpf's VM for the rest of it.
func filterVM(t *testing.T, prog []bpf.Instruction) *bpf.VM {
	t.Helper()
	if _, err := bpf.Assemble(prog); err != nil {
		t.Fatalf("assemble: %v", err)
	}
	if le, ok := prog[0].(bpf.LoadExtension); !ok || le.Num != bpf.ExtVLANTagPresent {
		t.Fatalf("first instruction %v, want the VLAN check", prog[0])
	}
	vm, err := bpf.NewVM(prog[2:])
	if err != nil {
		t.Fatal(err)
	}
	return vm
}

// TestDHCPFilter runs the filter in x/net/bpf's VM. The VM lacks the VLAN
// extension, so the first two instructions (VLAN check) are left out; the
// jumps of the rest are relative and unaffected.
func TestDHCPFilter(t *testing.T) {
	vm := filterVM(t, dhcpFilter())
	good := clientFrame(t, make([]byte, 300))
	mutate := func(f func(b []byte)) []byte {
		b := append([]byte(nil), good...)
		f(b)
		return b
	}
	withIPOptions := func() []byte {
		b := append([]byte(nil), good[:34]...)
		b = append(b, 1, 1, 1, 0)
		b = append(b, good[34:]...)
		b[14] = 0x46
		return b
	}
	for _, tc := range []struct {
		name   string
		frame  []byte
		accept bool
	}{
		{"dhcp to server", good, true},
		{"ip options", withIPOptions(), true},
		{"to client port", mutate(func(b []byte) { binary.BigEndian.PutUint16(b[36:], 68) }), false},
		{"arp", mutate(func(b []byte) { binary.BigEndian.PutUint16(b[12:], 0x0806) }), false},
		{"tcp", mutate(func(b []byte) { b[23] = 6 }), false},
		{"fragment", mutate(func(b []byte) { b[20] = 0x20 }), false},
		{"short", good[:20], false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, err := vm.Run(tc.frame)
			if err != nil {
				t.Fatal(err)
			}
			if (n > 0) != tc.accept {
				t.Errorf("filter returned %d, want accept=%v", n, tc.accept)
			}
		})
	}
}

func TestReplyDest(t *testing.T) {
	lease := testLease(t)
	frameSrc := net.HardwareAddr{0x02, 0xaa, 0, 0, 0, 0x01}
	bcast := dhcpDest{MAC: broadcastMAC, IP: net.IPv4bcast.To4(), Port: 68}
	unicastYiaddr := dhcpDest{MAC: lease.MAC, IP: ip4("192.0.2.10"), Port: 68}
	for _, tc := range []struct {
		name string
		req  *dhcpv4.DHCPv4
		want dhcpDest
	}{
		{"discover with broadcast bit", testMessage(t, lease.MAC, dhcpv4.MessageTypeDiscover, dhcpv4.WithBroadcast(true)), bcast},
		{"discover without broadcast bit", testMessage(t, lease.MAC, dhcpv4.MessageTypeDiscover), unicastYiaddr},
		{"renew to ciaddr", testMessage(t, lease.MAC, dhcpv4.MessageTypeRequest, dhcpv4.WithClientIP(ip4("192.0.2.10"))),
			dhcpDest{MAC: lease.MAC, IP: ip4("192.0.2.10"), Port: 68}},
		{"rebind to ciaddr despite broadcast bit", testMessage(t, lease.MAC, dhcpv4.MessageTypeRequest,
			dhcpv4.WithClientIP(ip4("192.0.2.10")), dhcpv4.WithBroadcast(true)),
			dhcpDest{MAC: lease.MAC, IP: ip4("192.0.2.10"), Port: 68}},
		{"nak broadcast", testMessage(t, lease.MAC, dhcpv4.MessageTypeRequest, dhcpv4.WithClientIP(ip4("10.9.9.9"))), bcast},
		{"inform to ciaddr", testMessage(t, lease.MAC, dhcpv4.MessageTypeInform, dhcpv4.WithClientIP(ip4("192.0.2.10"))),
			dhcpDest{MAC: lease.MAC, IP: ip4("192.0.2.10"), Port: 68}},
		{"relay", testMessage(t, lease.MAC, dhcpv4.MessageTypeDiscover, dhcpv4.WithGatewayIP(ip4("192.0.2.200"))),
			dhcpDest{MAC: frameSrc, IP: ip4("192.0.2.200"), Port: 67}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reply, err := Handle(tc.req, lease)
			if err != nil || reply == nil {
				t.Fatalf("Handle = %v, %v", reply, err)
			}
			got := replyDest(tc.req, reply, frameSrc)
			if !bytes.Equal(got.MAC, tc.want.MAC) || !got.IP.Equal(tc.want.IP) || got.Port != tc.want.Port {
				t.Errorf("dest %s %s:%d, want %s %s:%d", got.MAC, got.IP, got.Port, tc.want.MAC, tc.want.IP, tc.want.Port)
			}
		})
	}
}
