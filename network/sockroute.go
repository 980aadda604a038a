package network

import (
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// While the guest owns the pod's IPv4 addresses, the netns has no local
// route to them (wire4): its own traffic to them goes to the guest. The
// packets the CNI link's classifier (sockProgram) passes up the netns
// stack are addressed to them all the same, and must be delivered to
// the socket that owns them. So a routing rule per CNI interface looks
// up what arrives on that interface in a table of the shim's, which
// holds the interface's IPv4 addresses as local; nothing else reaches
// that stack from the interface but DHCP replies, which no socket takes.
// And the netns lets sockets bind to those addresses, which are no longer
// local (net.ipv4.ip_nonlocal_bind), so a container can listen on the
// pod IP itself. IPv6 addresses stay local (wire6) and need neither.

// sockRulePref is the priority of those rules: after the local table's
// (0) and before the main table's (32766), whose host route to the pod
// IP leads to the guest.
const sockRulePref = 100

// sockTableBase is the first routing table planSockets tries.
const sockTableBase = 0x766d

// sysctlNonlocalBind is the netns's setting that lets sockets bind to an
// IPv4 address that is not local.
const sysctlNonlocalBind = "/proc/sys/net/ipv4/ip_nonlocal_bind"

// planSockets picks a routing table that no rule or route of the netns
// uses (routes: every IPv4 route of the netns, all tables) and records
// the netns's ip_nonlocal_bind, when a NIC has IPv4 addresses.
func planSockets(p *podNS, pl *plan, routes []netlink.Route) error {
	if !slices.ContainsFunc(pl.nics, func(np nicPlan) bool { return len(np.addrs) > 0 }) {
		return nil
	}
	rules, err := retryDump(func() ([]netlink.Rule, error) { return p.h.RuleList(netlink.FAMILY_V4) })
	if err != nil {
		return fmt.Errorf("list routing rules in netns %s: %w", p.path, err)
	}
	used := map[int]bool{}
	for _, r := range rules {
		used[r.Table] = true
	}
	for _, r := range routes {
		used[r.Table] = true
	}
	table := sockTableBase
	for used[table] {
		table++
	}
	var found string
	err = p.do(func() error {
		b, err := os.ReadFile(sysctlNonlocalBind)
		found = strings.TrimSpace(string(b))
		return err
	})
	if err != nil {
		return fmt.Errorf("read ip_nonlocal_bind of netns %s: %w", p.path, err)
	}
	pl.state.SockTable, pl.state.NonlocalBind = table, found
	return nil
}

// allowNonlocalBind lets sockets of the netns bind to the pod's IPv4
// addresses once they are no longer local; undoSockets puts back the
// setting the State recorded.
func allowNonlocalBind(p *podNS, st *State) error {
	if st.NonlocalBind == "" || st.NonlocalBind == "1" {
		return nil
	}
	return p.do(func() error {
		if err := os.WriteFile(sysctlNonlocalBind, []byte("1"), 0); err != nil {
			return fmt.Errorf("allow non-local bind in netns %s: %w", p.path, err)
		}
		return nil
	})
}

// addSockRoutes makes the IPv4 packets that arrive on link for one of
// addrs local to the netns stack: in table, a local route to each, and
// a rule that looks up table for what arrives on link.
func addSockRoutes(p *podNS, link netlink.Link, addrs []netlink.Addr, table int) error {
	name := link.Attrs().Name
	for _, a := range addrs {
		r := &netlink.Route{
			LinkIndex: link.Attrs().Index, Dst: &net.IPNet{IP: a.IP.To4(), Mask: net.CIDRMask(32, 32)},
			Table: table, Type: unix.RTN_LOCAL, Scope: netlink.SCOPE_HOST,
		}
		if err := p.h.RouteAdd(r); err != nil && !isExist(err) {
			return fmt.Errorf("route %s on %s to the netns's sockets: %w", a.IP, name, err)
		}
	}
	rule := sockRule(name, table)
	if err := p.h.RuleAdd(rule); err != nil && !isExist(err) {
		return fmt.Errorf("add routing rule for what arrives on %s: %w", name, err)
	}
	return nil
}

// sockRule is the rule that looks up table for what arrives on link.
func sockRule(link string, table int) *netlink.Rule {
	r := netlink.NewRule()
	r.Family = netlink.FAMILY_V4
	r.IifName = link
	r.Table = table
	r.Priority = sockRulePref
	return r
}

// undoSockets removes every rule to the State's table and every route in
// it, all of them addSockRoutes's (planSockets picked a table nothing
// used), and puts back ip_nonlocal_bind as it was found.
func undoSockets(p *podNS, st *State) error {
	var errs []error
	if st.SockTable != 0 {
		rules, err := retryDump(func() ([]netlink.Rule, error) { return p.h.RuleList(netlink.FAMILY_V4) })
		if err != nil {
			errs = append(errs, fmt.Errorf("list routing rules: %w", err))
		}
		for _, r := range rules {
			if r.Table != st.SockTable {
				continue
			}
			if err := p.h.RuleDel(&r); err != nil && !isNotFound(err) {
				errs = append(errs, fmt.Errorf("delete routing rule for %s to table %d: %w", r.IifName, r.Table, err))
			}
		}
		routes, err := retryDump(func() ([]netlink.Route, error) {
			return p.h.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: st.SockTable}, netlink.RT_FILTER_TABLE)
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("list routes of table %d: %w", st.SockTable, err))
		}
		for _, r := range routes {
			if err := p.h.RouteDel(&r); err != nil && !isNotFound(err) {
				errs = append(errs, fmt.Errorf("delete route %s of table %d: %w", r.Dst, st.SockTable, err))
			}
		}
	}
	if v := st.NonlocalBind; v == "0" || v == "1" {
		err := p.do(func() error {
			b, err := os.ReadFile(sysctlNonlocalBind)
			if err == nil && strings.TrimSpace(string(b)) != v {
				err = os.WriteFile(sysctlNonlocalBind, []byte(v), 0)
			}
			return err
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("restore ip_nonlocal_bind: %w", err))
		}
	}
	return errors.Join(errs...)
}
