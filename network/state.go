package network

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"

	"github.com/containerd/errdefs"
	"github.com/sirupsen/logrus"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// State is everything Restore needs to undo Setup, kept as JSON in the
// bundle. Inspect gives it (Plan.State) before Wire changes anything.
type State struct {
	NetNS   string       `json:"netns"`              // path Setup was given
	NetNSID string       `json:"netns_id,omitempty"` // device and inode, so a reused path is not touched
	NICs    []NICState   `json:"nics,omitempty"`
	Routes  []RouteState `json:"routes,omitempty"` // IPv4 routes that vanish with the removed addresses
	// Forwarding6 holds net.ipv6.conf.*.forwarding as found ("all",
	// "default" and each interface), when the netns's kernel has no
	// force_forwarding and Wire turns forwarding on for the whole netns.
	Forwarding6 map[string]string `json:"forwarding6,omitempty"`
	// SockTable is the routing table that delivers to the netns's own
	// sockets the IPv4 packets of theirs that arrive on the CNI
	// interfaces (a rule per interface looks it up); 0: none. Every
	// rule to it and every route in it is Wire's.
	SockTable int `json:"sock_table,omitempty"`
	// NonlocalBind is net.ipv4.ip_nonlocal_bind as found, when Wire
	// turns it on; "": untouched.
	NonlocalBind string `json:"nonlocal_bind,omitempty"`
}

// NICState is one wired CNI interface.
type NICState struct {
	Link      string      `json:"link"`                 // CNI interface name, e.g. eth0
	Tap       string      `json:"tap"`                  // tap created for it, e.g. vmtap0
	LinkLocal string      `json:"link_local,omitempty"` // tap address; empty when Link has no IPv4
	TxQLen    int         `json:"txqlen"`               // Link's; adding a qdisc turns 0 into 1000
	Addrs     []AddrState `json:"addrs,omitempty"`      // IPv4 addresses taken off Link, in kernel order
}

// AddrState is one IPv4 address as the kernel reported it.
type AddrState struct {
	Local       string `json:"local"` // CIDR
	Peer        string `json:"peer,omitempty"`
	Broadcast   string `json:"broadcast,omitempty"`
	Label       string `json:"label,omitempty"`
	Flags       int    `json:"flags,omitempty"`
	Scope       int    `json:"scope,omitempty"`
	ValidLft    int    `json:"valid_lft,omitempty"`
	PreferedLft int    `json:"preferred_lft,omitempty"`
}

// RouteState is one IPv4 route as the kernel reported it.
type RouteState struct {
	Link     string `json:"link,omitempty"` // output interface name
	Dst      string `json:"dst"`            // CIDR; 0.0.0.0/0 for a default route
	Gw       string `json:"gw,omitempty"`
	Src      string `json:"src,omitempty"`
	Table    int    `json:"table,omitempty"`
	Priority int    `json:"priority,omitempty"`
	Protocol int    `json:"protocol,omitempty"`
	Scope    int    `json:"scope,omitempty"`
	Type     int    `json:"type,omitempty"`
	Tos      int    `json:"tos,omitempty"`
	Flags    int    `json:"flags,omitempty"`
	Realm    int    `json:"realm,omitempty"`
	Metrics  `json:"metrics,omitzero"`
}

// Metrics are a route's RTA_METRICS.
type Metrics struct {
	MTU              int    `json:"mtu,omitempty"`
	MTULock          bool   `json:"mtu_lock,omitempty"`
	Window           int    `json:"window,omitempty"`
	Rtt              int    `json:"rtt,omitempty"`
	RttVar           int    `json:"rttvar,omitempty"`
	Ssthresh         int    `json:"ssthresh,omitempty"`
	Cwnd             int    `json:"cwnd,omitempty"`
	AdvMSS           int    `json:"advmss,omitempty"`
	Reordering       int    `json:"reordering,omitempty"`
	Hoplimit         int    `json:"hoplimit,omitempty"`
	InitCwnd         int    `json:"initcwnd,omitempty"`
	Features         int    `json:"features,omitempty"`
	RtoMin           int    `json:"rto_min,omitempty"`
	RtoMinLock       bool   `json:"rto_min_lock,omitempty"`
	InitRwnd         int    `json:"initrwnd,omitempty"`
	QuickACK         int    `json:"quickack,omitempty"`
	Congctl          string `json:"congctl,omitempty"`
	FastOpenNoCookie int    `json:"fastopen_no_cookie,omitempty"`
}

// clone returns a deep copy of st.
func (st *State) clone() *State {
	c := *st
	c.NICs = make([]NICState, len(st.NICs))
	for i, n := range st.NICs {
		n.Addrs = slices.Clone(n.Addrs)
		c.NICs[i] = n
	}
	c.Routes = slices.Clone(st.Routes)
	c.Forwarding6 = maps.Clone(st.Forwarding6)
	return &c
}

func ipString(ip net.IP) string {
	if ip == nil {
		return ""
	}
	return ip.String()
}

func netString(n *net.IPNet) string {
	if n == nil {
		return ""
	}
	return n.String()
}

// parseNet parses a CIDR keeping the address itself (not the network).
func parseNet(s string) (*net.IPNet, error) {
	if s == "" {
		return nil, nil
	}
	ip, n, err := net.ParseCIDR(s)
	if err != nil {
		return nil, fmt.Errorf("address %q: %w", s, errdefs.ErrInvalidArgument)
	}
	n.IP = ip.To4()
	if n.IP == nil {
		return nil, fmt.Errorf("address %q is not IPv4: %w", s, errdefs.ErrInvalidArgument)
	}
	return n, nil
}

func parseIP(s string) (net.IP, error) {
	if s == "" {
		return nil, nil
	}
	ip := net.ParseIP(s).To4()
	if ip == nil {
		return nil, fmt.Errorf("address %q is not IPv4: %w", s, errdefs.ErrInvalidArgument)
	}
	return ip, nil
}

// addrState records a as reported by the kernel.
func addrState(a netlink.Addr) AddrState {
	s := AddrState{
		Local:       netString(a.IPNet),
		Peer:        netString(a.Peer),
		Label:       a.Label,
		Flags:       a.Flags,
		Scope:       a.Scope,
		ValidLft:    a.ValidLft,
		PreferedLft: a.PreferedLft,
	}
	if a.Broadcast != nil && !a.Broadcast.IsUnspecified() {
		s.Broadcast = a.Broadcast.String()
	}
	return s
}

// addr turns s back into an address to add to the link with index idx.
func (s AddrState) addr(idx int) (*netlink.Addr, error) {
	local, err := parseNet(s.Local)
	if err != nil || local == nil {
		return nil, fmt.Errorf("address %q: %w", s.Local, errdefs.ErrInvalidArgument)
	}
	peer, err := parseNet(s.Peer)
	if err != nil {
		return nil, err
	}
	brd, err := parseIP(s.Broadcast)
	if err != nil {
		return nil, err
	}
	if brd == nil {
		brd = net.IPv4zero // no broadcast, rather than the one netlink would compute
	}
	return &netlink.Addr{
		IPNet: local, Peer: peer, Broadcast: brd, Label: s.Label, LinkIndex: idx,
		// The kernel decides which address is secondary.
		Flags: s.Flags &^ unix.IFA_F_SECONDARY, Scope: s.Scope,
		ValidLft: s.ValidLft, PreferedLft: s.PreferedLft,
	}, nil
}

// routeState records r, whose output interface is named link. Routes that
// Restore could not rebuild exactly are refused.
func routeState(r netlink.Route, link string) (RouteState, error) {
	if len(r.MultiPath) > 0 || r.Encap != nil || r.Via != nil || r.NewDst != nil || r.MPLSDst != nil {
		return RouteState{}, fmt.Errorf("route %s on %s: multipath and encapsulated routes are not supported: %w",
			netString(r.Dst), link, errdefs.ErrNotImplemented)
	}
	dst := r.Dst
	if dst == nil {
		dst = &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}
	}
	return RouteState{
		Link: link, Dst: dst.String(), Gw: ipString(r.Gw), Src: ipString(r.Src),
		Table: r.Table, Priority: r.Priority, Protocol: int(r.Protocol), Scope: int(r.Scope),
		Type: r.Type, Tos: r.Tos, Flags: r.Flags & unix.RTNH_F_ONLINK, Realm: r.Realm,
		Metrics: Metrics{
			MTU: r.MTU, MTULock: r.MTULock, Window: r.Window, Rtt: r.Rtt, RttVar: r.RttVar,
			Ssthresh: r.Ssthresh, Cwnd: r.Cwnd, AdvMSS: r.AdvMSS, Reordering: r.Reordering,
			Hoplimit: r.Hoplimit, InitCwnd: r.InitCwnd, Features: r.Features, RtoMin: r.RtoMin,
			RtoMinLock: r.RtoMinLock, InitRwnd: r.InitRwnd, QuickACK: r.QuickACK,
			Congctl: r.Congctl, FastOpenNoCookie: r.FastOpenNoCookie,
		},
	}, nil
}

// route turns s back into a route through the link with index idx.
func (s RouteState) route(idx int) (*netlink.Route, error) {
	dst, err := parseNet(s.Dst)
	if err != nil || dst == nil {
		return nil, fmt.Errorf("route destination %q: %w", s.Dst, errdefs.ErrInvalidArgument)
	}
	dst.IP = dst.IP.Mask(dst.Mask)
	gw, err := parseIP(s.Gw)
	if err != nil {
		return nil, err
	}
	src, err := parseIP(s.Src)
	if err != nil {
		return nil, err
	}
	m := s.Metrics
	return &netlink.Route{
		LinkIndex: idx, Dst: dst, Gw: gw, Src: src, Family: netlink.FAMILY_V4,
		Table: s.Table, Priority: s.Priority, Protocol: netlink.RouteProtocol(s.Protocol),
		Scope: netlink.Scope(s.Scope), Type: s.Type, Tos: s.Tos, Flags: s.Flags, Realm: s.Realm,
		MTU: m.MTU, MTULock: m.MTULock, Window: m.Window, Rtt: m.Rtt, RttVar: m.RttVar,
		Ssthresh: m.Ssthresh, Cwnd: m.Cwnd, AdvMSS: m.AdvMSS, Reordering: m.Reordering,
		Hoplimit: m.Hoplimit, InitCwnd: m.InitCwnd, Features: m.Features, RtoMin: m.RtoMin,
		RtoMinLock: m.RtoMinLock, InitRwnd: m.InitRwnd, QuickACK: m.QuickACK,
		Congctl: m.Congctl, FastOpenNoCookie: m.FastOpenNoCookie,
	}, nil
}

// restoreOrder sorts routes so that each one's gateway is reachable when it
// is added: routes without a gateway first, narrowest scope first.
func restoreOrder(routes []RouteState) []RouteState {
	out := slices.Clone(routes)
	slices.SortStableFunc(out, func(a, b RouteState) int {
		if (a.Gw == "") != (b.Gw == "") {
			if a.Gw == "" {
				return -1
			}
			return 1
		}
		return b.Scope - a.Scope
	})
	return out
}

// undo reverts everything st describes, from any partial point: it removes
// the CNI links' qdiscs and the taps (with their addresses and routes), then
// puts back the recorded txqueuelen, addresses and routes, and removes the
// routing of the netns's own sockets. Missing links are skipped.
func undo(ctx context.Context, p *podNS, st *State, logger *logrus.Entry) error {
	var errs []error
	index := map[string]int{}
	for i := len(st.NICs) - 1; i >= 0; i-- {
		if err := ctx.Err(); err != nil {
			return err
		}
		nic := st.NICs[i]
		link, err := p.h.LinkByName(nic.Link)
		if err != nil {
			if !isNotFound(err) {
				errs = append(errs, fmt.Errorf("find link %s: %w", nic.Link, err))
			} else {
				logger.WithField("link", nic.Link).Warn("cni interface is gone, nothing to restore on it")
			}
			link = nil
		}
		if link != nil {
			if err := removeIngress(p, link); err != nil {
				errs = append(errs, err)
			}
		}
		if err := deleteTap(p, nic.Tap); err != nil {
			errs = append(errs, err)
		}
		if link == nil {
			continue
		}
		index[nic.Link] = link.Attrs().Index
		if link.Attrs().TxQLen != nic.TxQLen && nic.TxQLen >= 0 {
			if err := p.h.LinkSetTxQLen(link, nic.TxQLen); err != nil {
				errs = append(errs, fmt.Errorf("restore txqueuelen %d of %s: %w", nic.TxQLen, nic.Link, err))
			}
		}
		for _, as := range nic.Addrs {
			a, err := as.addr(link.Attrs().Index)
			if err == nil {
				err = p.h.AddrAdd(link, a)
			}
			if err != nil && !isExist(err) {
				errs = append(errs, fmt.Errorf("restore address %s on %s: %w", as.Local, nic.Link, err))
			}
		}
	}
	for _, rs := range restoreOrder(st.Routes) {
		if err := ctx.Err(); err != nil {
			return err
		}
		idx := 0
		if rs.Link != "" {
			var ok bool
			if idx, ok = index[rs.Link]; !ok {
				link, err := p.h.LinkByName(rs.Link)
				if err != nil {
					if !isNotFound(err) {
						errs = append(errs, fmt.Errorf("find link %s: %w", rs.Link, err))
					}
					continue
				}
				idx = link.Attrs().Index
				index[rs.Link] = idx
			}
		}
		r, err := rs.route(idx)
		if err == nil {
			err = p.h.RouteAdd(r)
		}
		if err != nil && !isExist(err) {
			errs = append(errs, fmt.Errorf("restore route %s on %s: %w", rs.Dst, rs.Link, err))
		}
	}
	if err := undoSockets(p, st); err != nil {
		errs = append(errs, err)
	}
	if err := restoreForwarding6(p, st.Forwarding6); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("restore netns %s: %w", st.NetNS, err)
	}
	return nil
}
