package network

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/insomniacslk/dhcp/dhcpv6"
	"github.com/insomniacslk/dhcp/iana"
)

var (
	testXID6        = dhcpv6.TransactionID{0xca, 0xfe, 0x01}
	testServerDUID6 = &dhcpv6.DUIDLL{HWType: iana.HWTypeEthernet, LinkLayerAddr: testServerMAC}
	testClientDUID6 = &dhcpv6.DUIDLLT{HWType: iana.HWTypeEthernet, Time: 0x2c0ffee, LinkLayerAddr: testClientMAC}
	foreignDUID6    = &dhcpv6.DUIDEN{EnterpriseNumber: 32473, EnterpriseIdentifier: []byte("another server")}
)

// testLease6 is a fully populated IPv6 lease: an on-link prefix, a
// router, MTU, two name servers and two search domains.
func testLease6(t testing.TB) *Lease6 {
	t.Helper()
	return &Lease6{
		MAC:    testClientMAC,
		IP:     net.ParseIP("2001:db8:1::10"),
		OnLink: []*net.IPNet{mustCIDR(t, "2001:db8:1::/64")},
		Router: true,
		MTU:    1450,
		DNS:    []net.IP{net.ParseIP("2001:db8::53"), net.ParseIP("fd00::54")},
		Search: []string{"pod.example", "example."},
	}
}

// testMsg6 builds a client message of type mt with opts and passes it through
// its wire form.
func testMsg6(t testing.TB, mt dhcpv6.MessageType, opts ...dhcpv6.Option) *dhcpv6.Message {
	t.Helper()
	m := &dhcpv6.Message{MessageType: mt, TransactionID: testXID6}
	for _, o := range opts {
		m.AddOption(o)
	}
	out, err := dhcpv6.MessageFromBytes(m.ToBytes())
	if err != nil {
		t.Fatalf("message does not parse: %v", err)
	}
	return out
}

// testIANA6 is an IA_NA with iaid id holding addrs.
func testIANA6(id byte, addrs ...string) dhcpv6.Option {
	ia := &dhcpv6.OptIANA{IaId: [4]byte{0, 0, 0, id}, T1: time.Hour, T2: 2 * time.Hour}
	for _, a := range addrs {
		ia.Options.Add(&dhcpv6.OptIAAddress{IPv6Addr: net.ParseIP(a), PreferredLifetime: time.Hour, ValidLifetime: 2 * time.Hour})
	}
	return ia
}

var (
	testCID6        = dhcpv6.OptClientID(testClientDUID6)
	testSID6        = dhcpv6.OptServerID(testServerDUID6)
	testForeignSID6 = dhcpv6.OptServerID(foreignDUID6)
	testRapid6      = &dhcpv6.OptionGeneric{OptionCode: dhcpv6.OptionRapidCommit}
	testIATA6       = &dhcpv6.OptIATA{IaId: [4]byte{0, 0, 0, 7}}
	testIAPD6       = &dhcpv6.OptIAPD{IaId: [4]byte{0, 0, 0, 9}}
	testLeaseIA6    = "na1[43200 69120 2001:db8:1::10 86400/86400]"
)

// describeIAs6 summarises the IA options of m in order, one word each:
// "na<iaid>[<t1> <t2> <address> <preferred>/<valid> ... <status>]" (times
// in seconds), "ta<iaid>[...]", "pd<iaid>[...]".
func describeIAs6(m *dhcpv6.Message) string {
	var words []string
	sub := func(opts dhcpv6.Options) string {
		var s []string
		for _, o := range opts {
			switch o := o.(type) {
			case *dhcpv6.OptIAAddress:
				s = append(s, fmt.Sprintf("%s %d/%d", o.IPv6Addr, int64(o.PreferredLifetime/time.Second), int64(o.ValidLifetime/time.Second)))
			case *dhcpv6.OptStatusCode:
				s = append(s, o.StatusCode.String())
			default:
				s = append(s, o.Code().String())
			}
		}
		return strings.Join(s, " ")
	}
	secs := func(d time.Duration) int64 { return int64(d / time.Second) }
	for _, o := range m.Options.Options {
		switch ia := o.(type) {
		case *dhcpv6.OptIANA:
			words = append(words, strings.TrimSpace(fmt.Sprintf("na%x[%d %d %s", ia.IaId[3], secs(ia.T1), secs(ia.T2), sub(ia.Options.Options)))+"]")
		case *dhcpv6.OptIATA:
			words = append(words, fmt.Sprintf("ta%x[%s]", ia.IaId[3], sub(ia.Options.Options)))
		case *dhcpv6.OptIAPD:
			words = append(words, fmt.Sprintf("pd%x[%d %d %s]", ia.IaId[3], secs(ia.T1), secs(ia.T2), sub(ia.Options.Options)))
		}
	}
	return strings.Join(words, " ")
}

// dhcp6Status is the name of m's top-level status code, "" without one.
func dhcp6Status(m *dhcpv6.Message) string {
	if s := m.Options.Status(); s != nil {
		return s.StatusCode.String()
	}
	return ""
}

// wireDHCP6 passes a reply through its wire form, as the client sees it.
func wireDHCP6(t testing.TB, m *dhcpv6.Message) *dhcpv6.Message {
	t.Helper()
	out, err := dhcpv6.MessageFromBytes(m.ToBytes())
	if err != nil {
		t.Fatalf("reply does not parse: %v", err)
	}
	return out
}

func TestHandle6(t *testing.T) {
	lease := testLease6(t)
	const (
		advertise = dhcpv6.MessageTypeAdvertise
		reply     = dhcpv6.MessageTypeReply
		none      = dhcpv6.MessageTypeNone
	)
	for _, tc := range []struct {
		name       string
		req        *dhcpv6.Message
		wantType   dhcpv6.MessageType // none: no reply
		wantStatus string             // top-level status code
		wantIAs    string             // describeIAs6
		noConfig   bool               // no name servers and search list
		noClientID bool
	}{
		// Solicit.
		{name: "solicit gets advertise", req: testMsg6(t, dhcpv6.MessageTypeSolicit, testCID6, testIANA6(1)),
			wantType: advertise, wantIAs: testLeaseIA6},
		{name: "solicit hint for another address gets the lease's alone",
			req:      testMsg6(t, dhcpv6.MessageTypeSolicit, testCID6, testIANA6(1, "2001:db8:9::1")),
			wantType: advertise, wantIAs: testLeaseIA6},
		{name: "solicit with rapid commit gets reply", req: testMsg6(t, dhcpv6.MessageTypeSolicit, testCID6, testRapid6, testIANA6(1, "2001:db8:9::1")),
			wantType: reply, wantIAs: "na1[43200 69120 2001:db8:1::10 86400/86400 2001:db8:9::1 0/0]"},
		{name: "solicit without ia_na gets NoAddrsAvail alone", req: testMsg6(t, dhcpv6.MessageTypeSolicit, testCID6, testIATA6, testIAPD6),
			wantType: advertise, wantStatus: "NoAddrsAvail", noConfig: true},
		{name: "rapid solicit without ia_na gets NoAddrsAvail advertise", req: testMsg6(t, dhcpv6.MessageTypeSolicit, testCID6, testRapid6),
			wantType: advertise, wantStatus: "NoAddrsAvail", noConfig: true},
		{name: "solicit with ia_ta and ia_pd", req: testMsg6(t, dhcpv6.MessageTypeSolicit, testCID6, testIAPD6, testIANA6(1), testIATA6),
			wantType: advertise, wantIAs: "pd9[0 0 NoPrefixAvail] " + testLeaseIA6 + " ta7[NoAddrsAvail]"},
		{name: "solicit with two ia_na", req: testMsg6(t, dhcpv6.MessageTypeSolicit, testCID6, testIANA6(1), testIANA6(2, "2001:db8:1::10")),
			wantType: advertise, wantIAs: testLeaseIA6 + " na2[0 0 NoAddrsAvail]"},
		{name: "solicit naming this server ignored", req: testMsg6(t, dhcpv6.MessageTypeSolicit, testCID6, testSID6, testIANA6(1))},
		{name: "solicit naming another server ignored", req: testMsg6(t, dhcpv6.MessageTypeSolicit, testCID6, testForeignSID6, testIANA6(1))},
		{name: "solicit without client id ignored", req: testMsg6(t, dhcpv6.MessageTypeSolicit, testIANA6(1))},

		// Request.
		{name: "request gets reply", req: testMsg6(t, dhcpv6.MessageTypeRequest, testCID6, testSID6, testIANA6(1, "2001:db8:1::10")),
			wantType: reply, wantIAs: testLeaseIA6},
		{name: "request for another address", req: testMsg6(t, dhcpv6.MessageTypeRequest, testCID6, testSID6, testIANA6(1, "2001:db8:9::1")),
			wantType: reply, wantIAs: "na1[43200 69120 2001:db8:1::10 86400/86400 2001:db8:9::1 0/0]"},
		{name: "request without ia_na gets NoAddrsAvail", req: testMsg6(t, dhcpv6.MessageTypeRequest, testCID6, testSID6, testIAPD6),
			wantType: reply, wantStatus: "NoAddrsAvail", wantIAs: "pd9[0 0 NoPrefixAvail]"},
		{name: "request with two ia_na", req: testMsg6(t, dhcpv6.MessageTypeRequest, testCID6, testSID6, testIANA6(2), testIANA6(1)),
			wantType: reply, wantIAs: "na2[43200 69120 2001:db8:1::10 86400/86400] na1[0 0 NoAddrsAvail]"},
		{name: "request to another server ignored", req: testMsg6(t, dhcpv6.MessageTypeRequest, testCID6, testForeignSID6, testIANA6(1))},
		{name: "request without server id ignored", req: testMsg6(t, dhcpv6.MessageTypeRequest, testCID6, testIANA6(1))},
		{name: "request without client id ignored", req: testMsg6(t, dhcpv6.MessageTypeRequest, testSID6, testIANA6(1))},

		// Renew and Rebind.
		{name: "renew gets reply", req: testMsg6(t, dhcpv6.MessageTypeRenew, testCID6, testSID6, testIANA6(1, "2001:db8:1::10")),
			wantType: reply, wantIAs: testLeaseIA6},
		{name: "renew with a foreign address drops it", req: testMsg6(t, dhcpv6.MessageTypeRenew, testCID6, testSID6,
			testIANA6(1, "2001:db8:1::10", "2001:db8:9::1", "2001:db8:9::1", "2001:db8:1::10")),
			wantType: reply, wantIAs: "na1[43200 69120 2001:db8:1::10 86400/86400 2001:db8:9::1 0/0]"},
		{name: "renew without ia_na gets configuration", req: testMsg6(t, dhcpv6.MessageTypeRenew, testCID6, testSID6),
			wantType: reply},
		{name: "renew to another server ignored", req: testMsg6(t, dhcpv6.MessageTypeRenew, testCID6, testForeignSID6, testIANA6(1))},
		{name: "renew without server id ignored", req: testMsg6(t, dhcpv6.MessageTypeRenew, testCID6, testIANA6(1))},
		{name: "rebind gets reply", req: testMsg6(t, dhcpv6.MessageTypeRebind, testCID6, testIANA6(1, "2001:db8:9::1", "2001:db8:1::10")),
			wantType: reply, wantIAs: "na1[43200 69120 2001:db8:1::10 86400/86400 2001:db8:9::1 0/0]"},
		{name: "rebind naming a server ignored", req: testMsg6(t, dhcpv6.MessageTypeRebind, testCID6, testSID6, testIANA6(1))},
		{name: "rebind without client id ignored", req: testMsg6(t, dhcpv6.MessageTypeRebind, testIANA6(1))},

		// Confirm.
		{name: "confirm on link", req: testMsg6(t, dhcpv6.MessageTypeConfirm, testCID6, testIANA6(1, "2001:db8:1::10")),
			wantType: reply, wantStatus: "Success"},
		{name: "confirm off link", req: testMsg6(t, dhcpv6.MessageTypeConfirm, testCID6, testIANA6(1, "2001:db8:9::1")),
			wantType: reply, wantStatus: "NotOnLink"},
		{name: "confirm with one address off link", req: testMsg6(t, dhcpv6.MessageTypeConfirm, testCID6, testIANA6(1, "2001:db8:1::10"), testIANA6(2, "2001:db8:1::11")),
			wantType: reply, wantStatus: "NotOnLink"},
		{name: "confirm of an ia_ta address", req: testMsg6(t, dhcpv6.MessageTypeConfirm, testCID6, testIANA6(1, "2001:db8:1::10"),
			&dhcpv6.OptIATA{IaId: [4]byte{7}, Options: dhcpv6.IdentityOptions{Options: dhcpv6.Options{&dhcpv6.OptIAAddress{IPv6Addr: net.ParseIP("2001:db8:9::7")}}}}),
			wantType: reply, wantStatus: "NotOnLink"},
		{name: "confirm without addresses ignored", req: testMsg6(t, dhcpv6.MessageTypeConfirm, testCID6, testIANA6(1))},
		{name: "confirm naming a server ignored", req: testMsg6(t, dhcpv6.MessageTypeConfirm, testCID6, testSID6, testIANA6(1, "2001:db8:1::10"))},

		// Release and Decline.
		{name: "release gets success", req: testMsg6(t, dhcpv6.MessageTypeRelease, testCID6, testSID6, testIANA6(1, "2001:db8:1::10")),
			wantType: reply, wantStatus: "Success"},
		{name: "decline gets success", req: testMsg6(t, dhcpv6.MessageTypeDecline, testCID6, testSID6, testIANA6(1, "2001:db8:1::10")),
			wantType: reply, wantStatus: "Success"},
		{name: "release to another server ignored", req: testMsg6(t, dhcpv6.MessageTypeRelease, testCID6, testForeignSID6, testIANA6(1, "2001:db8:1::10"))},
		{name: "decline without server id ignored", req: testMsg6(t, dhcpv6.MessageTypeDecline, testCID6, testIANA6(1, "2001:db8:1::10"))},

		// Information-request.
		{name: "information-request gets configuration", req: testMsg6(t, dhcpv6.MessageTypeInformationRequest, testCID6),
			wantType: reply},
		{name: "information-request without client id", req: testMsg6(t, dhcpv6.MessageTypeInformationRequest),
			wantType: reply, noClientID: true},
		{name: "information-request naming this server", req: testMsg6(t, dhcpv6.MessageTypeInformationRequest, testCID6, testSID6),
			wantType: reply},
		{name: "information-request naming another server ignored", req: testMsg6(t, dhcpv6.MessageTypeInformationRequest, testCID6, testForeignSID6)},
		{name: "information-request with an ia ignored", req: testMsg6(t, dhcpv6.MessageTypeInformationRequest, testCID6, testIANA6(1))},

		// Not client messages.
		{name: "advertise ignored", req: testMsg6(t, dhcpv6.MessageTypeAdvertise, testCID6, testSID6, testIANA6(1))},
		{name: "reply ignored", req: testMsg6(t, dhcpv6.MessageTypeReply, testCID6, testSID6, testIANA6(1))},
		{name: "reconfigure ignored", req: testMsg6(t, dhcpv6.MessageTypeReconfigure, testCID6, testSID6)},
		{name: "relay-forw ignored", req: &dhcpv6.Message{MessageType: dhcpv6.MessageTypeRelayForward, Options: dhcpv6.MessageOptions{Options: dhcpv6.Options{testCID6, testIANA6(1)}}}},
		{name: "unknown type ignored", req: testMsg6(t, 200, testCID6, testIANA6(1))},
		{name: "client id over 128 octets ignored", req: testMsg6(t, dhcpv6.MessageTypeSolicit,
			dhcpv6.OptClientID(&dhcpv6.DUIDEN{EnterpriseNumber: 1, EnterpriseIdentifier: make([]byte, 125)}), testIANA6(1))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Handle6(tc.req, lease, testServerDUID6)
			if err != nil {
				t.Fatalf("Handle6: %v", err)
			}
			if tc.wantType == none {
				if got != nil {
					t.Fatalf("got %s, want no reply", got.Summary())
				}
				return
			}
			if got == nil {
				t.Fatalf("no reply, want %s", tc.wantType)
			}
			got = wireDHCP6(t, got)
			if got.MessageType != tc.wantType || got.TransactionID != testXID6 {
				t.Fatalf("reply %s xid %s, want %s xid %s", got.MessageType, got.TransactionID, tc.wantType, testXID6)
			}
			if sid := got.Options.ServerID(); sid == nil || !bytes.Equal(sid.ToBytes(), testServerDUID6.ToBytes()) {
				t.Errorf("server id %v", sid)
			}
			if cid := got.Options.ClientID(); tc.noClientID != (cid == nil) ||
				cid != nil && !bytes.Equal(cid.ToBytes(), tc.req.Options.ClientID().ToBytes()) {
				t.Errorf("client id %v, request's %v", cid, tc.req.Options.ClientID())
			}
			if s := dhcp6Status(got); s != tc.wantStatus {
				t.Errorf("status %q, want %q", s, tc.wantStatus)
			}
			if ias := describeIAs6(got); ias != tc.wantIAs {
				t.Errorf("IAs\n  %s\nwant\n  %s", ias, tc.wantIAs)
			}
			wantRapid := tc.req.Options.GetOne(dhcpv6.OptionRapidCommit) != nil && tc.wantType == reply
			if gotRapid := got.GetOneOption(dhcpv6.OptionRapidCommit) != nil; gotRapid != wantRapid {
				t.Errorf("rapid commit %v, want %v", gotRapid, wantRapid)
			}
			wantPref := tc.wantType == advertise && tc.wantStatus == ""
			if p := got.GetOneOption(dhcpv6.OptionPreference); (p != nil) != wantPref || p != nil && got.Options.Preference() != 255 {
				t.Errorf("preference %v, want it %v", p, wantPref)
			}
			checkConfig6(t, got, !tc.noConfig)
		})
	}
}

// checkConfig6 checks that m carries testLease6's name servers and search
// list when want, and neither otherwise.
func checkConfig6(t *testing.T, m *dhcpv6.Message, want bool) {
	t.Helper()
	dns, search := m.Options.DNS(), m.Options.DomainSearchList()
	if !want {
		if m.GetOneOption(dhcpv6.OptionDNSRecursiveNameServer) != nil || m.GetOneOption(dhcpv6.OptionDomainSearchList) != nil {
			t.Errorf("configuration in the reply: dns %v search %v", dns, search)
		}
		return
	}
	if len(dns) != 2 || !dns[0].Equal(net.ParseIP("2001:db8::53")) || !dns[1].Equal(net.ParseIP("fd00::54")) {
		t.Errorf("dns %v", dns)
	}
	if search == nil || !slices.Equal(search.Labels, []string{"pod.example", "example"}) {
		t.Errorf("search %v", search)
	}
}

func TestHandle6Lifetimes(t *testing.T) {
	for _, tc := range []struct {
		lease time.Duration
		want  string
	}{
		{0, testLeaseIA6},
		{90 * time.Minute, "na1[2700 4320 2001:db8:1::10 5400/5400]"},
		{1500 * time.Millisecond, "na1[0 0 2001:db8:1::10 1/1]"},
		{11 * time.Second, "na1[5 8 2001:db8:1::10 11/11]"},
		{time.Duration(1<<32-2) * time.Second, "na1[2147483647 3435973835 2001:db8:1::10 4294967294/4294967294]"},
	} {
		t.Run(tc.lease.String(), func(t *testing.T) {
			lease := testLease6(t)
			lease.LeaseTime = tc.lease
			got, err := Handle6(testMsg6(t, dhcpv6.MessageTypeRequest, testCID6, testSID6, testIANA6(1)), lease, testServerDUID6)
			if err != nil || got == nil {
				t.Fatalf("Handle6 = %v, %v", got, err)
			}
			if ias := describeIAs6(wireDHCP6(t, got)); ias != tc.want {
				t.Errorf("IAs %s, want %s", ias, tc.want)
			}
		})
	}
}

func TestHandle6OptionalOptions(t *testing.T) {
	lease := &Lease6{MAC: testClientMAC, IP: net.ParseIP("fd00:10:244::5")}
	for _, mt := range []dhcpv6.MessageType{dhcpv6.MessageTypeSolicit, dhcpv6.MessageTypeRebind, dhcpv6.MessageTypeInformationRequest} {
		got, err := Handle6(testMsg6(t, mt, testCID6, testIANA6(1)), lease, testServerDUID6)
		if mt == dhcpv6.MessageTypeInformationRequest {
			got, err = Handle6(testMsg6(t, mt, testCID6), lease, testServerDUID6)
		}
		if err != nil || got == nil {
			t.Fatalf("%s: Handle6 = %v, %v", mt, got, err)
		}
		checkConfig6(t, wireDHCP6(t, got), false)
	}
}

func TestHandle6Bounds(t *testing.T) {
	lease := testLease6(t)
	var addrs []string
	for i := range 10 {
		addrs = append(addrs, fmt.Sprintf("2001:db8:9::%d", i+1))
	}
	opts := []dhcpv6.Option{testCID6, testSID6, testIANA6(1, addrs...)}
	for i := range 10 {
		opts = append(opts, testIANA6(byte(i+2), addrs...), testIATA6, testIAPD6)
	}
	req := testMsg6(t, dhcpv6.MessageTypeRenew, opts...)
	got, err := Handle6(req, lease, testServerDUID6)
	if err != nil || got == nil {
		t.Fatalf("Handle6 = %v, %v", got, err)
	}
	want := "na1[43200 69120 2001:db8:1::10 86400/86400 2001:db8:9::1 0/0 2001:db8:9::2 0/0 2001:db8:9::3 0/0 2001:db8:9::4 0/0]" +
		" na2[0 0 NoAddrsAvail] ta7[NoAddrsAvail] pd9[0 0 NoPrefixAvail]"
	if ias := describeIAs6(wireDHCP6(t, got)); ias != want {
		t.Errorf("IAs\n  %s\nwant\n  %s", ias, want)
	}
	if n := len(got.ToBytes()); n > 1280-ipv6HeaderLen-udpHeaderLen {
		t.Errorf("reply of %d bytes", n)
	}
}

func TestHandle6LeavesArgumentsAlone(t *testing.T) {
	lease := testLease6(t)
	before := *testLease6(t)
	req := testMsg6(t, dhcpv6.MessageTypeRenew, testCID6, testSID6, testIANA6(1, "2001:db8:9::1"))
	reqBytes := req.ToBytes()
	got, err := Handle6(req, lease, testServerDUID6)
	if err != nil || got == nil {
		t.Fatalf("Handle6 = %v, %v", got, err)
	}
	// The reply shares nothing with the lease or the request.
	for _, ia := range got.Options.IANA() {
		for _, a := range ia.Options.Addresses() {
			clear(a.IPv6Addr)
		}
	}
	clear(got.Options.DNS()[0])
	if !reflect.DeepEqual(*lease, before) {
		t.Errorf("lease changed: %+v", *lease)
	}
	if !bytes.Equal(req.ToBytes(), reqBytes) {
		t.Error("request changed")
	}
}

func TestHandle6Errors(t *testing.T) {
	req := testMsg6(t, dhcpv6.MessageTypeSolicit, testCID6, testIANA6(1))
	lease := testLease6(t)
	for _, tc := range []struct {
		name  string
		req   *dhcpv6.Message
		lease *Lease6
		sid   dhcpv6.DUID
	}{
		{"nil message", nil, lease, testServerDUID6},
		{"nil lease", req, nil, testServerDUID6},
		{"nil server id", req, lease, nil},
		{"nil server id pointer", req, lease, (*dhcpv6.DUIDLL)(nil)},
		{"bad lease", req, &Lease6{MAC: testClientMAC, IP: net.ParseIP("192.0.2.1")}, testServerDUID6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Handle6(tc.req, tc.lease, tc.sid)
			if got != nil || !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("Handle6 = %v, %v; want ErrInvalidArgument", got, err)
			}
		})
	}
}

func TestCheckLease6(t *testing.T) {
	mod := func(f func(l *Lease6)) *Lease6 {
		l := testLease6(t)
		f(l)
		return l
	}
	for _, tc := range []struct {
		name  string
		lease *Lease6
		ok    bool
	}{
		{"full", testLease6(t), true},
		{"minimal", &Lease6{MAC: testClientMAC, IP: net.ParseIP("2001:db8::1")}, true},
		{"ula", mod(func(l *Lease6) { l.IP = net.ParseIP("fd00::1") }), true},
		{"longest lease", mod(func(l *Lease6) { l.LeaseTime = time.Duration(1<<32-2) * time.Second }), true},
		{"shortest lease", mod(func(l *Lease6) { l.LeaseTime = time.Second }), true},
		{"mtu bounds", mod(func(l *Lease6) { l.MTU = 1280 }), true},
		{"mtu 65535", mod(func(l *Lease6) { l.MTU = 65535 }), true},
		{"link-local dns", mod(func(l *Lease6) { l.DNS = []net.IP{net.ParseIP("fe80::53")} }), true},

		{"nil mac", mod(func(l *Lease6) { l.MAC = nil }), false},
		{"long mac", mod(func(l *Lease6) { l.MAC = make(net.HardwareAddr, 8) }), false},
		{"nil ip", mod(func(l *Lease6) { l.IP = nil }), false},
		{"ipv4 ip", mod(func(l *Lease6) { l.IP = net.ParseIP("192.0.2.10") }), false},
		{"4-byte ipv4 ip", mod(func(l *Lease6) { l.IP = net.ParseIP("192.0.2.10").To4() }), false},
		{"link-local ip", mod(func(l *Lease6) { l.IP = net.ParseIP("fe80::10") }), false},
		{"multicast ip", mod(func(l *Lease6) { l.IP = net.ParseIP("ff02::1:2") }), false},
		{"unspecified ip", mod(func(l *Lease6) { l.IP = net.IPv6unspecified }), false},
		{"loopback ip", mod(func(l *Lease6) { l.IP = net.IPv6loopback }), false},
		{"nil on-link prefix", mod(func(l *Lease6) { l.OnLink = append(l.OnLink, nil) }), false},
		{"ipv4 on-link prefix", mod(func(l *Lease6) { l.OnLink = []*net.IPNet{mustCIDR(t, "192.0.2.0/24")} }), false},
		{"ipv4 mask on ipv6 prefix", mod(func(l *Lease6) {
			l.OnLink = []*net.IPNet{{IP: net.ParseIP("2001:db8::"), Mask: net.CIDRMask(24, 32)}}
		}), false},
		{"link-local on-link prefix", mod(func(l *Lease6) { l.OnLink = []*net.IPNet{mustCIDR(t, "fe80::/64")} }), false},
		{"mtu too small", mod(func(l *Lease6) { l.MTU = 1279 }), false},
		{"mtu too big", mod(func(l *Lease6) { l.MTU = 65536 }), false},
		{"negative mtu", mod(func(l *Lease6) { l.MTU = -1 }), false},
		{"sub-second lease", mod(func(l *Lease6) { l.LeaseTime = time.Millisecond }), false},
		{"infinite lease", mod(func(l *Lease6) { l.LeaseTime = time.Duration(1<<32-1) * time.Second }), false},
		{"negative lease", mod(func(l *Lease6) { l.LeaseTime = -time.Hour }), false},
		{"ipv4 dns", mod(func(l *Lease6) { l.DNS = []net.IP{net.ParseIP("192.0.2.53")} }), false},
		{"nil dns", mod(func(l *Lease6) { l.DNS = []net.IP{nil} }), false},
		{"multicast dns", mod(func(l *Lease6) { l.DNS = []net.IP{net.ParseIP("ff02::fb")} }), false},
		{"empty search name", mod(func(l *Lease6) { l.Search = []string{""} }), false},
		{"root search name", mod(func(l *Lease6) { l.Search = []string{"."} }), false},
		{"empty label", mod(func(l *Lease6) { l.Search = []string{"a..example"} }), false},
		{"long label", mod(func(l *Lease6) { l.Search = []string{strings.Repeat("a", 64) + ".example"} }), false},
		{"long name", mod(func(l *Lease6) { l.Search = []string{strings.Repeat("abcdefg.", 32) + "example"} }), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkLease6(tc.lease)
			if tc.ok && err != nil {
				t.Fatalf("checkLease6: %v", err)
			}
			if !tc.ok && !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("checkLease6 = %v, want ErrInvalidArgument", err)
			}
			if !tc.ok {
				// Handle6 refuses what checkLease6 does.
				if got, err := Handle6(testMsg6(t, dhcpv6.MessageTypeSolicit, testCID6, testIANA6(1)), tc.lease, testServerDUID6); got != nil || err == nil {
					t.Errorf("Handle6 = %v, %v", got, err)
				}
			}
		})
	}
}

func TestDHCP6Helpers(t *testing.T) {
	for mt, want := range map[dhcpv6.MessageType]string{
		dhcpv6.MessageTypeSolicit:            "solicit",
		dhcpv6.MessageTypeDecline:            "decline",
		dhcpv6.MessageTypeInformationRequest: "information-request",
		200:                                  "unknown (200)",
	} {
		if got := dhcp6Name(mt); got != want {
			t.Errorf("dhcp6Name(%d) = %q, want %q", mt, got, want)
		}
	}
	m := testMsg6(t, dhcpv6.MessageTypeDecline, testCID6, testSID6, testIANA6(1, "2001:db8:1::10", "2001:db8:1::11"), testIAPD6,
		&dhcpv6.OptIATA{IaId: [4]byte{7}, Options: dhcpv6.IdentityOptions{Options: dhcpv6.Options{&dhcpv6.OptIAAddress{IPv6Addr: net.ParseIP("2001:db8:9::7")}}}})
	got := fmt.Sprint(dhcp6Addrs(m))
	if want := "[2001:db8:1::10 2001:db8:1::11 2001:db8:9::7]"; got != want {
		t.Errorf("dhcp6Addrs = %s, want %s", got, want)
	}
}
