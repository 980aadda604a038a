package network

import (
	"net"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

func TestBuildLease6(t *testing.T) {
	mac := net.HardwareAddr{2, 0, 0, 0, 0, 5}
	link := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Index: 2, Name: "eth0", MTU: 1400, HardwareAddr: mac}}
	addr := func(cidr string) netlink.Addr { return netlink.Addr{IPNet: hostNet(cidr), LinkIndex: 2} }
	route := func(dst, gw string, proto netlink.RouteProtocol) netlink.Route {
		r := netlink.Route{LinkIndex: 2, Protocol: proto, Type: unix.RTN_UNICAST, Table: unix.RT_TABLE_MAIN}
		if dst != "" {
			_, r.Dst, _ = net.ParseCIDR(dst)
		}
		if gw != "" {
			r.Gw = net.ParseIP(gw)
		}
		return r
	}
	prefix := route("fd00:1::/64", "", unix.RTPROT_KERNEL)
	ll := route("fe80::/64", "", unix.RTPROT_KERNEL)
	for _, tc := range []struct {
		name   string
		addrs  []netlink.Addr
		routes []netlink.Route
		mtu    int
		want   *Lease6 // nil: no lease
	}{
		{name: "no ipv6", routes: []netlink.Route{ll}},
		{name: "bridge", addrs: []netlink.Addr{addr("fd00:1::5/64"), addr("fd00:2::5/64")},
			routes: []netlink.Route{prefix, ll, route("::/0", "fd00:1::1", unix.RTPROT_BOOT)},
			want:   &Lease6{IP: net.ParseIP("fd00:1::5"), OnLink: []*net.IPNet{hostNet("fd00:1::/64")}, Router: true, MTU: 1400}},
		{name: "calico", addrs: []netlink.Addr{addr("fd00:1::5/128")},
			routes: []netlink.Route{ll, route("", "fe80::ecee:eeff:feee:eeee", unix.RTPROT_BOOT)},
			want:   &Lease6{IP: net.ParseIP("fd00:1::5"), Router: true, MTU: 1400}},
		{name: "ptp", addrs: []netlink.Addr{addr("fd00:1::5/128")},
			routes: []netlink.Route{route("fd00:1::1/128", "", unix.RTPROT_BOOT), ll},
			want:   &Lease6{IP: net.ParseIP("fd00:1::5"), Router: true, MTU: 1400}},
		{name: "side network", addrs: []netlink.Addr{addr("fd00:1::5/64")}, routes: []netlink.Route{prefix, ll},
			want: &Lease6{IP: net.ParseIP("fd00:1::5"), OnLink: []*net.IPNet{hostNet("fd00:1::/64")}, MTU: 1400}},
		{name: "small mtu", addrs: []netlink.Addr{addr("fd00:1::5/64")}, routes: []netlink.Route{prefix}, mtu: 1200,
			want: &Lease6{IP: net.ParseIP("fd00:1::5"), OnLink: []*net.IPNet{hostNet("fd00:1::/64")}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := *link
			if tc.mtu != 0 {
				l.MTU = tc.mtu
			}
			np := nicPlan{link: &l}
			addrs := slices.Clone(tc.addrs)
			// Addresses of other links, tentative ones and link-local
			// ones are never the guest's.
			addrs = append(addrs, netlink.Addr{IPNet: hostNet("fd00:9::5/64"), LinkIndex: 3},
				netlink.Addr{IPNet: hostNet("fd00:8::5/64"), LinkIndex: 2, Flags: unix.IFA_F_TENTATIVE},
				netlink.Addr{IPNet: hostNet("fe80::5/64"), LinkIndex: 2})
			(&netns6{addrs: addrs, routes: tc.routes}).plan(&np)
			got := buildLease6(np, []net.IP{net.ParseIP("fd00::a")}, []string{"svc"})
			if tc.want == nil {
				if got != nil {
					t.Fatalf("lease %+v, want none", got)
				}
				return
			}
			if got == nil {
				t.Fatal("no lease")
			}
			if !got.IP.Equal(tc.want.IP) || got.Router != tc.want.Router || got.MTU != tc.want.MTU ||
				got.MAC.String() != mac.String() || got.LeaseTime != leaseTime || len(got.DNS) != 1 ||
				!slices.Equal(got.Search, []string{"svc"}) ||
				!slices.EqualFunc(got.OnLink, tc.want.OnLink, func(a, b *net.IPNet) bool { return a.String() == b.String() }) {
				t.Errorf("lease %+v, want %+v", got, tc.want)
			}
			if err := checkLease6(got); err != nil {
				t.Errorf("checkLease6: %v", err)
			}
		})
	}
}
