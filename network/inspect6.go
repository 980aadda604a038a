package network

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// netns6 is the netns's IPv6 configuration as inspect found it.
type netns6 struct {
	addrs  []netlink.Addr
	routes []netlink.Route // main table
}

// inspect6 reads the netns's IPv6 addresses and main-table routes; none
// when the netns has no IPv6.
func inspect6(p *podNS) (*netns6, error) {
	addrs, err := retryDump(func() ([]netlink.Addr, error) { return p.h.AddrList(nil, netlink.FAMILY_V6) })
	if errors.Is(err, unix.EAFNOSUPPORT) {
		return &netns6{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list ipv6 addresses in netns %s: %w", p.path, err)
	}
	routes, err := retryDump(func() ([]netlink.Route, error) {
		return p.h.RouteListFiltered(netlink.FAMILY_V6, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	})
	if err != nil && !errors.Is(err, unix.EAFNOSUPPORT) {
		return nil, fmt.Errorf("list ipv6 routes in netns %s: %w", p.path, err)
	}
	return &netns6{addrs: addrs, routes: routes}, nil
}

// unusable6 are the flags of an address the guest cannot be given.
const unusable6 = unix.IFA_F_TENTATIVE | unix.IFA_F_DADFAILED | unix.IFA_F_DEPRECATED

// plan fills in np's IPv6 part: its global addresses and the routes
// through it.
func (v *netns6) plan(np *nicPlan) {
	idx := np.link.Attrs().Index
	for _, a := range v.addrs {
		if a.LinkIndex == idx && a.IP.To4() == nil && a.IP.IsGlobalUnicast() && a.Flags&unusable6 == 0 {
			np.addrs6 = append(np.addrs6, a)
		}
	}
	for _, r := range v.routes {
		through := r.LinkIndex == idx || slices.ContainsFunc(r.MultiPath, func(nh *netlink.NexthopInfo) bool {
			return nh.LinkIndex == idx
		})
		if !through || r.Type != unix.RTN_UNICAST {
			continue
		}
		np.routes6 = append(np.routes6, r)
	}
}

// buildLease6 is what the IPv6 responder offers on np's tap; nil when the
// interface has no global IPv6 address.
//
// The guest gets the first address. What the netns had on-link for it
// (the kernel's prefix route of that address) is on-link for the guest
// too, so it reaches its neighbours directly, as the netns did. Every
// other destination goes through the router the responder advertises:
// the netns itself, which forwards with its own routes.
func buildLease6(np nicPlan, dns []net.IP, search []string) *Lease6 {
	if len(np.addrs6) == 0 {
		return nil
	}
	first := np.addrs6[0]
	l := &Lease6{
		MAC:       np.link.Attrs().HardwareAddr,
		IP:        first.IP.To16(),
		MTU:       np.link.Attrs().MTU,
		DNS:       dns,
		Search:    search,
		LeaseTime: leaseTime,
	}
	if l.MTU < 1280 {
		l.MTU = 0
	}
	for _, r := range np.routes6 {
		switch {
		case r.Dst != nil && (r.Dst.IP.IsLinkLocalUnicast() || r.Dst.IP.IsMulticast()):
			// fe80::/64 is every interface's.
		case r.Gw != nil || len(r.MultiPath) > 0 || isDefault(r.Dst):
			l.Router = true
		case r.Protocol == unix.RTPROT_KERNEL && r.Dst.Contains(l.IP):
			l.OnLink = append(l.OnLink, &net.IPNet{IP: r.Dst.IP.Mask(r.Dst.Mask), Mask: r.Dst.Mask})
		default:
			// An on-link route of the netns's own (ptp's route to its
			// gateway, say): the guest reaches it through the netns.
			l.Router = true
		}
	}
	return l
}

// sysctl6 is the path of an IPv6 setting of the netns's interfaces.
func sysctl6(iface, key string) string { return "/proc/sys/net/ipv6/conf/" + iface + "/" + key }

// haveForceForwarding reports whether the kernel has the per-interface
// force_forwarding setting; the caller is in the netns.
var haveForceForwarding = func() bool {
	_, err := os.Stat(sysctl6("default", "force_forwarding"))
	return err == nil
}

// planForwarding decides how the netns will forward the guests' IPv6
// traffic. A kernel with force_forwarding (6.17 and later) turns it on for
// the taps alone, and the setting goes with them. An older one needs the
// netns's forwarding switched on as a whole: the settings it had are
// recorded in the State, so that undo puts them back.
func planForwarding(p *podNS, pl *plan) error {
	if !slices.ContainsFunc(pl.nics, func(np nicPlan) bool { return len(np.addrs6) > 0 }) {
		return nil
	}
	return p.do(func() error {
		if haveForceForwarding() {
			return nil
		}
		// The directory holds "all" and "default" beside the interfaces.
		ifaces, err := os.ReadDir("/proc/sys/net/ipv6/conf")
		if err != nil {
			return fmt.Errorf("read ipv6 settings of netns %s: %w", p.path, err)
		}
		fw := map[string]string{}
		for _, e := range ifaces {
			iface := e.Name()
			b, err := os.ReadFile(sysctl6(iface, "forwarding"))
			if err != nil {
				return fmt.Errorf("read ipv6 forwarding of %s in netns %s: %w", iface, p.path, err)
			}
			fw[iface] = strings.TrimSpace(string(b))
		}
		pl.state.Forwarding6 = fw
		return nil
	})
}

// setForwarding6 turns on forwarding of the guest's IPv6 traffic, which
// comes in through tap: on the tap alone, or, when planForwarding
// recorded the netns's settings, on the whole netns. The tap's own
// forwarding setting makes the netns a router on it: its neighbour
// advertisements for the tap's address carry the router flag, without
// which a guest drops the default route through that address. The tap
// never accepts router advertisements, which only a hostile guest would
// send it. The tap's settings go with it.
func setForwarding6(p *podNS, tap string, whole bool) error {
	return p.do(func() error {
		settings := [][2]string{
			{sysctl6(tap, "accept_ra"), "0"},
			{sysctl6(tap, "disable_ipv6"), "0"}, // a netns may default to off
			{sysctl6(tap, "forwarding"), "1"},
		}
		if whole {
			settings = append(settings, [2]string{sysctl6("all", "forwarding"), "1"})
		} else {
			settings = append(settings, [2]string{sysctl6(tap, "force_forwarding"), "1"})
		}
		for _, kv := range settings {
			if err := os.WriteFile(kv[0], []byte(kv[1]), 0); err != nil {
				return fmt.Errorf("ipv6 forwarding from %s: write %s: %w", tap, kv[0], err)
			}
		}
		return nil
	})
}

// restoreForwarding6 puts back the forwarding settings planForwarding
// recorded: "all" first, since writing it sets every interface's.
// Interfaces that are gone are skipped.
func restoreForwarding6(p *podNS, fw map[string]string) error {
	if fw == nil {
		return nil
	}
	var errs []error
	err := p.do(func() error {
		write := func(iface string) {
			v, ok := fw[iface]
			if !ok || (v != "0" && v != "1") {
				return
			}
			b, err := os.ReadFile(sysctl6(iface, "forwarding"))
			if err == nil && strings.TrimSpace(string(b)) == v {
				return
			}
			if err == nil {
				err = os.WriteFile(sysctl6(iface, "forwarding"), []byte(v), 0)
			}
			if err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, fmt.Errorf("restore ipv6 forwarding of %s: %w", iface, err))
			}
		}
		write("all")
		for _, iface := range slices.Sorted(maps.Keys(fw)) {
			if iface != "all" && iface != "." && iface != ".." && !strings.Contains(iface, "/") {
				write(iface)
			}
		}
		return nil
	})
	return errors.Join(append(errs, err)...)
}
