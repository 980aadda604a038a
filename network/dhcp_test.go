package network

import (
	"bytes"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/insomniacslk/dhcp/dhcpv4"
)

var testXID = dhcpv4.TransactionID{0xde, 0xad, 0xbe, 0xef}

func mustCIDR(t testing.TB, s string) *net.IPNet {
	t.Helper()
	_, n, err := net.ParseCIDR(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// testLease is a fully populated lease: default, on-link host and subnet
// routes, MTU, two DNS servers, two search domains and a hostname.
func testLease(t testing.TB) *Lease {
	t.Helper()
	return &Lease{
		MAC:     net.HardwareAddr{0x52, 0x54, 0x00, 0x12, 0x34, 0x56},
		IP:      net.ParseIP("192.0.2.10"),
		Mask:    net.CIDRMask(24, 32),
		Gateway: net.ParseIP("192.0.2.1"),
		Routes: []Route{
			{Gw: net.ParseIP("192.0.2.1")},
			{Dst: mustCIDR(t, "169.254.1.1/32")},
			{Dst: mustCIDR(t, "198.51.100.0/24"), Gw: net.ParseIP("192.0.2.254")},
		},
		MTU:      1450,
		DNS:      []net.IP{net.ParseIP("192.0.2.53"), net.ParseIP("192.0.2.54")},
		Search:   []string{"pod.example", "example"},
		Hostname: "vm-1",
		ServerID: net.ParseIP("169.254.1.1"),
	}
}

// testMessage builds a client message and passes it through its wire form.
func testMessage(t testing.TB, mac net.HardwareAddr, mt dhcpv4.MessageType, mods ...dhcpv4.Modifier) *dhcpv4.DHCPv4 {
	t.Helper()
	base := []dhcpv4.Modifier{
		dhcpv4.WithHwAddr(mac),
		dhcpv4.WithTransactionID(testXID),
		dhcpv4.WithMessageType(mt),
	}
	m, err := dhcpv4.New(append(base, mods...)...)
	if err != nil {
		t.Fatal(err)
	}
	m, err = dhcpv4.FromBytes(m.ToBytes())
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// wire passes a reply through its wire form, as the client sees it.
func wire(t testing.TB, m *dhcpv4.DHCPv4) *dhcpv4.DHCPv4 {
	t.Helper()
	if m == nil {
		return nil
	}
	out, err := dhcpv4.FromBytes(m.ToBytes())
	if err != nil {
		t.Fatalf("reply does not parse: %v", err)
	}
	return out
}

func ip4(s string) net.IP { return net.ParseIP(s).To4() }

// wantOptions is the option set of an OFFER or ACK for testLease with the
// default lease time.
func wantOptions() map[dhcpv4.OptionCode][]byte {
	return map[dhcpv4.OptionCode][]byte{
		dhcpv4.OptionSubnetMask:       {255, 255, 255, 0},
		dhcpv4.OptionRouter:           {192, 0, 2, 1},
		dhcpv4.OptionInterfaceMTU:     {0x05, 0xaa},
		dhcpv4.OptionDomainNameServer: {192, 0, 2, 53, 192, 0, 2, 54},
		dhcpv4.OptionDomainName:       []byte("pod.example"),
		dhcpv4.OptionDNSDomainSearchList: append(
			[]byte("\x03pod\x07example\x00"), []byte("\x07example\x00")...),
		dhcpv4.OptionHostName:             []byte("vm-1"),
		dhcpv4.OptionIPAddressLeaseTime:   {0x00, 0x01, 0x51, 0x80}, // 86400
		dhcpv4.OptionRenewTimeValue:       {0x00, 0x00, 0xa8, 0xc0}, // 43200
		dhcpv4.OptionRebindingTimeValue:   {0x00, 0x01, 0x27, 0x50}, // 75600
		dhcpv4.OptionServerIdentifier:     {169, 254, 1, 1},
		dhcpv4.OptionBroadcastAddress:     {192, 0, 2, 255},
		dhcpv4.OptionClasslessStaticRoute: {0, 192, 0, 2, 1, 32, 169, 254, 1, 1, 0, 0, 0, 0, 24, 198, 51, 100, 192, 0, 2, 254},
	}
}

// checkOptions compares every option of got with want, ignoring the
// message type and the options in ignore.
func checkOptions(t *testing.T, got *dhcpv4.DHCPv4, want map[dhcpv4.OptionCode][]byte, ignore ...dhcpv4.OptionCode) {
	t.Helper()
	skip := map[uint8]bool{dhcpv4.OptionDHCPMessageType.Code(): true}
	for _, c := range ignore {
		skip[c.Code()] = true
	}
	for code, w := range want {
		if g := got.Options.Get(code); !bytes.Equal(g, w) {
			t.Errorf("option %v = %v, want %v", code, g, w)
		}
	}
	for code := range want {
		skip[code.Code()] = true
	}
	for code, v := range got.Options {
		if !skip[code] {
			t.Errorf("unexpected option %d = %v", code, v)
		}
	}
}

func TestHandle(t *testing.T) {
	lease := testLease(t)
	mac := lease.MAC
	foreign := net.HardwareAddr{0x52, 0x54, 0x00, 0xaa, 0xbb, 0xcc}
	withoutLeaseTimes := func() map[dhcpv4.OptionCode][]byte {
		w := wantOptions()
		delete(w, dhcpv4.OptionIPAddressLeaseTime)
		delete(w, dhcpv4.OptionRenewTimeValue)
		delete(w, dhcpv4.OptionRebindingTimeValue)
		return w
	}
	nakOptions := map[dhcpv4.OptionCode][]byte{
		dhcpv4.OptionServerIdentifier: {169, 254, 1, 1},
		dhcpv4.OptionMessage:          []byte("requested address is not this interface's address"),
	}

	for _, tc := range []struct {
		name       string
		req        *dhcpv4.DHCPv4
		wantType   dhcpv4.MessageType // 0: no reply
		wantYiaddr net.IP
		wantCiaddr net.IP
		wantOpts   map[dhcpv4.OptionCode][]byte
	}{{
		name:       "discover gets offer",
		req:        testMessage(t, mac, dhcpv4.MessageTypeDiscover, dhcpv4.WithBroadcast(true)),
		wantType:   dhcpv4.MessageTypeOffer,
		wantYiaddr: ip4("192.0.2.10"),
		wantCiaddr: ip4("0.0.0.0"),
		wantOpts:   wantOptions(),
	}, {
		name: "request selecting gets ack",
		req: testMessage(t, mac, dhcpv4.MessageTypeRequest,
			dhcpv4.WithOption(dhcpv4.OptServerIdentifier(ip4("169.254.1.1"))),
			dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(ip4("192.0.2.10")))),
		wantType:   dhcpv4.MessageTypeAck,
		wantYiaddr: ip4("192.0.2.10"),
		wantCiaddr: ip4("0.0.0.0"),
		wantOpts:   wantOptions(),
	}, {
		name: "request init-reboot gets ack",
		req: testMessage(t, mac, dhcpv4.MessageTypeRequest,
			dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(ip4("192.0.2.10")))),
		wantType:   dhcpv4.MessageTypeAck,
		wantYiaddr: ip4("192.0.2.10"),
		wantCiaddr: ip4("0.0.0.0"),
		wantOpts:   wantOptions(),
	}, {
		name:       "renew gets ack",
		req:        testMessage(t, mac, dhcpv4.MessageTypeRequest, dhcpv4.WithClientIP(ip4("192.0.2.10"))),
		wantType:   dhcpv4.MessageTypeAck,
		wantYiaddr: ip4("192.0.2.10"),
		wantCiaddr: ip4("192.0.2.10"),
		wantOpts:   wantOptions(),
	}, {
		name: "rebind gets ack",
		req: testMessage(t, mac, dhcpv4.MessageTypeRequest,
			dhcpv4.WithClientIP(ip4("192.0.2.10")), dhcpv4.WithBroadcast(true)),
		wantType:   dhcpv4.MessageTypeAck,
		wantYiaddr: ip4("192.0.2.10"),
		wantCiaddr: ip4("192.0.2.10"),
		wantOpts:   wantOptions(),
	}, {
		name: "wrong requested ip gets nak",
		req: testMessage(t, mac, dhcpv4.MessageTypeRequest,
			dhcpv4.WithOption(dhcpv4.OptServerIdentifier(ip4("169.254.1.1"))),
			dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(ip4("192.0.2.99")))),
		wantType:   dhcpv4.MessageTypeNak,
		wantYiaddr: ip4("0.0.0.0"),
		wantCiaddr: ip4("0.0.0.0"),
		wantOpts:   nakOptions,
	}, {
		name:       "wrong ciaddr gets nak",
		req:        testMessage(t, mac, dhcpv4.MessageTypeRequest, dhcpv4.WithClientIP(ip4("10.1.2.3"))),
		wantType:   dhcpv4.MessageTypeNak,
		wantYiaddr: ip4("0.0.0.0"),
		wantCiaddr: ip4("0.0.0.0"),
		wantOpts:   nakOptions,
	}, {
		name:     "foreign mac discover ignored",
		req:      testMessage(t, foreign, dhcpv4.MessageTypeDiscover),
		wantType: 0,
	}, {
		name: "foreign mac request ignored",
		req: testMessage(t, foreign, dhcpv4.MessageTypeRequest,
			dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(ip4("192.0.2.10")))),
		wantType: 0,
	}, {
		name: "request to another server ignored",
		req: testMessage(t, mac, dhcpv4.MessageTypeRequest,
			dhcpv4.WithOption(dhcpv4.OptServerIdentifier(ip4("192.0.2.2"))),
			dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(ip4("192.0.2.10")))),
		wantType: 0,
	}, {
		name:       "inform gets ack without lease",
		req:        testMessage(t, mac, dhcpv4.MessageTypeInform, dhcpv4.WithClientIP(ip4("192.0.2.10"))),
		wantType:   dhcpv4.MessageTypeAck,
		wantYiaddr: ip4("0.0.0.0"),
		wantCiaddr: ip4("192.0.2.10"),
		wantOpts:   withoutLeaseTimes(),
	}, {
		name: "release ignored",
		req: testMessage(t, mac, dhcpv4.MessageTypeRelease, dhcpv4.WithClientIP(ip4("192.0.2.10")),
			dhcpv4.WithOption(dhcpv4.OptServerIdentifier(ip4("169.254.1.1")))),
		wantType: 0,
	}, {
		name: "decline ignored",
		req: testMessage(t, mac, dhcpv4.MessageTypeDecline,
			dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(ip4("192.0.2.10")))),
		wantType: 0,
	}, {
		name: "boot reply ignored",
		req: testMessage(t, mac, dhcpv4.MessageTypeDiscover, func(d *dhcpv4.DHCPv4) {
			d.OpCode = dhcpv4.OpcodeBootReply
		}),
		wantType: 0,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			reply, err := Handle(tc.req, lease)
			if err != nil {
				t.Fatalf("Handle: %v", err)
			}
			if tc.wantType == 0 {
				if reply != nil {
					t.Fatalf("got %s, want no reply", reply.Summary())
				}
				return
			}
			if reply == nil {
				t.Fatalf("no reply, want %s", tc.wantType)
			}
			reply = wire(t, reply)
			if mt := reply.MessageType(); mt != tc.wantType {
				t.Fatalf("message type %s, want %s", mt, tc.wantType)
			}
			if reply.OpCode != dhcpv4.OpcodeBootReply || reply.TransactionID != testXID ||
				!bytes.Equal(reply.ClientHWAddr, mac) || reply.Flags != tc.req.Flags {
				t.Errorf("header: op %s xid %s chaddr %s flags %#x", reply.OpCode, reply.TransactionID, reply.ClientHWAddr, reply.Flags)
			}
			if !reply.YourIPAddr.Equal(tc.wantYiaddr) || !reply.ClientIPAddr.Equal(tc.wantCiaddr) ||
				!reply.ServerIPAddr.Equal(net.IPv4zero) || !reply.GatewayIPAddr.Equal(net.IPv4zero) {
				t.Errorf("addresses: yiaddr %s ciaddr %s siaddr %s giaddr %s, want yiaddr %s ciaddr %s",
					reply.YourIPAddr, reply.ClientIPAddr, reply.ServerIPAddr, reply.GatewayIPAddr, tc.wantYiaddr, tc.wantCiaddr)
			}
			checkOptions(t, reply, tc.wantOpts)
		})
	}
}

func TestHandleCopiesHeaderAndClientID(t *testing.T) {
	lease := testLease(t)
	req := testMessage(t, lease.MAC, dhcpv4.MessageTypeDiscover,
		dhcpv4.WithBroadcast(true),
		dhcpv4.WithGatewayIP(ip4("192.0.2.200")),
		dhcpv4.WithOption(dhcpv4.OptClientIdentifier([]byte{1, 0x52, 0x54, 0, 0x12, 0x34, 0x56})))
	reply, err := Handle(req, lease)
	if err != nil || reply == nil {
		t.Fatalf("Handle = %v, %v", reply, err)
	}
	reply = wire(t, reply)
	if !reply.IsBroadcast() || reply.TransactionID != testXID || !reply.GatewayIPAddr.Equal(ip4("192.0.2.200")) {
		t.Errorf("flags %#x xid %s giaddr %s", reply.Flags, reply.TransactionID, reply.GatewayIPAddr)
	}
	if got := reply.Options.Get(dhcpv4.OptionClientIdentifier); !bytes.Equal(got, []byte{1, 0x52, 0x54, 0, 0x12, 0x34, 0x56}) {
		t.Errorf("client identifier %v not echoed", got)
	}
}

func TestHandleOptionalOptions(t *testing.T) {
	lease := &Lease{
		MAC:       net.HardwareAddr{0x52, 0x54, 0x00, 0x12, 0x34, 0x56},
		IP:        net.ParseIP("10.88.3.4"),
		Mask:      net.CIDRMask(16, 32),
		ServerID:  net.ParseIP("169.254.1.1"),
		LeaseTime: time.Hour,
	}
	reply, err := Handle(testMessage(t, lease.MAC, dhcpv4.MessageTypeDiscover), lease)
	if err != nil || reply == nil {
		t.Fatalf("Handle = %v, %v", reply, err)
	}
	checkOptions(t, wire(t, reply), map[dhcpv4.OptionCode][]byte{
		dhcpv4.OptionSubnetMask:           {255, 255, 0, 0},
		dhcpv4.OptionBroadcastAddress:     {10, 88, 255, 255},
		dhcpv4.OptionServerIdentifier:     {169, 254, 1, 1},
		dhcpv4.OptionIPAddressLeaseTime:   {0, 0, 0x0e, 0x10}, // 3600
		dhcpv4.OptionRenewTimeValue:       {0, 0, 0x07, 0x08}, // 1800
		dhcpv4.OptionRebindingTimeValue:   {0, 0, 0x0c, 0x4e}, // 3150
		dhcpv4.OptionDomainNameServer:     nil,
		dhcpv4.OptionRouter:               nil,
		dhcpv4.OptionClasslessStaticRoute: nil,
		dhcpv4.OptionInterfaceMTU:         nil,
		dhcpv4.OptionHostName:             nil,
		dhcpv4.OptionDomainName:           nil,
		dhcpv4.OptionDNSDomainSearchList:  nil,
	})
}

func TestHandleRoutes(t *testing.T) {
	base := testLease(t)
	for _, tc := range []struct {
		name       string
		gateway    net.IP
		routes     []Route
		wantRouter []byte
		want121    []byte
	}{{
		name:       "default, on-link host and subnet routes",
		gateway:    base.Gateway,
		routes:     base.Routes,
		wantRouter: []byte{192, 0, 2, 1},
		want121:    []byte{0, 192, 0, 2, 1, 32, 169, 254, 1, 1, 0, 0, 0, 0, 24, 198, 51, 100, 192, 0, 2, 254},
	}, {
		name:    "explicit 0.0.0.0/0 counts as default",
		gateway: ip4("192.0.2.1"),
		routes: []Route{
			{Dst: mustCIDR(t, "0.0.0.0/0"), Gw: ip4("192.0.2.1")},
			{Dst: mustCIDR(t, "169.254.1.1/32")},
		},
		wantRouter: []byte{192, 0, 2, 1},
		want121:    []byte{0, 192, 0, 2, 1, 32, 169, 254, 1, 1, 0, 0, 0, 0},
	}, {
		name:       "gateway without default route adds one to 121",
		gateway:    ip4("192.0.2.1"),
		routes:     []Route{{Dst: mustCIDR(t, "169.254.1.1/32")}},
		wantRouter: []byte{192, 0, 2, 1},
		want121:    []byte{32, 169, 254, 1, 1, 0, 0, 0, 0, 0, 192, 0, 2, 1},
	}, {
		name:    "no gateway: 121 only, no default added",
		routes:  []Route{{Dst: mustCIDR(t, "10.0.0.0/8"), Gw: ip4("192.0.2.254")}, {Dst: mustCIDR(t, "169.254.1.1/32")}},
		want121: []byte{8, 10, 192, 0, 2, 254, 32, 169, 254, 1, 1, 0, 0, 0, 0},
	}, {
		name:       "gateway without routes: option 3 only",
		gateway:    ip4("192.0.2.1"),
		wantRouter: []byte{192, 0, 2, 1},
	}, {
		name:    "host bits in a destination are masked, 16-byte mask accepted",
		routes:  []Route{{Dst: &net.IPNet{IP: net.ParseIP("172.16.5.6"), Mask: net.CIDRMask(108, 128)}, Gw: ip4("192.0.2.254")}},
		want121: []byte{12, 172, 16, 192, 0, 2, 254},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			lease := *base
			lease.Gateway, lease.Routes = tc.gateway, tc.routes
			reply, err := Handle(testMessage(t, lease.MAC, dhcpv4.MessageTypeDiscover), &lease)
			if err != nil || reply == nil {
				t.Fatalf("Handle = %v, %v", reply, err)
			}
			reply = wire(t, reply)
			if got := reply.Options.Get(dhcpv4.OptionRouter); !bytes.Equal(got, tc.wantRouter) {
				t.Errorf("option 3 = %v, want %v", got, tc.wantRouter)
			}
			if got := reply.Options.Get(dhcpv4.OptionClasslessStaticRoute); !bytes.Equal(got, tc.want121) {
				t.Errorf("option 121 = %v, want %v", got, tc.want121)
			}
			if tc.want121 != nil && len(reply.ClasslessStaticRoute()) == 0 {
				t.Error("option 121 does not decode")
			}
		})
	}
}

func TestHandleErrors(t *testing.T) {
	good := testLease(t)
	noAddr := testMessage(t, good.MAC, dhcpv4.MessageTypeRequest)
	discover := testMessage(t, good.MAC, dhcpv4.MessageTypeDiscover)
	bad := func(f func(l *Lease)) *Lease {
		l := *testLease(t)
		f(&l)
		return &l
	}
	for _, tc := range []struct {
		name  string
		req   *dhcpv4.DHCPv4
		lease *Lease
	}{
		{"nil message", nil, good},
		{"nil lease", discover, nil},
		{"request naming no address", noAddr, good},
		{"ipv6 lease address", discover, bad(func(l *Lease) { l.IP = net.ParseIP("2001:db8::1") })},
		{"no mask", discover, bad(func(l *Lease) { l.Mask = nil })},
		{"no server id", discover, bad(func(l *Lease) { l.ServerID = nil })},
		{"short mac", discover, bad(func(l *Lease) { l.MAC = l.MAC[:4] })},
		{"ipv6 dns", discover, bad(func(l *Lease) { l.DNS = []net.IP{net.ParseIP("2001:db8::53")} })},
		{"ipv6 route", discover, bad(func(l *Lease) { l.Routes = []Route{{Dst: mustCIDR(t, "2001:db8::/32")}} })},
		{"tiny mtu", discover, bad(func(l *Lease) { l.MTU = 20 })},
		{"sub-second lease", discover, bad(func(l *Lease) { l.LeaseTime = time.Millisecond })},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reply, err := Handle(tc.req, tc.lease)
			if reply != nil || !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("Handle = %v, %v; want ErrInvalidArgument", reply, err)
			}
		})
	}
}
