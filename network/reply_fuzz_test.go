package network

import (
	"bytes"
	"encoding/binary"
	"net"
	"reflect"
	"testing"

	"github.com/insomniacslk/dhcp/dhcpv4"
)

// requestFrame wraps a client message in the frame a VM sends: from mac
// and 0.0.0.0:68 to the broadcast address, port 67.
func requestFrame(t testing.TB, mac net.HardwareAddr, payload []byte) []byte {
	t.Helper()
	f, err := buildDHCPFrame(mac, net.IPv4zero, dhcpDest{MAC: broadcastMAC, IP: net.IPv4bcast, Port: dhcpServerPort}, payload)
	if err != nil {
		t.Fatal(err)
	}
	binary.BigEndian.PutUint16(f[etherHeaderLen+ipv4HeaderLen:], dhcpClientPort)
	return f
}

// dhcpReplySeeds are frames a VM may send: each kind of request, for the
// lease's address and for others, from the lease's MAC and from others,
// through a relay, and frames that are not DHCP at all.
func dhcpReplySeeds(t testing.TB, lease *Lease) [][]byte {
	mac := lease.MAC
	foreign := net.HardwareAddr{0x52, 0x54, 0x00, 0xaa, 0xbb, 0xcc}
	msg := func(mt dhcpv4.MessageType, mods ...dhcpv4.Modifier) []byte {
		return requestFrame(t, mac, testMessage(t, mac, mt, mods...).ToBytes())
	}
	longID := bytes.Repeat([]byte{0x01, 0x52}, 200)
	discover := msg(dhcpv4.MessageTypeDiscover)
	vlan := append(append(append([]byte(nil), discover[:12]...), 0x81, 0x00, 0x00, 0x05), discover[12:]...)
	fragment := append([]byte(nil), discover...)
	fragment[etherHeaderLen+6] = 0x20 // more fragments
	padded := append(append([]byte(nil), discover...), make([]byte, 64)...)
	badSum := append([]byte(nil), discover...)
	badSum[etherHeaderLen+10] ^= 0xff
	wideHW := msg(dhcpv4.MessageTypeDiscover)
	wideHW[etherHeaderLen+ipv4HeaderLen+udpHeaderLen+2] = 16 // hlen 16: chaddr is the MAC and 10 more bytes
	return [][]byte{
		discover,
		msg(dhcpv4.MessageTypeDiscover, dhcpv4.WithBroadcast(true)),
		msg(dhcpv4.MessageTypeRequest, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(lease.IP)), dhcpv4.WithOption(dhcpv4.OptServerIdentifier(lease.ServerID))),
		msg(dhcpv4.MessageTypeRequest, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(ip4("10.9.9.9")))),
		msg(dhcpv4.MessageTypeRequest, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(lease.IP)), dhcpv4.WithOption(dhcpv4.OptServerIdentifier(ip4("192.0.2.99")))),
		msg(dhcpv4.MessageTypeRequest, dhcpv4.WithClientIP(lease.IP)),
		msg(dhcpv4.MessageTypeRequest, dhcpv4.WithClientIP(lease.IP), dhcpv4.WithBroadcast(true)),
		msg(dhcpv4.MessageTypeRequest),
		msg(dhcpv4.MessageTypeInform, dhcpv4.WithClientIP(lease.IP)),
		msg(dhcpv4.MessageTypeInform),
		msg(dhcpv4.MessageTypeRelease, dhcpv4.WithClientIP(lease.IP)),
		msg(dhcpv4.MessageTypeDecline, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(lease.IP))),
		requestFrame(t, mac, testMessage(t, foreign, dhcpv4.MessageTypeDiscover).ToBytes()),
		requestFrame(t, foreign, testMessage(t, mac, dhcpv4.MessageTypeDiscover, dhcpv4.WithGatewayIP(ip4("192.0.2.200"))).ToBytes()),
		msg(dhcpv4.MessageTypeDiscover, dhcpv4.WithOption(dhcpv4.OptClientIdentifier(longID)),
			dhcpv4.WithOption(dhcpv4.OptGeneric(dhcpv4.OptionRelayAgentInformation, []byte{1, 3, 'a', 'b', 'c'}))),
		msg(dhcpv4.MessageTypeDiscover, dhcpv4.WithReply(testMessage(t, mac, dhcpv4.MessageTypeOffer))),
		vlan, fragment, padded, badSum, wideHW,
		discover[:etherHeaderLen+ipv4HeaderLen+udpHeaderLen],
		discover[:len(discover)-1],
		{},
	}
}

// FuzzDHCPReply feeds fuzzed frames to the DHCP responder's pure half and
// checks every reply it would send: only to the lease's client, about the
// lease's address, from the server's addresses, in a well-formed frame.
// With wrap, the input is a DHCP message that a well-formed frame from
// the lease's MAC carries, so that mutations reach the DHCP parser and
// handler without breaking the frame's headers.
func FuzzDHCPReply(f *testing.F) {
	lease := testLease(f)
	for _, s := range dhcpReplySeeds(f, lease) {
		f.Add(s, false)
		if len(s) > etherHeaderLen+ipv4HeaderLen+udpHeaderLen {
			f.Add(s[etherHeaderLen+ipv4HeaderLen+udpHeaderLen:], true)
		}
	}
	before := cloneDHCPLease(*lease)
	f.Fuzz(func(t *testing.T, frame []byte, wrap bool) {
		if wrap {
			if len(frame) > 0xffff-ipv4HeaderLen-udpHeaderLen {
				return
			}
			frame = requestFrame(t, lease.MAC, frame)
		}
		x, err := replyFrame(testServerMAC, lease, frame)
		if !reflect.DeepEqual(*lease, before) {
			t.Fatalf("the lease changed: %+v", *lease)
		}
		if err != nil || x.reply == nil {
			if x.frame != nil {
				t.Fatalf("a frame to send with no reply (%v)", err)
			}
			return
		}
		again, err := replyFrame(testServerMAC, lease, frame)
		if err != nil || !bytes.Equal(again.frame, x.frame) {
			t.Fatalf("replyFrame is not deterministic: %v", err)
		}
		checkDHCPReply(t, lease, frame, x)
	})
}

// checkDHCPReply checks the reply x built for the request frame req.
func checkDHCPReply(t *testing.T, lease *Lease, req []byte, x dhcpExchange) {
	t.Helper()
	// Only the lease's client gets answers, and only to requests.
	if !bytes.Equal(x.req.ClientHWAddr, lease.MAC) || x.req.OpCode != dhcpv4.OpcodeBootRequest {
		t.Fatalf("answered %s from chaddr %s", x.req.OpCode, x.req.ClientHWAddr)
	}
	if mt := x.req.MessageType(); mt == dhcpv4.MessageTypeRelease || mt == dhcpv4.MessageTypeDecline {
		t.Fatalf("answered a %s", mt)
	}
	// The frame goes to the client, broadcast or, for a request that
	// names a relay (giaddr), back to the Ethernet address it came from.
	reqSrc := net.HardwareAddr(req[6:12])
	dstMAC := net.HardwareAddr(x.frame[0:6])
	switch {
	case bytes.Equal(dstMAC, lease.MAC), bytes.Equal(dstMAC, broadcastMAC):
	case bytes.Equal(dstMAC, reqSrc) && isNonzeroIPv4(x.req.GatewayIPAddr) && x.dst.Port == dhcpServerPort:
	default:
		t.Fatalf("reply sent to %s, not to the client %s", dstMAC, lease.MAC)
	}
	if !bytes.Equal(dstMAC, x.dst.MAC) || !bytes.Equal(x.frame[6:12], testServerMAC) {
		t.Fatalf("frame from %s to %s, want from %s to %s", net.HardwareAddr(x.frame[6:12]), dstMAC, testServerMAC, x.dst.MAC)
	}
	// The frame is well formed: it parses as one from the server port and
	// its checksums hold.
	ip := x.frame[etherHeaderLen:]
	udp := ip[ipv4HeaderLen:]
	if binary.BigEndian.Uint16(x.frame[12:14]) != etherTypeIPv4 || ^inetChecksum(ip[:ipv4HeaderLen], 0) != 0 ||
		int(binary.BigEndian.Uint16(ip[2:4])) != len(ip) || int(binary.BigEndian.Uint16(udp[4:6])) != len(udp) {
		t.Fatalf("malformed frame % x", x.frame)
	}
	pseudo := uint32(protoUDP) + uint32(len(udp))
	if ^inetChecksum(udp, uint32(inetChecksum(ip[12:20], pseudo))) != 0 {
		t.Fatal("bad udp checksum")
	}
	if !net.IP(ip[12:16]).Equal(lease.ServerID) || !net.IP(ip[16:20]).Equal(x.dst.IP) ||
		binary.BigEndian.Uint16(udp[0:2]) != dhcpServerPort || binary.BigEndian.Uint16(udp[2:4]) != x.dst.Port {
		t.Fatalf("frame from %s:%d to %s:%d", net.IP(ip[12:16]), binary.BigEndian.Uint16(udp[0:2]), net.IP(ip[16:20]), binary.BigEndian.Uint16(udp[2:4]))
	}
	// The message is a reply about the lease.
	got, err := dhcpv4.FromBytes(udp[udpHeaderLen:])
	if err != nil {
		t.Fatalf("reply does not parse: %v", err)
	}
	mt := got.MessageType()
	switch {
	case got.OpCode != dhcpv4.OpcodeBootReply || got.TransactionID != x.req.TransactionID:
		t.Fatalf("reply op %s xid %s to xid %s", got.OpCode, got.TransactionID, x.req.TransactionID)
	case !bytes.Equal(got.ClientHWAddr, lease.MAC):
		t.Fatalf("reply for chaddr %s", got.ClientHWAddr)
	case !got.ServerIdentifier().Equal(lease.ServerID):
		t.Fatalf("reply from server id %s", got.ServerIdentifier())
	case mt != dhcpv4.MessageTypeOffer && mt != dhcpv4.MessageTypeAck && mt != dhcpv4.MessageTypeNak:
		t.Fatalf("reply of type %s", mt)
	case !got.YourIPAddr.Equal(lease.IP) && !got.YourIPAddr.Equal(net.IPv4zero):
		t.Fatalf("reply offers %s, the lease is %s", got.YourIPAddr, lease.IP)
	case (mt == dhcpv4.MessageTypeOffer || mt == dhcpv4.MessageTypeAck && x.req.MessageType() == dhcpv4.MessageTypeRequest) && !got.YourIPAddr.Equal(lease.IP):
		t.Fatalf("%s with yiaddr %s, want %s", mt, got.YourIPAddr, lease.IP)
	case mt == dhcpv4.MessageTypeNak && !got.YourIPAddr.Equal(net.IPv4zero):
		t.Fatalf("NAK with yiaddr %s", got.YourIPAddr)
	}
}
