package network

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"testing"

	"golang.org/x/net/bpf"
)

var (
	testClientLL6    = net.ParseIP("fe80::5054:ff:fe12:3456")
	allDHCPServers6  = net.ParseIP("ff02::1:2")
	allDHCPServerMAC = net.HardwareAddr{0x33, 0x33, 0x00, 0x01, 0x00, 0x02}
)

// dhcp6Frame builds by hand the frame a DHCPv6 client sends: from mac and
// the link-local src, port 546, to All_DHCP_Relay_Agents_and_Servers,
// port 547, with a correct UDP checksum.
func dhcp6Frame(mac net.HardwareAddr, src net.IP, payload []byte) []byte {
	f := make([]byte, etherHeaderLen+ipv6HeaderLen+udpHeaderLen+len(payload))
	copy(f[0:6], allDHCPServerMAC)
	copy(f[6:12], mac)
	binary.BigEndian.PutUint16(f[12:14], etherTypeIPv6)

	ip := f[etherHeaderLen:]
	ip[0] = 0x60 // version 6, traffic class 0, flow label 0
	binary.BigEndian.PutUint16(ip[4:6], uint16(udpHeaderLen+len(payload)))
	ip[6] = protoUDP
	ip[7] = 1 // hop limit: link-local multicast
	copy(ip[8:24], src.To16())
	copy(ip[24:40], allDHCPServers6)

	udp := ip[ipv6HeaderLen:]
	binary.BigEndian.PutUint16(udp[0:2], dhcp6ClientPort)
	binary.BigEndian.PutUint16(udp[2:4], dhcp6ServerPort)
	binary.BigEndian.PutUint16(udp[4:6], uint16(udpHeaderLen+len(payload)))
	copy(udp[udpHeaderLen:], payload)
	// Pseudo-header: addresses, upper-layer length, next header.
	sum := inetChecksum(ip[8:40], uint32(len(udp))+protoUDP)
	sum = ^inetChecksum(udp, uint32(sum))
	if sum == 0 {
		sum = 0xffff
	}
	binary.BigEndian.PutUint16(udp[6:8], sum)
	return f
}

// dhcp6FrameCases are frames the parser and the filter must agree on:
// accept says the parser accepts the frame, filter that the filter does
// (a superset: it does not look at lengths or addresses).
func dhcp6FrameCases(t testing.TB) []struct {
	name           string
	frame          []byte
	accept, filter bool
} {
	good := dhcp6Frame(testClientMAC, testClientLL6, []byte("a dhcpv6 message"))
	mutate := func(f func(b []byte)) []byte {
		b := append([]byte(nil), good...)
		f(b)
		return b
	}
	const ip, udp = etherHeaderLen, etherHeaderLen + ipv6HeaderLen
	hopByHop := func() []byte {
		// A Hop-by-Hop Options header (PadN) between IPv6 and UDP.
		b := append([]byte(nil), good[:udp]...)
		b = append(b, protoUDP, 0, 1, 4, 0, 0, 0, 0)
		b = append(b, good[udp:]...)
		b[ip+6] = 0
		binary.BigEndian.PutUint16(b[ip+4:], uint16(len(b)-udp))
		return b
	}
	vlan := append(append(append([]byte(nil), good[:12]...), 0x81, 0x00, 0x00, 0x05), good[12:]...)
	return []struct {
		name           string
		frame          []byte
		accept, filter bool
	}{
		{"good", good, true, true},
		{"empty payload", dhcp6Frame(testClientMAC, testClientLL6, nil), true, true},
		{"ethernet padding", append(append([]byte(nil), good...), make([]byte, 18)...), true, true},
		{"unicast to the server", mutate(func(b []byte) { copy(b[ip+24:], net.ParseIP("fe80::1")) }), true, true},
		{"empty", nil, false, false},
		{"truncated headers", good[:udp+4], false, true},
		{"truncated payload", good[:len(good)-1], false, true},
		{"vlan tagged", vlan, false, false},
		{"ipv4 ethertype", mutate(func(b []byte) { binary.BigEndian.PutUint16(b[12:], etherTypeIPv4) }), false, false},
		{"ip version 4", mutate(func(b []byte) { b[ip] = 0x40 }), false, true},
		{"tcp", mutate(func(b []byte) { b[ip+6] = 6 }), false, false},
		{"hop-by-hop header", hopByHop(), false, false},
		{"payload length beyond frame", mutate(func(b []byte) { binary.BigEndian.PutUint16(b[ip+4:], uint16(len(b))) }), false, true},
		{"payload length below udp header", mutate(func(b []byte) { binary.BigEndian.PutUint16(b[ip+4:], 4) }), false, true},
		{"jumbogram", mutate(func(b []byte) { binary.BigEndian.PutUint16(b[ip+4:], 0) }), false, true},
		{"udp length short", mutate(func(b []byte) { binary.BigEndian.PutUint16(b[udp+4:], udpHeaderLen+1) }), false, true},
		{"udp length long", mutate(func(b []byte) { binary.BigEndian.PutUint16(b[udp+4:], uint16(len(b))) }), false, true},
		{"global source", mutate(func(b []byte) { copy(b[ip+8:], net.ParseIP("2001:db8::1")) }), false, true},
		{"unspecified source", mutate(func(b []byte) { copy(b[ip+8:], net.IPv6unspecified) }), false, true},
		{"multicast source", mutate(func(b []byte) { copy(b[ip+8:], allDHCPServers6) }), false, true},
		{"to the client port", mutate(func(b []byte) { binary.BigEndian.PutUint16(b[udp+2:], dhcp6ClientPort) }), false, false},
		{"to the dhcpv4 port", mutate(func(b []byte) { binary.BigEndian.PutUint16(b[udp+2:], dhcpServerPort) }), false, false},
	}
}

func TestParseDHCP6Frame(t *testing.T) {
	for _, tc := range dhcp6FrameCases(t) {
		t.Run(tc.name, func(t *testing.T) {
			src, srcIP, payload, err := parseDHCP6Frame(tc.frame)
			if !tc.accept {
				if !errors.Is(err, errNotDHCP6) {
					t.Fatalf("parseDHCP6Frame = %v, want errNotDHCP6", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := tc.frame[etherHeaderLen+ipv6HeaderLen+udpHeaderLen : etherHeaderLen+ipv6HeaderLen+int(binary.BigEndian.Uint16(tc.frame[etherHeaderLen+4:]))]
			if !bytes.Equal(src, testClientMAC) || !srcIP.Equal(testClientLL6) || !bytes.Equal(payload, want) {
				t.Errorf("got src %s %s payload %q", src, srcIP, payload)
			}
			// src and srcIP are copies.
			src[0], srcIP[15] = 0xff, 0xff
			if !bytes.Equal(tc.frame[6:12], testClientMAC) || !net.IP(tc.frame[etherHeaderLen+8:etherHeaderLen+24]).Equal(testClientLL6) {
				t.Error("src or srcIP alias the frame")
			}
		})
	}
}

// TestDHCP6Filter runs the filter in x/net/bpf's VM, which lacks the VLAN
// extension: as in TestDHCPFilter, the first two instructions are left
// out, and the VLAN-tagged frame is refused by its EtherType (0x8100).
func TestDHCP6Filter(t *testing.T) {
	vm := filterVM(t, dhcp6Filter())
	for _, tc := range dhcp6FrameCases(t) {
		t.Run(tc.name, func(t *testing.T) {
			n, err := vm.Run(tc.frame)
			if err != nil {
				t.Fatal(err)
			}
			if (n > 0) != tc.filter {
				t.Errorf("filter returned %d, want accept=%v", n, tc.filter)
			}
			if tc.accept && !tc.filter {
				t.Error("the parser accepts a frame the filter refuses")
			}
		})
	}
	// An IPv4 DHCP frame is not for the IPv6 responder, nor the reverse.
	v4, err := bpf.NewVM(dhcpFilter()[2:])
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := vm.Run(requestFrame(t, testClientMAC, []byte("dhcpv4"))); n != 0 {
		t.Error("dhcp6Filter accepts a dhcpv4 frame")
	}
	if n, _ := v4.Run(dhcp6Frame(testClientMAC, testClientLL6, []byte("dhcpv6"))); n != 0 {
		t.Error("dhcpFilter accepts a dhcpv6 frame")
	}
}
