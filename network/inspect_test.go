package network

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

func cidr(s string) *net.IPNet {
	ip, n, err := net.ParseCIDR(s)
	if err != nil {
		panic(err)
	}
	if ip4 := ip.To4(); ip4 != nil {
		ip = ip4
	}
	n.IP = ip
	return n
}

func TestParseResolvConf(t *testing.T) {
	in := `# generated
domain example.org
search a.svc.cluster.local svc.cluster.local ; comment
nameserver 10.96.0.10
nameserver 10.96.0.10
nameserver fd00::10
nameserver 8.8.8.8 # second
options ndots:5
nameserver
`
	dns, dns6, search, err := parseResolvConf(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(dns) != 2 || !dns[0].Equal(net.IPv4(10, 96, 0, 10)) || !dns[1].Equal(net.IPv4(8, 8, 8, 8)) {
		t.Errorf("dns = %v", dns)
	}
	if len(dns6) != 1 || !dns6[0].Equal(net.ParseIP("fd00::10")) {
		t.Errorf("dns6 = %v", dns6)
	}
	if !slices.Equal(search, []string{"a.svc.cluster.local", "svc.cluster.local"}) {
		t.Errorf("search = %v", search)
	}
	_, _, search, _ = parseResolvConf(strings.NewReader("search a b\ndomain c\n"))
	if !slices.Equal(search, []string{"c"}) {
		t.Errorf("last of search/domain should win, got %v", search)
	}
}

func TestReadResolvConf(t *testing.T) {
	for _, path := range []string{"", filepath.Join(t.TempDir(), "missing")} {
		dns, _, search, err := readResolvConf(path)
		if err != nil || dns != nil || search != nil {
			t.Errorf("readResolvConf(%q) = %v %v %v, want nothing", path, dns, search, err)
		}
	}
	p := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(p, []byte("nameserver 1.1.1.1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if dns, _, _, err := readResolvConf(p); err != nil || len(dns) != 1 {
		t.Errorf("readResolvConf = %v, %v", dns, err)
	}
	if _, _, _, err := readResolvConf(t.TempDir()); err == nil {
		t.Error("a directory as resolv.conf should fail")
	}
	// A fifo would hang the create, a huge file would be read whole:
	// each fails in one line naming the file, never opened or read past
	// maxResolvConf.
	dir := t.TempDir()
	fifo, huge := filepath.Join(dir, "fifo"), filepath.Join(dir, "huge")
	if err := unix.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(huge, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(huge, 4<<30); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]string{fifo: "not a regular file (fifo)", huge: "more than 65536 bytes"} {
		_, _, _, err := readResolvConf(p)
		if err == nil || !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("readResolvConf(%s) = %v, want one line with %q", p, err, want)
		}
	}
}

func TestPickLinkLocal(t *testing.T) {
	if got := pickLinkLocal(0, nil); !got.Equal(net.IPv4(169, 254, 1, 1)) {
		t.Errorf("first nic got %s", got)
	}
	if got := pickLinkLocal(2, nil); !got.Equal(net.IPv4(169, 254, 1, 3)) {
		t.Errorf("third nic got %s", got)
	}
	// Calico: default via 169.254.1.1, which is routed on-link.
	routes := []netlink.Route{
		{Dst: cidr("169.254.1.1/32"), Scope: netlink.SCOPE_LINK},
		{Dst: cidr("0.0.0.0/0"), Gw: net.IPv4(169, 254, 1, 1)},
	}
	taken := conflicts([]netlink.Addr{{IPNet: cidr("10.1.2.3/32")}}, routes)
	if got := pickLinkLocal(0, taken); !got.Equal(net.IPv4(169, 254, 1, 2)) {
		t.Errorf("with calico's gateway got %s, want 169.254.1.2", got)
	}
	if got := pickLinkLocal(0, []*net.IPNet{cidr("169.254.1.0/24")}); got != nil {
		t.Errorf("full range got %s", got)
	}
}

func veth(name string, idx, mtu int) netlink.Link {
	return &netlink.Veth{LinkAttrs: netlink.LinkAttrs{
		Name: name, Index: idx, MTU: mtu, Flags: net.FlagUp, EncapType: "ether",
		HardwareAddr: net.HardwareAddr{0x0a, 0x58, 0x0a, 0x63, 0x00, byte(idx)},
	}}
}

func TestIsCNILink(t *testing.T) {
	lo := &netlink.Device{LinkAttrs: netlink.LinkAttrs{Name: "lo", Flags: net.FlagUp | net.FlagLoopback, EncapType: "loopback"}}
	down := veth("eth1", 3, 1500)
	down.Attrs().Flags = 0
	tap := &netlink.Tuntap{LinkAttrs: netlink.LinkAttrs{Name: "vmtap0", Flags: net.FlagUp, EncapType: "ether",
		HardwareAddr: net.HardwareAddr{2, 0, 0, 0, 0, 1}}}
	gretap := &netlink.Gretap{LinkAttrs: netlink.LinkAttrs{Name: "gretap0", Flags: net.FlagUp, EncapType: "ether",
		HardwareAddr: make(net.HardwareAddr, 6)}}
	for _, c := range []struct {
		link netlink.Link
		want bool
	}{{lo, false}, {down, false}, {tap, false}, {gretap, false}, {veth("eth0", 2, 1500), true}} {
		if got := isCNILink(c.link); got != c.want {
			t.Errorf("isCNILink(%s) = %v, want %v", c.link.Attrs().Name, got, c.want)
		}
	}
}

func routeStrings(rs []Route) []string {
	var out []string
	for _, r := range rs {
		out = append(out, routeString(r))
	}
	return out
}

func TestBuildLease(t *testing.T) {
	link := veth("eth0", 2, 1450)
	gw := net.IPv4(10, 99, 0, 1).To4()
	kernelRoute := netlink.Route{LinkIndex: 2, Dst: cidr("10.99.0.0/24"), Protocol: unix.RTPROT_KERNEL, Type: unix.RTN_UNICAST, Table: unix.RT_TABLE_MAIN}
	np := nicPlan{
		link:      link,
		addrs:     []netlink.Addr{{IPNet: cidr("10.99.0.5/24")}, {IPNet: cidr("10.99.0.6/24")}},
		linkLocal: net.IPv4(169, 254, 1, 1).To4(),
		routes: []netlink.Route{
			kernelRoute,
			{LinkIndex: 2, Dst: cidr("0.0.0.0/0"), Gw: gw, Type: unix.RTN_UNICAST, Priority: 100},
			{LinkIndex: 2, Dst: cidr("0.0.0.0/0"), Gw: net.IPv4(10, 99, 0, 2), Type: unix.RTN_UNICAST, Priority: 50},
			{LinkIndex: 2, Dst: cidr("192.168.0.0/16"), Gw: net.IPv4(172, 16, 0, 1), Type: unix.RTN_UNICAST, Flags: unix.RTNH_F_ONLINK},
			{LinkIndex: 2, Dst: cidr("10.0.0.0/8"), Type: unix.RTN_BLACKHOLE},
		},
	}
	l := buildLease(np, []net.IP{net.IPv4(10, 96, 0, 10)}, []string{"svc"}, "vm")
	if l == nil {
		t.Fatal("no lease")
	}
	if !l.IP.Equal(net.IPv4(10, 99, 0, 5)) || l.Mask.String() != "ffffff00" || l.MTU != 1450 ||
		l.MAC.String() != link.Attrs().HardwareAddr.String() || l.Hostname != "vm" || l.LeaseTime != 24*time.Hour {
		t.Errorf("lease = %+v", l)
	}
	if !l.Gateway.Equal(net.IPv4(10, 99, 0, 2)) || !l.ServerID.Equal(l.Gateway) {
		t.Errorf("gateway %s server id %s, want the default route with the lowest metric", l.Gateway, l.ServerID)
	}
	want := []string{"169.254.1.1/32 on-link", "172.16.0.1/32 on-link", "default via 10.99.0.1",
		"default via 10.99.0.2", "192.168.0.0/16 via 172.16.0.1"}
	if got := routeStrings(l.Routes); !slices.Equal(got, want) {
		t.Errorf("routes = %q, want %q", got, want)
	}

	// No default route: the responder speaks as the link-local address.
	np.routes = []netlink.Route{kernelRoute}
	l = buildLease(np, nil, nil, "")
	if l.Gateway != nil || !l.ServerID.Equal(np.linkLocal) || len(l.Routes) != 1 {
		t.Errorf("lease without gateway = %+v", l)
	}

	// A point-to-point address routes its peer on-link.
	np.addrs = []netlink.Addr{{IPNet: cidr("10.1.1.2/32"), Peer: cidr("10.1.1.1/32")}}
	if got := routeStrings(buildLease(np, nil, nil, "").Routes); !slices.Equal(got, []string{"10.1.1.1/32 on-link", "169.254.1.1/32 on-link"}) {
		t.Errorf("peer routes = %q", got)
	}

	np.addrs = nil
	if l := buildLease(np, nil, nil, ""); l != nil {
		t.Errorf("lease without ipv4 = %+v", l)
	}
}

func TestOpenNSRefuses(t *testing.T) {
	if _, err := openNS(""); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("empty path: %v", err)
	}
	if _, err := openNS(filepath.Join(t.TempDir(), "gone")); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("missing path: %v", err)
	}
	plain := filepath.Join(t.TempDir(), "plain")
	if err := os.WriteFile(plain, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := openNS(plain); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("plain file: %v", err)
	}
	// The shim's own netns: Setup must never strip the host's addresses.
	if _, err := openNS("/proc/self/ns/net"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("own netns: %v", err)
	}
}

// TestBuildLeasePtp: ptp gives the pod a /24 address but deletes the
// kernel's subnet route and routes the subnet via the gateway. The lease
// must not make the subnet on-link for the guest: mask /32, the gateway
// on-link, the subnet and the default route through it.
func TestBuildLeasePtp(t *testing.T) {
	link := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0", Index: 2, MTU: 1400,
		HardwareAddr: net.HardwareAddr{0x0a, 0x58, 0x0a, 0x59, 0, 2}}}
	gw := net.IPv4(10, 89, 0, 1).To4()
	np := nicPlan{
		link:      link,
		addrs:     []netlink.Addr{{IPNet: cidr("10.89.0.2/24")}},
		linkLocal: net.IPv4(169, 254, 1, 1).To4(),
		routes: []netlink.Route{
			{LinkIndex: 2, Dst: cidr("10.89.0.1/32"), Type: unix.RTN_UNICAST, Scope: netlink.SCOPE_LINK},
			{LinkIndex: 2, Dst: cidr("10.89.0.0/24"), Gw: gw, Type: unix.RTN_UNICAST},
			{LinkIndex: 2, Dst: cidr("0.0.0.0/0"), Gw: gw, Type: unix.RTN_UNICAST},
		},
	}
	l := buildLease(np, nil, nil, "")
	if ones, _ := l.Mask.Size(); ones != 32 {
		t.Errorf("mask /%d, want /32: the subnet is not on-link in the netns", ones)
	}
	want := []string{"10.89.0.1/32 on-link", "169.254.1.1/32 on-link", "10.89.0.0/24 via 10.89.0.1", "default via 10.89.0.1"}
	if got := routeStrings(l.Routes); !slices.Equal(got, want) {
		t.Errorf("routes %v, want %v", got, want)
	}
}
