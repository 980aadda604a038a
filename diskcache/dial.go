package diskcache

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/containerd/errdefs"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/vmshim/vmshim/thread"
)

// DefaultDeny is the default of config url_deny_cidrs: the link-local
// ranges (where most clouds serve instance metadata and credentials), the
// clouds' metadata addresses outside them, and the NAT64 and 6to4 forms
// of IPv4 link-local.
var DefaultDeny = []string{
	"169.254.0.0/16",      // IPv4 link-local: AWS, GCP, Azure, OpenStack… metadata, ECS task credentials
	"fe80::/10",           // IPv6 link-local
	"fd00:ec2::254/128",   // AWS instance metadata over IPv6
	"fd00:ec2::23/128",    // AWS EKS Pod Identity over IPv6
	"fd20:ce::254/128",    // GCP metadata over IPv6
	"100.100.100.200/32",  // Alibaba Cloud metadata
	"168.63.129.16/32",    // Azure WireServer
	"192.0.0.192/32",      // Oracle Cloud (classic) metadata
	"64:ff9b::a9fe:0/112", // NAT64 of 169.254.0.0/16
	"2002:a9fe::/32",      // 6to4 of 169.254.0.0/16
}

// ParseDeny parses deny list entries: CIDRs, or single addresses.
func ParseDeny(entries []string) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(entries))
	for _, e := range entries {
		p, err := netip.ParsePrefix(e)
		if err != nil {
			a, aerr := netip.ParseAddr(e)
			if aerr != nil || a.Zone() != "" {
				return nil, fmt.Errorf("%q is neither a CIDR nor an address", e)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// Netns is where a pod's downloads come from: connections are made in
// the pod's network namespace and never to a denied address. Its fields
// are set before first use.
type Netns struct {
	// Path is the network namespace file; "" dials from the caller's own
	// namespace (for tests).
	Path string
	// Nameservers answer the pod's DNS queries, on port 53: those of the
	// pod's resolv.conf. None means the servers of the shim's own
	// resolv.conf, still asked from inside the namespace.
	Nameservers []netip.Addr
	// Search is the pod's DNS search list, tried for names without a dot
	// first, and after the name itself for others.
	Search []string
	// Deny are the networks no connection may reach (config
	// url_deny_cidrs), IPv4-mapped IPv6 addresses included.
	Deny []netip.Prefix

	// lookup resolves a fully qualified name; nil means the pure Go
	// resolver with dialDNS. Tests replace it.
	lookup func(ctx context.Context, host string) ([]netip.Addr, error)
	// next picks the nameserver of the next DNS dial.
	next atomic.Uint32
}

// CheckNetns checks that path is a network namespace other than the
// caller's own, the only kind a pod's download may come from.
func CheckNetns(path string) error {
	if path == "" {
		return errorf(errdefs.ErrFailedPrecondition, nil, "disk-url: the container has no network namespace to fetch from")
	}
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return errorf(errdefs.ErrFailedPrecondition, err, "disk-url: open the container's network namespace %s", path)
	}
	defer ns.Close()
	if typ, err := unix.IoctlRetInt(int(ns), unix.NS_GET_NSTYPE); err != nil || typ != unix.CLONE_NEWNET {
		return errorf(errdefs.ErrFailedPrecondition, err, "disk-url: %s is not a network namespace", path)
	}
	self, err := netns.Get()
	if err != nil {
		return errorf(errdefs.ErrUnavailable, err, "disk-url: the shim's network namespace")
	}
	defer self.Close()
	if self.Equal(ns) {
		return errorf(errdefs.ErrFailedPrecondition, nil, "disk-url: the container has no network namespace to fetch from (it shares the node's)")
	}
	return nil
}

// denied returns the entry of the deny list that holds a, if any.
func (n *Netns) denied(a netip.Addr) (netip.Prefix, bool) {
	a = a.Unmap().WithZone("")
	for _, p := range n.Deny {
		if p.Contains(a) {
			return p, true
		}
	}
	return netip.Prefix{}, false
}

// deniedError is the final error of a connection to a denied address.
func deniedError(what string, p netip.Prefix) error {
	return errorf(errdefs.ErrFailedPrecondition, nil, "%s is in %s, which config url_deny_cidrs refuses", what, p)
}

// control is the net.Dialer's Control: every socket's connect, whatever
// asked for it (a redirect, a proxy, DNS), is checked against the deny
// list.
func (n *Netns) control(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return errorf(errdefs.ErrFailedPrecondition, err, "connect to %q: not an address", address)
	}
	if p, ok := n.denied(ap.Addr()); ok {
		return deniedError(ap.Addr().String(), p)
	}
	return nil
}

// DialContext connects to addr (host:port) from the namespace: it
// resolves the host (with the pod's nameservers), refuses the name if any
// of its addresses is denied, and dials the addresses one at a time, each
// from a thread in the namespace. It is the Transport's DialContext.
func (n *Netns) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, errorf(errdefs.ErrInvalidArgument, err, "dial %q", addr)
	}
	addrs, err := n.resolve(ctx, host)
	if err != nil {
		return nil, err
	}
	for _, a := range addrs {
		if p, ok := n.denied(a); ok {
			if a.String() == strings.Trim(host, "[]") {
				return nil, deniedError(a.String(), p)
			}
			return nil, deniedError(fmt.Sprintf("%s (the address of %s)", a, host), p)
		}
	}
	var errs []error
	for _, a := range addrs {
		conn, err := n.dial(ctx, network, a.String(), port)
		if err == nil {
			return conn, nil
		}
		if ctx.Err() != nil {
			return nil, err
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

// dial connects to one address from a thread in the namespace: the
// socket keeps the namespace it was made in.
func (n *Netns) dial(ctx context.Context, network, ip, port string) (net.Conn, error) {
	d := &net.Dialer{Timeout: dialTimeout, KeepAlive: keepAlive, FallbackDelay: -1, Control: n.control}
	var conn net.Conn
	fn := func() (err error) {
		conn, err = d.DialContext(ctx, network, net.JoinHostPort(ip, port))
		return err
	}
	if n.Path == "" {
		return conn, fn()
	}
	return conn, thread.Run(fn, thread.JoinNetns(n.Path))
}

// resolve returns the addresses of host: itself when it is an address,
// else the answers of the pod's nameservers, following the pod's search
// list (a name with no dot tries it first, others after the name).
func (n *Netns) resolve(ctx context.Context, host string) ([]netip.Addr, error) {
	if a, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		return []netip.Addr{a.WithZone("")}, nil
	}
	lookup := n.lookup
	if lookup == nil {
		r := &net.Resolver{PreferGo: true, Dial: n.dialDNS}
		lookup = func(ctx context.Context, fqdn string) ([]netip.Addr, error) { return r.LookupNetIP(ctx, "ip", fqdn) }
	}
	var names []string
	if strings.HasSuffix(host, ".") {
		names = []string{host}
	} else {
		for _, s := range n.Search {
			names = append(names, host+"."+strings.TrimSuffix(s, ".")+".")
		}
		if strings.Contains(host, ".") {
			names = append([]string{host + "."}, names...)
		} else {
			names = append(names, host+".")
		}
	}
	var notFound, other error
	for _, name := range names {
		addrs, err := lookup(ctx, name)
		if err == nil && len(addrs) > 0 {
			return addrs, nil
		}
		var dnsErr *net.DNSError
		switch {
		case err == nil || (errors.As(err, &dnsErr) && dnsErr.IsNotFound):
			if notFound == nil {
				notFound = errors.New("no such host")
			}
		case other == nil:
			other = err
		}
		if ctx.Err() != nil {
			break
		}
	}
	if other != nil {
		// Worth another attempt: the download retries.
		return nil, fmt.Errorf("resolve %s: %w", host, other)
	}
	return nil, errorf(errdefs.ErrNotFound, notFound, "resolve %s", host)
}

// dialDNS is the resolver's Dial: it dials the pod's nameservers in turn
// (or, when the pod has none, the server the resolver names) from the
// namespace, through control like any other connection.
func (n *Netns) dialDNS(ctx context.Context, network, address string) (net.Conn, error) {
	host, port := address, "53"
	if len(n.Nameservers) > 0 {
		i := int(n.next.Add(1)-1) % len(n.Nameservers)
		host = n.Nameservers[i].String()
	} else if h, p, err := net.SplitHostPort(address); err == nil {
		host, port = h, p
	}
	return n.dial(ctx, network, host, port)
}
