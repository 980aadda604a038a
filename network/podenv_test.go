package network

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// podEnv is a test-made "pod" netns wired, like the CNI bridge or ptp
// plugin would, to a test-made "host" netns. Nothing outside these two
// namespaces is touched; they vanish when the test closes its handles.
type podEnv struct {
	t          testing.TB
	pod, host  netns.NsHandle
	podH       *netlink.Handle
	hostH      *netlink.Handle
	path       string // path of the pod netns for Setup
	links      []podLink
	resolvConf string
}

// podLink is one CNI-like interface of the pod and its host-side peer.
type podLink struct {
	name, hostName string
	mac, hostMAC   net.HardwareAddr
	podIP, gw      net.IP
}

type linkKind int

const (
	bridgeLike linkKind = iota // pod 10.x.0.5/24, host 10.x.0.1/24, default via host
	ptpLike                    // pod 10.x.0.5/32, gw/32 scope link, default via gw; host /32 + route back
	sideLink                   // like bridgeLike but no default route (a Multus net1)
)

func needRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces, veth pairs, taps and tc filters")
	}
}

func newPodEnv(t testing.TB) *podEnv {
	t.Helper()
	needRoot(t)
	e := &podEnv{t: t}
	e.pod, e.podH = newNS(t)
	e.host, e.hostH = newNS(t)
	e.path = fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), int(e.pod))
	e.resolvConf = t.TempDir() + "/resolv.conf"
	conf := "# pod dns\nsearch default.svc.cluster.local svc.cluster.local\nnameserver 10.96.0.10\nnameserver fd00::10\noptions ndots:5\n"
	if err := os.WriteFile(e.resolvConf, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	return e
}

func mustIP(s string) net.IP { return net.ParseIP(s).To4() }

func hostNet(s string) *net.IPNet {
	ip, n, err := net.ParseCIDR(s)
	if err != nil {
		panic(err)
	}
	n.IP = ip
	return n
}

// addIPv6OnlyLink is addLink of a side link whose IPv4 address is taken
// away again: the pod's interface has IPv6 alone.
func (e *podEnv) addIPv6OnlyLink(name string, octet int) podLink {
	e.t.Helper()
	pl := e.addLink(name, octet, sideLink)
	link, err := e.podH.LinkByName(name)
	if err != nil {
		e.t.Fatal(err)
	}
	if err := e.podH.AddrDel(link, &netlink.Addr{IPNet: hostNet(pl.podIP.String() + "/24")}); err != nil {
		e.t.Fatal(err)
	}
	return pl
}

// addLink adds pod interface name (subnet 10.<octet>.0.0/24) of the given kind.
func (e *podEnv) addLink(name string, octet int, kind linkKind) podLink {
	t := e.t
	t.Helper()
	hostName := fmt.Sprintf("vh%d", len(e.links))
	pl := podLink{
		name: name, hostName: hostName,
		podIP: mustIP(fmt.Sprintf("10.%d.0.5", octet)),
		gw:    mustIP(fmt.Sprintf("10.%d.0.1", octet)),
	}
	veth := &netlink.Veth{
		LinkAttrs: netlink.LinkAttrs{Name: hostName, MTU: 1400},
		PeerName:  name, PeerNamespace: netlink.NsFd(int(e.pod)),
	}
	if err := e.hostH.LinkAdd(veth); err != nil {
		t.Fatalf("add veth %s: %v", name, err)
	}
	hl, err := e.hostH.LinkByName(hostName)
	if err != nil {
		t.Fatal(err)
	}
	l, err := e.podH.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	pl.mac, pl.hostMAC = l.Attrs().HardwareAddr, hl.Attrs().HardwareAddr
	podAddr, hostAddr := fmt.Sprintf("%s/24", pl.podIP), fmt.Sprintf("%s/24", pl.gw)
	if kind == ptpLike {
		podAddr, hostAddr = fmt.Sprintf("%s/32", pl.podIP), fmt.Sprintf("%s/32", pl.gw)
	}
	must := func(what string, err error) {
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	must("pod addr", e.podH.AddrAdd(l, &netlink.Addr{IPNet: hostNet(podAddr)}))
	must("pod v6 addr", e.podH.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{
		IP: net.ParseIP(fmt.Sprintf("fd00:%d::5", octet)), Mask: net.CIDRMask(64, 128)}}))
	must("host addr", e.hostH.AddrAdd(hl, &netlink.Addr{IPNet: hostNet(hostAddr)}))
	must("pod up", e.podH.LinkSetUp(l))
	must("host up", e.hostH.LinkSetUp(hl))
	if kind == ptpLike {
		must("pod gw route", e.podH.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index,
			Dst: &net.IPNet{IP: pl.gw, Mask: net.CIDRMask(32, 32)}, Scope: netlink.SCOPE_LINK}))
		must("host route", e.hostH.RouteAdd(&netlink.Route{LinkIndex: hl.Attrs().Index,
			Dst: &net.IPNet{IP: pl.podIP, Mask: net.CIDRMask(32, 32)}, Scope: netlink.SCOPE_LINK}))
	}
	if kind != sideLink {
		must("default route", e.podH.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: pl.gw}))
	}
	e.links = append(e.links, pl)
	return pl
}

// podCmd runs a command in the pod netns.
func (e *podEnv) podCmd(args ...string) string {
	e.t.Helper()
	nsArgs := append([]string{"--net=" + e.path}, args...)
	out, err := exec.Command("nsenter", nsArgs...).CombinedOutput()
	if err != nil {
		e.t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

var statsLine = regexp.MustCompile(`(?m)^\s*(RX|TX|Sent|backlog|rate).*\n(\s+\d.*\n)?`)

// settle waits until every test link has carrier and its IPv6 addresses,
// link-local included, are no longer tentative.
func (e *podEnv) settle() {
	e.t.Helper()
	for _, pl := range e.links {
		settleLink(e.t, e.podH, pl.name, 2)
	}
}

// snapshot is the pod netns as `ip` and `tc` show it, without counters.
func (e *podEnv) snapshot() string {
	e.t.Helper()
	e.settle()
	var b strings.Builder
	for _, cmd := range [][]string{
		{"ip", "-d", "addr"},
		{"ip", "-d", "link"},
		{"ip", "route", "show", "table", "all"},
		{"ip", "-6", "route", "show", "table", "all"},
		{"ip", "rule"},
		{"cat", sysctlNonlocalBind},
		{"tc", "qdisc", "show"},
		{"tc", "filter", "show", "dev", "eth0", "ingress"},
	} {
		if cmd[1] == "filter" && len(e.links) == 0 {
			continue
		}
		fmt.Fprintf(&b, "$ %s\n%s", strings.Join(cmd, " "), statsLine.ReplaceAllString(e.podCmd(cmd...), ""))
	}
	return b.String()
}

// udpIn opens a UDP socket in ns: connected to raddr, or listening on laddr.
func (e *podEnv) udpIn(ns netns.NsHandle, network string, laddr, raddr *net.UDPAddr) *net.UDPConn {
	e.t.Helper()
	var c *net.UDPConn
	err := runInNS(ns, func() error {
		var err error
		if raddr != nil {
			c, err = net.DialUDP(network, laddr, raddr)
		} else {
			c, err = net.ListenUDP(network, laddr)
		}
		return err
	})
	if err != nil {
		e.t.Fatalf("udp socket: %v", err)
	}
	e.t.Cleanup(func() { c.Close() })
	return c
}

// sniffer is a packet socket on a host-side interface.
type sniffer struct{ fd int }

func (e *podEnv) sniff(hostIf string) *sniffer {
	e.t.Helper()
	l, err := e.hostH.LinkByName(hostIf)
	if err != nil {
		e.t.Fatal(err)
	}
	var fd int
	err = runInNS(e.host, func() error {
		var err error
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL)))
		if err != nil {
			return err
		}
		return unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: l.Attrs().Index})
	})
	if err != nil {
		e.t.Fatalf("packet socket: %v", err)
	}
	tv := unix.NsecToTimeval((50 * time.Millisecond).Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { unix.Close(fd) })
	return &sniffer{fd: fd}
}

// frames returns what the sniffer saw, reading for d.
func (s *sniffer) frames(d time.Duration) [][]byte {
	var out [][]byte
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		buf := make([]byte, 2048)
		n, _, err := unix.Recvfrom(s.fd, buf, 0)
		if err != nil {
			continue
		}
		out = append(out, buf[:n])
	}
	return out
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }
