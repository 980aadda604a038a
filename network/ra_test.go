package network

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/mdlayher/ndp"
)

// roundTripRA marshals ra and parses it back, as the guest would.
func roundTripRA(t *testing.T, ra *ndp.RouterAdvertisement) *ndp.RouterAdvertisement {
	t.Helper()
	b, err := ndp.MarshalMessage(ra)
	if err != nil {
		t.Fatalf("marshal: %v", err)
	}
	m, err := ndp.ParseMessage(b)
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	got, ok := m.(*ndp.RouterAdvertisement)
	if !ok {
		t.Fatalf("parsed a %T", m)
	}
	return got
}

func TestRouterAdvertisement(t *testing.T) {
	full := testLease6(t)
	full.OnLink = append(full.OnLink, &net.IPNet{IP: net.ParseIP("fd00:1:2:3:4::1"), Mask: net.CIDRMask(48, 128)})
	sll := &ndp.LinkLayerAddress{Direction: ndp.Source, Addr: testServerMAC}
	pio := func(prefix string, life time.Duration) *ndp.PrefixInformation {
		p := netip.MustParsePrefix(prefix)
		return &ndp.PrefixInformation{PrefixLength: uint8(p.Bits()), OnLink: true, ValidLifetime: life, PreferredLifetime: life, Prefix: p.Addr()}
	}
	for _, tc := range []struct {
		name  string
		lease *Lease6
		want  *ndp.RouterAdvertisement
	}{{
		name:  "full",
		lease: full,
		want: &ndp.RouterAdvertisement{
			CurrentHopLimit: 64, ManagedConfiguration: true, OtherConfiguration: true,
			RouterLifetime: 30 * time.Minute,
			Options: []ndp.Option{
				sll,
				ndp.NewMTU(1450),
				pio("2001:db8:1::/64", 24*time.Hour),
				pio("fd00:1:2::/48", 24*time.Hour), // host bits cleared
				&ndp.RecursiveDNSServer{Lifetime: 30 * time.Minute, Servers: []netip.Addr{
					netip.MustParseAddr("2001:db8::53"), netip.MustParseAddr("fd00::54")}},
				&ndp.DNSSearchList{Lifetime: 30 * time.Minute, DomainNames: []string{"pod.example", "example"}},
			},
		},
	}, {
		name:  "no router, mtu, dns or search; lease time",
		lease: &Lease6{MAC: testClientMAC, IP: net.ParseIP("2001:db8:1::10"), OnLink: []*net.IPNet{mustCIDR(t, "2001:db8:1::/64")}, LeaseTime: 90*time.Minute + 500*time.Millisecond},
		want: &ndp.RouterAdvertisement{
			CurrentHopLimit: 64, ManagedConfiguration: true, OtherConfiguration: true,
			Options: []ndp.Option{sll, pio("2001:db8:1::/64", 90*time.Minute)},
		},
	}, {
		name:  "router without on-link prefix",
		lease: &Lease6{MAC: testClientMAC, IP: net.ParseIP("2001:db8:1::10"), Router: true},
		want: &ndp.RouterAdvertisement{
			CurrentHopLimit: 64, ManagedConfiguration: true, OtherConfiguration: true,
			RouterLifetime: 30 * time.Minute,
			Options:        []ndp.Option{sll},
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			ra, err := routerAdvertisement(tc.lease, testServerMAC)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(ra, tc.want) {
				t.Errorf("got  %s\nwant %s", describeRA(ra), describeRA(tc.want))
			}
			if got := roundTripRA(t, ra); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("after the wire\ngot  %s\nwant %s", describeRA(got), describeRA(tc.want))
			}
		})
	}
}

// describeRA prints ra with its options.
func describeRA(ra *ndp.RouterAdvertisement) string {
	s := fmt.Sprintf("%+v", *ra)
	for _, o := range ra.Options {
		s += fmt.Sprintf("\n  %T %+v", o, o)
	}
	return s
}

func TestRouterAdvertisementDoesNotAlias(t *testing.T) {
	lease := testLease6(t)
	mac := append(net.HardwareAddr(nil), testServerMAC...)
	ra, err := routerAdvertisement(lease, mac)
	if err != nil {
		t.Fatal(err)
	}
	mac[0] = 0xff
	if lla := ra.Options[0].(*ndp.LinkLayerAddress); !reflect.DeepEqual(lla.Addr, testServerMAC) {
		t.Errorf("source link-layer address follows the caller's slice: %s", lla.Addr)
	}
}

func TestRouterAdvertisementSplitsLongLists(t *testing.T) {
	lease := testLease6(t)
	lease.DNS = nil
	for i := range 20 {
		lease.DNS = append(lease.DNS, net.ParseIP(fmt.Sprintf("2001:db8::%x", i+1)))
	}
	lease.Search = nil
	for i := range 20 {
		lease.Search = append(lease.Search, fmt.Sprintf("namespace-%02d.svc.cluster.example", i))
	}
	tooLong := strings.Repeat("abcdefghi.", 24) + "example" // 247 bytes: valid, but past a DNSSL option
	lease.Search = append(lease.Search, tooLong, "bücher.example")
	ra, err := routerAdvertisement(lease, testServerMAC)
	if err != nil {
		t.Fatal(err)
	}
	var servers []netip.Addr
	var names []string
	for _, o := range roundTripRA(t, ra).Options {
		switch o := o.(type) {
		case *ndp.RecursiveDNSServer:
			if len(o.Servers) > maxRDNSSServers || o.Lifetime != raLifetime {
				t.Errorf("rdnss of %d servers, lifetime %s", len(o.Servers), o.Lifetime)
			}
			servers = append(servers, o.Servers...)
		case *ndp.DNSSearchList:
			if o.Lifetime != raLifetime {
				t.Errorf("dnssl lifetime %s", o.Lifetime)
			}
			names = append(names, o.DomainNames...)
		}
	}
	if len(servers) != 20 || servers[0] != netip.MustParseAddr("2001:db8::1") || servers[19] != netip.MustParseAddr("2001:db8::14") {
		t.Errorf("servers %v", servers)
	}
	want := append(append([]string(nil), lease.Search[:20]...), "bücher.example")
	if !reflect.DeepEqual(names, want) {
		t.Errorf("search names %q, want %q", names, want)
	}
	// DHCPv6 still carries the long name.
	if err := checkLease6(lease); err != nil {
		t.Fatal(err)
	}
}

func TestRouterAdvertisementErrors(t *testing.T) {
	good := testLease6(t)
	for _, tc := range []struct {
		name  string
		lease *Lease6
		mac   net.HardwareAddr
	}{
		{"nil lease", nil, testServerMAC},
		{"bad lease", &Lease6{MAC: testClientMAC, IP: net.ParseIP("fe80::1")}, testServerMAC},
		{"bad lease mtu", &Lease6{MAC: testClientMAC, IP: net.ParseIP("2001:db8::1"), MTU: 1000}, testServerMAC},
		{"nil router mac", good, nil},
		{"long router mac", good, make(net.HardwareAddr, 8)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ra, err := routerAdvertisement(tc.lease, tc.mac)
			if ra != nil || !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("routerAdvertisement = %v, %v; want ErrInvalidArgument", ra, err)
			}
		})
	}
}
