package network

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/vmshim/vmshim/regfile"
)

// leaseTime is how long the guest may keep its address between renewals.
const leaseTime = 24 * time.Hour

// maxResolvConf bounds how much of the pod's resolv.conf is read.
const maxResolvConf = 64 << 10

// nicPlan is what Setup does for one CNI interface.
type nicPlan struct {
	link      netlink.Link
	addrs     []netlink.Addr  // IPv4, kernel order; their local routes are removed
	routes    []netlink.Route // IPv4 main-table routes through link, for the lease
	tap       string
	linkLocal net.IP // nil when link has no IPv4 address

	addrs6  []netlink.Addr  // global IPv6 addresses, kernel order; they stay as they are
	routes6 []netlink.Route // IPv6 main-table routes through link, for the lease
}

// plan is the netns as found and what Setup will change in it.
type plan struct {
	nics  []nicPlan
	state State
}

// isCNILink reports whether link is an interface Setup wires: up, Ethernet,
// with a unicast MAC, not loopback and not one of our taps.
func isCNILink(link netlink.Link) bool {
	a := link.Attrs()
	if a.Flags&net.FlagLoopback != 0 || a.Flags&net.FlagUp == 0 || isOwnTap(link) {
		return false
	}
	mac := a.HardwareAddr
	return a.EncapType == "ether" && len(mac) == 6 && mac[0]&1 == 0 &&
		!bytes.Equal(mac, make(net.HardwareAddr, 6))
}

// linksInOrder lists the netns's links in ifindex order: the order its
// CNI interfaces are wired in, and NICs are given to the guest.
func linksInOrder(p *podNS) ([]netlink.Link, error) {
	links, err := retryDump(p.h.LinkList)
	if err != nil {
		return nil, fmt.Errorf("list links in netns %s: %w", p.path, err)
	}
	slices.SortFunc(links, func(a, b netlink.Link) int { return a.Attrs().Index - b.Attrs().Index })
	return links, nil
}

// inspect reads the netns and plans Setup without changing anything. It
// fails when the netns holds something Setup could not undo exactly.
func inspect(p *podNS) (*plan, error) {
	links, err := linksInOrder(p)
	if err != nil {
		return nil, err
	}
	addrs, err := retryDump(func() ([]netlink.Addr, error) { return p.h.AddrList(nil, netlink.FAMILY_V4) })
	if err != nil {
		return nil, fmt.Errorf("list addresses in netns %s: %w", p.path, err)
	}
	routes, err := retryDump(func() ([]netlink.Route, error) {
		return p.h.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	})
	if err != nil {
		return nil, fmt.Errorf("list routes in netns %s: %w", p.path, err)
	}
	v6, err := inspect6(p)
	if err != nil {
		return nil, err
	}
	pl := &plan{state: State{NetNS: p.path, NetNSID: p.ns.UniqueId()}}
	names := map[int]string{}
	wired := map[int]bool{}
	removed := map[string]bool{}
	for _, link := range links {
		names[link.Attrs().Index] = link.Attrs().Name
		if !isCNILink(link) {
			continue
		}
		np, err := planNIC(p, link, len(pl.nics), addrs, routes)
		if err != nil {
			return nil, err
		}
		v6.plan(&np)
		wired[link.Attrs().Index] = true
		for _, a := range np.addrs {
			removed[a.IP.String()] = true
		}
		pl.nics = append(pl.nics, np)
	}
	for _, r := range routes {
		if !wired[r.LinkIndex] && !(r.Src != nil && removed[r.Src.String()]) && !multipathOn(r, wired) {
			continue
		}
		rs, err := routeState(r, names[r.LinkIndex])
		if err != nil {
			return nil, fmt.Errorf("netns %s: %w", p.path, err)
		}
		pl.state.Routes = append(pl.state.Routes, rs)
	}
	taken := conflicts(addrs, routes)
	for i := range pl.nics {
		np := &pl.nics[i]
		if len(np.addrs) > 0 {
			if np.linkLocal = pickLinkLocal(i, taken); np.linkLocal == nil {
				return nil, fmt.Errorf("no free link-local address in 169.254.1.0/24 for %s: %w",
					np.link.Attrs().Name, errdefs.ErrResourceExhausted)
			}
			taken = append(taken, &net.IPNet{IP: np.linkLocal, Mask: net.CIDRMask(32, 32)})
		}
		ns := NICState{Link: np.link.Attrs().Name, Tap: np.tap, LinkLocal: ipString(np.linkLocal), TxQLen: np.link.Attrs().TxQLen}
		for _, a := range np.addrs {
			ns.Addrs = append(ns.Addrs, addrState(a))
		}
		pl.state.NICs = append(pl.state.NICs, ns)
	}
	if err := planForwarding(p, pl); err != nil {
		return nil, err
	}
	if err := planSockets(p, pl, routes); err != nil {
		return nil, err
	}
	return pl, nil
}

func planNIC(p *podNS, link netlink.Link, i int, addrs []netlink.Addr, routes []netlink.Route) (nicPlan, error) {
	name := link.Attrs().Name
	idx := link.Attrs().Index
	np := nicPlan{link: link, tap: tapName(i)}
	busy, err := hasIngress(p, link)
	if err != nil {
		return np, err
	}
	if busy {
		return np, fmt.Errorf("interface %s in netns %s already has an ingress qdisc: %w", name, p.path, errdefs.ErrFailedPrecondition)
	}
	if _, err := p.h.LinkByName(np.tap); err == nil {
		return np, fmt.Errorf("tap %s already exists in netns %s: %w", np.tap, p.path, errdefs.ErrAlreadyExists)
	} else if !isNotFound(err) {
		return np, fmt.Errorf("look for tap %s: %w", np.tap, err)
	}
	for _, a := range addrs {
		if a.LinkIndex == idx && a.IP.To4() != nil {
			np.addrs = append(np.addrs, a)
		}
	}
	for _, r := range routes {
		if r.LinkIndex == idx && r.Table == unix.RT_TABLE_MAIN {
			np.routes = append(np.routes, r)
		}
	}
	return np, nil
}

// multipathOn reports whether r has a nexthop through a wired link.
func multipathOn(r netlink.Route, wired map[int]bool) bool {
	for _, nh := range r.MultiPath {
		if wired[nh.LinkIndex] {
			return true
		}
	}
	return false
}

// conflicts lists what a tap's link-local address must not collide with:
// every address and gateway of the netns, and narrow route destinations
// (Calico, for one, routes its pod gateway 169.254.1.1 on-link).
func conflicts(addrs []netlink.Addr, routes []netlink.Route) []*net.IPNet {
	var out []*net.IPNet
	host := net.CIDRMask(32, 32)
	for _, a := range addrs {
		out = append(out, &net.IPNet{IP: a.IP, Mask: host})
		if a.Peer != nil {
			out = append(out, a.Peer)
		}
	}
	for _, r := range routes {
		if r.Gw != nil {
			out = append(out, &net.IPNet{IP: r.Gw, Mask: host})
		}
		if r.Dst != nil {
			if ones, _ := r.Dst.Mask.Size(); ones >= 24 {
				out = append(out, r.Dst)
			}
		}
	}
	return out
}

// pickLinkLocal returns 169.254.1.(i+1), or the next free address of
// 169.254.1.0/24 when that one is taken; nil when none is free.
func pickLinkLocal(i int, taken []*net.IPNet) net.IP {
	for k := range 254 {
		ip := net.IPv4(169, 254, 1, byte((i+k)%254+1)).To4()
		if !slices.ContainsFunc(taken, func(n *net.IPNet) bool { return n.Contains(ip) }) {
			return ip
		}
	}
	return nil
}

// buildLease is what the DHCP responder offers on np's tap; nil when the
// interface has no IPv4 address.
func buildLease(np nicPlan, dns []net.IP, search []string, hostname string) *Lease {
	if len(np.addrs) == 0 || np.linkLocal == nil {
		return nil
	}
	first := np.addrs[0]
	l := &Lease{
		MAC:       np.link.Attrs().HardwareAddr,
		IP:        first.IP.To4(),
		Mask:      first.Mask,
		MTU:       np.link.Attrs().MTU,
		DNS:       dns,
		Search:    search,
		Hostname:  hostname,
		LeaseTime: leaseTime,
	}
	subnet := &net.IPNet{IP: l.IP.Mask(l.Mask), Mask: l.Mask}
	// The guest must see on-link exactly what the netns had on-link. CNI
	// plugins such as ptp delete the kernel's route to the address's
	// subnet and route it via the gateway instead; offering the subnet's
	// mask would make the guest ARP for its neighbours directly.
	connected := slices.ContainsFunc(np.routes, func(r netlink.Route) bool {
		return r.Protocol == unix.RTPROT_KERNEL && r.Dst != nil && r.Dst.String() == subnet.String()
	})
	if !connected {
		l.Mask = net.CIDRMask(32, 32)
		subnet = &net.IPNet{IP: l.IP, Mask: l.Mask}
	}
	var onLink, viaGw []Route
	if first.Peer != nil {
		onLink = append(onLink, Route{Dst: &net.IPNet{IP: first.Peer.IP.Mask(first.Peer.Mask), Mask: first.Peer.Mask}})
	}
	defaultMetric := -1
	for _, r := range np.routes {
		if r.Type != unix.RTN_UNICAST || r.Protocol == unix.RTPROT_KERNEL {
			continue
		}
		rt := Route{Dst: r.Dst, Gw: r.Gw.To4()}
		if isDefault(r.Dst) {
			rt.Dst = nil
			if rt.Gw != nil && (defaultMetric < 0 || r.Priority < defaultMetric) {
				l.Gateway, defaultMetric = rt.Gw, r.Priority
			}
		}
		if rt.Gw == nil {
			onLink = append(onLink, rt)
		} else {
			viaGw = append(viaGw, rt)
		}
	}
	onLink = append(onLink, Route{Dst: &net.IPNet{IP: np.linkLocal, Mask: net.CIDRMask(32, 32)}})
	// A gateway outside the subnet (an "onlink" route) needs a route of its
	// own, or the guest could not reach it.
	for _, r := range viaGw {
		reachable := subnet.Contains(r.Gw) || slices.ContainsFunc(onLink, func(o Route) bool {
			return o.Dst != nil && o.Dst.Contains(r.Gw)
		})
		if !reachable {
			onLink = append(onLink, Route{Dst: &net.IPNet{IP: r.Gw, Mask: net.CIDRMask(32, 32)}})
		}
	}
	l.Routes = append(onLink, viaGw...)
	l.ServerID = l.Gateway
	if l.ServerID == nil {
		l.ServerID = np.linkLocal
	}
	return l
}

func isDefault(dst *net.IPNet) bool {
	if dst == nil {
		return true
	}
	ones, _ := dst.Mask.Size()
	return ones == 0
}

// readResolvConf returns the IPv4 and the IPv6 name servers and the
// search list of the resolv.conf at path; none when path is empty or the
// file is missing. The path is the spec's mount source: the file must be a
// regular file of at most maxResolvConf bytes, checked through an O_PATH
// descriptor (its last component not followed) before it is opened, and
// read non-blocking.
func readResolvConf(path string) (dns, dns6 []net.IP, search []string, err error) {
	if path == "" {
		return nil, nil, nil, nil
	}
	data, err := regfile.ReadFile(path, maxResolvConf)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil, nil, nil
	}
	if err != nil {
		return nil, nil, nil, fmt.Errorf("resolv.conf: %w", err)
	}
	dns, dns6, search, err = parseResolvConf(bytes.NewReader(data))
	if err != nil {
		return nil, nil, nil, fmt.Errorf("read resolv.conf %s: %w", path, err)
	}
	return dns, dns6, search, nil
}

// parseResolvConf reads nameserver, search and domain lines; the last
// search or domain line wins, as in the resolver. IPv4 name servers go
// to DHCP, IPv6 ones (without a zone) to RDNSS and DHCPv6.
func parseResolvConf(r io.Reader) (dns, dns6 []net.IP, search []string, err error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if i := strings.IndexAny(line, "#;"); i >= 0 {
			line = line[:i]
		}
		fields := strings.Fields(line)
		if len(fields) < 2 {
			continue
		}
		switch fields[0] {
		case "nameserver":
			ip := net.ParseIP(fields[1])
			if v4 := ip.To4(); v4 != nil && !slices.ContainsFunc(dns, v4.Equal) {
				dns = append(dns, v4)
			} else if v4 == nil && ip != nil && !ip.IsUnspecified() && !ip.IsMulticast() && !slices.ContainsFunc(dns6, ip.Equal) {
				dns6 = append(dns6, ip)
			}
		case "search":
			search = searchDomains(fields[1:])
		case "domain":
			search = searchDomains(fields[1:2])
		}
	}
	return dns, dns6, search, sc.Err()
}

// searchDomains keeps the names DHCP can carry, as DNS names (RFC 3397):
// labels of 1 to 63 bytes, 253 bytes in all; a fully qualified name loses
// its final dot, which would be an empty name of its own.
func searchDomains(names []string) []string {
	var out []string
	for _, n := range names {
		n = strings.TrimSuffix(n, ".")
		bad := func(label string) bool { return label == "" || len(label) > 63 }
		if n != "" && len(n) <= 253 && !slices.ContainsFunc(strings.Split(n, "."), bad) {
			out = append(out, n)
		}
	}
	return out
}
