package network

import (
	"bytes"
	"errors"
	"net"
	"reflect"
	"testing"

	"github.com/insomniacslk/dhcp/dhcpv6"
	"golang.org/x/net/bpf"
)

// The checked-in corpus of each target is in testdata/fuzz/<target>.

// dhcp6Seeds are DHCPv6 messages a VM may send: each type, with and
// without the identifiers, for the lease's address and others, with
// several IAs, and a few that are not client messages at all.
func dhcp6Seeds(t testing.TB) [][]byte {
	m := func(mt dhcpv6.MessageType, opts ...dhcpv6.Option) []byte {
		return testMsg6(t, mt, opts...).ToBytes()
	}
	return [][]byte{
		m(dhcpv6.MessageTypeSolicit, testCID6, testIANA6(1)),
		m(dhcpv6.MessageTypeSolicit, testCID6, testRapid6, testIANA6(1, "2001:db8:9::1"), testIATA6, testIAPD6),
		m(dhcpv6.MessageTypeSolicit, testCID6, testIAPD6),
		m(dhcpv6.MessageTypeSolicit, testCID6, testSID6, testIANA6(1)),
		m(dhcpv6.MessageTypeRequest, testCID6, testSID6, testIANA6(1, "2001:db8:1::10")),
		m(dhcpv6.MessageTypeRequest, testCID6, testSID6, testIANA6(1, "2001:db8:9::1"), testIANA6(2, "2001:db8:1::10")),
		m(dhcpv6.MessageTypeRequest, testCID6, testForeignSID6, testIANA6(1)),
		m(dhcpv6.MessageTypeRenew, testCID6, testSID6, testIANA6(1, "2001:db8:1::10", "2001:db8:9::1")),
		m(dhcpv6.MessageTypeRebind, testCID6, testIANA6(1, "2001:db8:9::1")),
		m(dhcpv6.MessageTypeConfirm, testCID6, testIANA6(1, "2001:db8:1::10")),
		m(dhcpv6.MessageTypeConfirm, testCID6, testIANA6(1, "2001:db8:9::1")),
		m(dhcpv6.MessageTypeRelease, testCID6, testSID6, testIANA6(1, "2001:db8:1::10")),
		m(dhcpv6.MessageTypeDecline, testCID6, testSID6, testIANA6(1, "2001:db8:1::10")),
		m(dhcpv6.MessageTypeInformationRequest, testCID6),
		m(dhcpv6.MessageTypeInformationRequest),
		m(dhcpv6.MessageTypeAdvertise, testCID6, testSID6, testIANA6(1, "2001:db8:1::10")),
		m(dhcpv6.MessageTypeSolicit, dhcpv6.OptClientID(&dhcpv6.DUIDOpaque{Type: 9, Data: make([]byte, 200)}), testIANA6(1)),
		{byte(dhcpv6.MessageTypeSolicit), 1, 2, 3, 0, 1, 0, 1, 0},
		{},
	}
}

// FuzzHandle6 feeds fuzzed DHCPv6 messages to Handle6 and checks every
// reply: an Advertise or Reply to the same transaction from this server
// to the same client, that only ever gives the lease's address, that
// marshals and parses again, and that fits the IPv6 minimum MTU.
func FuzzHandle6(f *testing.F) {
	lease := testLease6(f)
	for _, s := range dhcp6Seeds(f) {
		f.Add(s)
	}
	before := *testLease6(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		req, err := dhcpv6.MessageFromBytes(b)
		if err != nil {
			return
		}
		reply, err := Handle6(req, lease, testServerDUID6)
		if err != nil {
			t.Fatalf("Handle6: %v", err)
		}
		if !reflect.DeepEqual(*lease, before) {
			t.Fatalf("the lease changed: %+v", *lease)
		}
		if reply == nil {
			return
		}
		out := reply.ToBytes()
		if n := len(out); n > 1280-ipv6HeaderLen-udpHeaderLen {
			t.Fatalf("reply of %d bytes", n)
		}
		got, err := dhcpv6.MessageFromBytes(out)
		if err != nil {
			t.Fatalf("reply does not parse: %v\n%s", err, reply.Summary())
		}
		if !bytes.Equal(got.ToBytes(), out) {
			t.Fatalf("reply changes on the wire")
		}
		if mt := got.MessageType; mt != dhcpv6.MessageTypeAdvertise && mt != dhcpv6.MessageTypeReply || got.TransactionID != req.TransactionID {
			t.Fatalf("reply %s xid %s to %s xid %s", mt, got.TransactionID, req.MessageType, req.TransactionID)
		}
		if sid := got.Options.ServerID(); sid == nil || !bytes.Equal(sid.ToBytes(), testServerDUID6.ToBytes()) {
			t.Fatalf("reply from server id %v", sid)
		}
		reqCID, gotCID := req.Options.GetOne(dhcpv6.OptionClientID), got.Options.GetOne(dhcpv6.OptionClientID)
		if (reqCID == nil) != (gotCID == nil) || reqCID != nil && !bytes.Equal(reqCID.ToBytes(), gotCID.ToBytes()) {
			t.Fatalf("client id %v, request's %v", gotCID, reqCID)
		}
		for _, ip := range validAddrs6(got) {
			if !ip.Equal(lease.IP) {
				t.Fatalf("reply gives %s, the lease is %s", ip, lease.IP)
			}
		}
	})
}

// validAddrs6 returns the addresses in m's IAs with a valid lifetime.
func validAddrs6(m *dhcpv6.Message) []net.IP {
	var out []net.IP
	for _, so := range iaOptions(m, true) {
		switch a := so.(type) {
		case *dhcpv6.OptIAAddress:
			if a.ValidLifetime != 0 {
				out = append(out, a.IPv6Addr)
			}
		case *dhcpv6.OptIAPrefix:
			if a.ValidLifetime != 0 && a.Prefix != nil {
				out = append(out, a.Prefix.IP)
			}
		}
	}
	return out
}

// FuzzParseDHCP6Frame feeds fuzzed frames to parseDHCP6Frame: it refuses
// with errNotDHCP6 or returns the frame's source and a payload inside the
// frame, and the BPF filter accepts every frame it accepts.
func FuzzParseDHCP6Frame(f *testing.F) {
	for _, tc := range dhcp6FrameCases(f) {
		f.Add(tc.frame)
	}
	for _, s := range dhcp6Seeds(f) {
		f.Add(dhcp6Frame(testClientMAC, testClientLL6, s))
	}
	vm, err := bpf.NewVM(dhcp6Filter()[2:])
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, frame []byte) {
		src, srcIP, payload, err := parseDHCP6Frame(frame)
		if err != nil {
			if !errors.Is(err, errNotDHCP6) {
				t.Fatalf("error %v is not errNotDHCP6", err)
			}
			if src != nil || srcIP != nil || payload != nil {
				t.Fatal("results with an error")
			}
			return
		}
		const off = etherHeaderLen + ipv6HeaderLen + udpHeaderLen
		if off+len(payload) > len(frame) || !bytes.Equal(payload, frame[off:off+len(payload)]) {
			t.Fatalf("payload of %d bytes is not the frame's from %d", len(payload), off)
		}
		if len(payload) > 0 && &payload[0] != &frame[off] {
			t.Fatal("payload is not part of the frame")
		}
		if !bytes.Equal(src, frame[6:12]) || !srcIP.Equal(net.IP(frame[etherHeaderLen+8:etherHeaderLen+24])) || !srcIP.IsLinkLocalUnicast() {
			t.Fatalf("source %s %s", src, srcIP)
		}
		if n, err := vm.Run(frame); err != nil || n == 0 {
			t.Fatalf("the filter refuses a frame the parser accepts (%d, %v)", n, err)
		}
	})
}
