package network

import (
	"encoding/json"
	"errors"
	"net"
	"reflect"
	"slices"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

func TestAddrStateRoundTrip(t *testing.T) {
	for _, a := range []netlink.Addr{
		{IPNet: cidr("10.99.0.5/24"), Broadcast: net.IPv4(10, 99, 0, 255).To4(), Label: "eth0",
			Flags: unix.IFA_F_PERMANENT, ValidLft: 0xffffffff, PreferedLft: 0xffffffff},
		{IPNet: cidr("10.99.0.6/24"), Label: "eth0:1", Flags: unix.IFA_F_SECONDARY | unix.IFA_F_NOPREFIXROUTE, Scope: unix.RT_SCOPE_LINK},
		{IPNet: cidr("10.1.1.2/32"), Peer: cidr("10.1.1.1/32")},
	} {
		s := addrState(a)
		got, err := s.addr(4)
		if err != nil {
			t.Fatal(err)
		}
		want := a
		want.LinkIndex = 4
		want.Flags &^= unix.IFA_F_SECONDARY
		if want.Broadcast == nil {
			want.Broadcast = net.IPv4zero // keeps netlink from inventing one
		}
		if !reflect.DeepEqual(*got, want) {
			t.Errorf("round trip of %+v:\n got %+v\nwant %+v", a, *got, want)
		}
	}
	if _, err := (AddrState{Local: "fd00::1/64"}).addr(1); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("ipv6 address: %v", err)
	}
}

func TestRouteStateRoundTrip(t *testing.T) {
	for _, r := range []netlink.Route{
		{Dst: cidr("0.0.0.0/0"), Gw: net.IPv4(10, 99, 0, 1).To4(), Table: unix.RT_TABLE_MAIN,
			Protocol: unix.RTPROT_BOOT, Type: unix.RTN_UNICAST, Priority: 100, MTU: 1400, AdvMSS: 1360},
		{Dst: cidr("10.99.0.1/32"), Scope: netlink.SCOPE_LINK, Table: unix.RT_TABLE_MAIN, Type: unix.RTN_UNICAST},
		{Dst: cidr("10.99.0.5/32"), Src: net.IPv4(10, 99, 0, 5).To4(), Table: unix.RT_TABLE_LOCAL,
			Type: unix.RTN_LOCAL, Protocol: unix.RTPROT_KERNEL, Scope: netlink.SCOPE_HOST},
		{Dst: cidr("0.0.0.0/0"), Gw: net.IPv4(1, 2, 3, 4).To4(), Flags: unix.RTNH_F_ONLINK, Table: 100, Congctl: "bbr"},
	} {
		s, err := routeState(r, "eth0")
		if err != nil {
			t.Fatal(err)
		}
		got, err := s.route(2)
		if err != nil {
			t.Fatal(err)
		}
		want := r
		want.LinkIndex, want.Family = 2, netlink.FAMILY_V4
		if !reflect.DeepEqual(*got, want) {
			t.Errorf("round trip:\n got %+v\nwant %+v", *got, want)
		}
	}
	// Flags the kernel reports but refuses on add are dropped.
	s, _ := routeState(netlink.Route{Dst: cidr("10.0.0.0/8"), Flags: unix.RTNH_F_LINKDOWN | unix.RTNH_F_DEAD}, "eth0")
	if s.Flags != 0 {
		t.Errorf("flags = %#x, want 0", s.Flags)
	}
	_, err := routeState(netlink.Route{Dst: cidr("10.0.0.0/8"), MultiPath: []*netlink.NexthopInfo{{LinkIndex: 2}}}, "eth0")
	if !errors.Is(err, errdefs.ErrNotImplemented) {
		t.Errorf("multipath route: %v", err)
	}
}

func TestRestoreOrder(t *testing.T) {
	in := []RouteState{
		{Dst: "0.0.0.0/0", Gw: "10.99.0.1"},
		{Dst: "10.99.0.1/32", Scope: int(netlink.SCOPE_LINK)},
		{Dst: "10.99.0.5/32", Scope: int(netlink.SCOPE_HOST)},
		{Dst: "10.0.0.0/8", Gw: "10.99.0.1"},
	}
	var got []string
	for _, r := range restoreOrder(in) {
		got = append(got, r.Dst)
	}
	want := []string{"10.99.0.5/32", "10.99.0.1/32", "0.0.0.0/0", "10.0.0.0/8"}
	if !slices.Equal(got, want) {
		t.Errorf("order = %v, want %v", got, want)
	}
	if in[0].Dst != "0.0.0.0/0" {
		t.Error("restoreOrder changed its input")
	}
}

func TestStateJSON(t *testing.T) {
	st := &State{
		NetNS: "/var/run/netns/cni-1", NetNSID: "NS(4:4026532290)",
		NICs: []NICState{{Link: "eth0", Tap: "vmtap0", LinkLocal: "169.254.1.1", TxQLen: 0,
			Addrs: []AddrState{{Local: "10.99.0.5/24", Broadcast: "10.99.0.255", Label: "eth0"}}}},
		Routes: []RouteState{{Link: "eth0", Dst: "0.0.0.0/0", Gw: "10.99.0.1", Table: 254, Metrics: Metrics{MTU: 1400}}},
	}
	b, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	var back State
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(*st, back) {
		t.Errorf("json round trip:\n%s\n%+v", b, back)
	}
	c := st.clone()
	c.NICs[0].Addrs[0].Local = "changed"
	c.Routes[0].Gw = "changed"
	if st.NICs[0].Addrs[0].Local == "changed" || st.Routes[0].Gw == "changed" {
		t.Error("clone shares memory with the original")
	}
}
