package network

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/sirupsen/logrus"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// cleanupTimeout bounds the undo of a failed Setup.
const cleanupTimeout = 30 * time.Second

// Options tune Setup.
type Options struct {
	Hostname   string // offered to the guest (DHCP option 12)
	ResolvConf string // path of the pod's resolv.conf; "" or a missing file means no DNS options
	Logger     *logrus.Entry
	// Local are ports of the netns's loopback that the caller serves
	// itself (a VM's VNC server) instead of the guest: a port-forwarded
	// connection to one goes to its handler, which owns it.
	Local map[int]func(*net.TCPConn)
}

// NIC is one guest network card.
type NIC struct {
	Name   string           // CNI interface name (eth0)
	Tap    *os.File         // tap fd for QEMU (-netdev tap,fd=); owned by the Network, closed by Teardown
	MAC    net.HardwareAddr // for the guest NIC: the CNI interface's MAC
	Lease  *Lease           // nil when the interface has no IPv4 address
	Lease6 *Lease6          // nil when the interface has no global IPv6 address
}

// Network is a wired pod netns: taps, tc filters and DHCP responders.
type Network struct {
	p      *podNS
	state  *State
	logger *logrus.Entry
	nics   []NIC                      // set by Setup, read-only afterwards
	local  map[int]func(*net.TCPConn) // Options.Local

	cancel context.CancelFunc // stops the responders' Serve
	wg     sync.WaitGroup     // Serve goroutines

	mu         sync.Mutex // serialises Teardown; guards responders, guest6 and done
	responders []server
	guest6     guestAddr // the first IPv6 NIC's guest, on its tap; nil without one
	done       bool

	fwdMu    sync.Mutex    // guards fwd
	fwd      *forwarder    // nil when no NIC has a lease, or until it has started, or if it could not
	fwdTried chan struct{} // closed once the forwarder has started or failed to
}

// Setup wires every CNI interface of the netns at nsPath (a file such as
// /var/run/netns/cni-xxx or /proc/PID/ns/net) to a tap for the guest, in
// ifindex order: Inspect, then Wire.
func Setup(ctx context.Context, nsPath string, opts Options) (*Network, error) {
	pl, err := Inspect(ctx, nsPath, opts)
	if err != nil {
		return nil, err
	}
	return pl.Wire(ctx)
}

// Plan is a pod netns that has been read but not yet changed. Its State is
// everything Restore needs to undo Wire from any partial point, so a
// caller can write it down before Wire changes anything.
type Plan struct {
	p            *podNS
	pl           *plan
	opts         Options
	logger       *logrus.Entry
	dns, dns6    []net.IP
	search       []string
	used, closed bool
}

// Inspect reads the netns at nsPath and the pod's resolv.conf, and
// changes nothing. The Plan holds the netns open until Wire or Close.
func Inspect(ctx context.Context, nsPath string, opts Options) (*Plan, error) {
	logger := opts.Logger
	if logger == nil {
		logger = log.G(ctx)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	dns, dns6, search, err := readResolvConf(opts.ResolvConf)
	if err != nil {
		return nil, err
	}
	p, err := openNS(nsPath)
	if err != nil {
		return nil, err
	}
	pl, err := inspect(p)
	if err != nil {
		p.Close()
		return nil, err
	}
	return &Plan{p: p, pl: pl, opts: opts, logger: logger.WithField("netns", nsPath), dns: dns, dns6: dns6, search: search}, nil
}

// State is what Restore needs to undo Wire.
func (pl *Plan) State() *State { return pl.pl.state.clone() }

// Close lets go of a Plan that will not be wired.
func (pl *Plan) Close() {
	if !pl.used && !pl.closed {
		pl.closed = true
		pl.p.Close()
	}
}

// Wire wires every CNI interface of the plan to a tap for the guest, in
// ifindex order. On failure it undoes everything it did. An empty netns
// (only lo) yields a Network with no NICs. Wire writes nothing outside
// the netns. A Plan is wired at most once.
func (pl *Plan) Wire(ctx context.Context) (_ *Network, retErr error) {
	if pl.used || pl.closed {
		return nil, fmt.Errorf("netns %s: plan already used: %w", pl.p.path, errdefs.ErrFailedPrecondition)
	}
	pl.used = true
	srvCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	n := &Network{p: pl.p, state: &pl.pl.state, logger: pl.logger, cancel: cancel, local: pl.opts.Local, fwdTried: make(chan struct{})}
	defer func() {
		if retErr == nil {
			return
		}
		cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer ccancel()
		if err := n.Teardown(cctx); err != nil {
			// The State still lets Restore finish the job.
			pl.logger.WithError(err).Warn("undo partial network setup")
			n.p.Close()
		}
	}()
	if err := allowNonlocalBind(n.p, n.state); err != nil {
		return nil, err
	}
	for i := range pl.pl.nics {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if err := n.wire(srvCtx, &pl.pl.nics[i], pl); err != nil {
			return nil, err
		}
	}
	// Port-forward is not needed before the guest has booted: its BPF
	// programs load off the way to the guest running.
	n.wg.Go(func() {
		defer close(n.fwdTried)
		n.startForwarder(srvCtx)
	})
	pl.logger.WithField("nics", len(n.nics)).Debug("pod network wired")
	return n, nil
}

// startForwarder makes the netns's loopback reach the first leased NIC's
// guest, for CRI port-forward: over IPv4 when a NIC has an IPv4 lease,
// else over IPv6 to the guest's link-local address. Pod networking works
// without it, so a failure is only logged.
func (n *Network) startForwarder(ctx context.Context) {
	var guest guestAddr
	for _, nic := range n.nics {
		if nic.Lease != nil {
			guest = fixedGuest(nic.Lease.IP)
			break
		}
	}
	if guest == nil {
		guest = n.guest6
	}
	if guest != nil {
		f, err := startForwarder(ctx, n.p, guest, n.local, n.logger)
		if err != nil {
			if ctx.Err() == nil {
				n.logger.WithError(err).Warn("port-forward to the guest will not work: cannot steer the netns's loopback to it with BPF sk_lookup")
			}
			return
		}
		n.fwdMu.Lock()
		defer n.fwdMu.Unlock()
		if ctx.Err() != nil {
			// Teardown has begun, and will not see it.
			if err := f.Close(); err != nil {
				n.logger.WithError(err).Debug("stop port-forward")
			}
			return
		}
		n.fwd = f
		return
	}
}

// wire turns one CNI interface into a NIC: tap, tc both ways (the CNI
// link's classifiers included), then the IPv4 and the IPv6 side of the
// guest's addresses.
func (n *Network) wire(ctx context.Context, np *nicPlan, pl *Plan) error {
	link := np.link
	name := link.Attrs().Name
	f, tap, err := createTap(n.p, np.tap, link.Attrs().MTU)
	if err != nil {
		return err
	}
	n.nics = append(n.nics, NIC{Name: name, Tap: f, MAC: link.Attrs().HardwareAddr})
	nic := &n.nics[len(n.nics)-1]
	filters, err := tapFilters(tap.Attrs().Index, link.Attrs().Index, tap.Attrs().HardwareAddr, np.linkLocal)
	if err != nil {
		return err
	}
	linkFs := linkFilters(link.Attrs().Index, tap.Attrs().Index)
	if prog := n.loadSock(np); prog != nil {
		// The filter holds the classifier once added: ours is closed after.
		defer prog.Close()
		linkFs = append(linkFs, sockFilter(link.Attrs().Index, prog))
	}
	var router6 net.IP
	if len(np.addrs6) > 0 {
		router6 = eui64LinkLocal(tap.Attrs().HardwareAddr)
		// The filters hold the classifiers once added: ours are closed after.
		var tapProg, linkProg *ebpf.Program
		if tapProg, err = loadCtl6(tapRules6(router6)); err != nil {
			return fmt.Errorf("%s: %w", np.tap, err)
		}
		defer tapProg.Close()
		if linkProg, err = loadCtl6(linkRules6(tap.Attrs().Index)); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		defer linkProg.Close()
		filters = append(filters, tapFilters6(tap.Attrs().Index, router6, tapProg)...)
		linkFs = append(linkFs, linkFilters6(link.Attrs().Index, tap.Attrs().Index, linkProg)...)
	}
	if err := installIngress(n.p, tap, filters); err != nil {
		return err
	}
	if err := installIngress(n.p, link, linkFs); err != nil {
		return err
	}
	if nic.Lease, err = n.wire4(ctx, np, tap, pl); err != nil {
		return err
	}
	if router6 != nil {
		nic.Lease6, err = n.wire6(ctx, np, tap, router6, pl)
	}
	return err
}

// wire4 hands the guest the interface's first IPv4 address: the veth's
// IPv4 addresses no longer local but to what the CNI link's classifier
// passes to the netns's sockets, the netns's route to the guest, a DHCP
// responder. No lease when the interface has no IPv4 address.
func (n *Network) wire4(ctx context.Context, np *nicPlan, tap netlink.Link, pl *Plan) (*Lease, error) {
	link := np.link
	name := link.Attrs().Name
	// First the way to the netns's own sockets, so that none of their
	// packets is lost once the addresses are no longer local.
	if len(np.addrs) > 0 {
		if err := addSockRoutes(n.p, link, np.addrs, n.state.SockTable); err != nil {
			return nil, err
		}
	}
	// The interface keeps its addresses, so that what reads them (`ip
	// addr`, `nerdctl inspect`) still shows the pod's, but the netns stops
	// treating them as its own: without their local routes, the netns's
	// traffic to the pod IP takes the route to the guest. inspect recorded
	// the local routes; undo puts them back.
	for _, a := range np.addrs {
		local := &netlink.Route{
			LinkIndex: link.Attrs().Index, Dst: &net.IPNet{IP: a.IP.To4(), Mask: net.CIDRMask(32, 32)},
			Table: unix.RT_TABLE_LOCAL, Type: unix.RTN_LOCAL, Scope: netlink.SCOPE_HOST,
		}
		if err := n.p.h.RouteDel(local); err != nil && !isNotFound(err) {
			return nil, fmt.Errorf("remove the local route of %s on %s: %w", a.IPNet, name, err)
		}
	}
	lease := buildLease(*np, pl.dns, pl.search, pl.opts.Hostname)
	if lease == nil {
		return nil, nil
	}
	if err := addLocalRoute(n.p, tap, np.linkLocal, lease.IP); err != nil {
		return nil, err
	}
	var r *Responder
	err := n.p.do(func() error {
		var err error
		r, err = NewResponder(tap.Attrs().Index, tap.Attrs().HardwareAddr, *lease, n.logger.WithField("link", name))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("start dhcp responder on %s: %w", np.tap, err)
	}
	n.serve(ctx, r, name, "dhcp responder stopped")
	return lease, nil
}

// loadSock loads the classifier that passes to the netns stack what its
// own sockets own of the traffic to np's addresses (sockProgram). Without
// it the guest gets all of that traffic, as it did before the pod could
// hold other containers; so a kernel that cannot run it (one without
// bpf_skc_lookup_tcp, before 5.2) gets a warning, and nil.
func (n *Network) loadSock(np *nicPlan) *ebpf.Program {
	var addrs4, addrs6 []net.IP
	for _, a := range np.addrs {
		addrs4 = append(addrs4, a.IP.To4())
	}
	for _, a := range np.addrs6 {
		addrs6 = append(addrs6, a.IP.To16())
	}
	if len(addrs4) == 0 && len(addrs6) == 0 {
		return nil
	}
	prog, err := loadSock(addrs4, addrs6)
	if err != nil {
		n.logger.WithError(err).WithField("link", np.link.Attrs().Name).
			Warn("the pod's other containers will get no traffic from the pod network: the guest gets all of it")
		return nil
	}
	return prog
}

// wire6 hands the guest the interface's first global IPv6 address. The
// interface keeps its IPv6 addresses and routes: the netns still resolves
// its neighbours on the pod network with them. The tap gets the router's
// link-local address and forwards the guest's IPv6 traffic to the netns's
// routes, and a responder answers the guest's router solicitations and
// DHCPv6.
func (n *Network) wire6(ctx context.Context, np *nicPlan, tap netlink.Link, router net.IP, pl *Plan) (*Lease6, error) {
	name := np.link.Attrs().Name
	lease := buildLease6(*np, pl.dns6, pl.search)
	if err := setForwarding6(n.p, np.tap, pl.pl.state.Forwarding6 != nil); err != nil {
		return nil, err
	}
	addr := &netlink.Addr{
		IPNet: &net.IPNet{IP: router, Mask: net.CIDRMask(64, 128)},
		Flags: unix.IFA_F_NODAD, Scope: unix.RT_SCOPE_LINK,
	}
	if err := n.p.h.AddrAdd(tap, addr); err != nil {
		return nil, fmt.Errorf("add %s to %s: %w", addr.IPNet, np.tap, err)
	}
	var r *Responder6
	err := n.p.do(func() error {
		var err error
		r, err = NewResponder6(tap.Attrs().Index, router, *lease, n.logger.WithField("link", name))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("start ipv6 responder on %s: %w", np.tap, err)
	}
	n.mu.Lock()
	if n.guest6 == nil {
		zone := strconv.Itoa(tap.Attrs().Index)
		n.guest6 = func() *net.IPAddr { return &net.IPAddr{IP: r.GuestAddr(), Zone: zone} }
	}
	n.mu.Unlock()
	n.serve(ctx, r, name, "ipv6 responder stopped")
	return lease, nil
}

// server is a responder: it answers until its context is done or it is
// closed.
type server interface {
	Serve(context.Context) error
	Close() error
}

// serve runs r until ctx is done or Teardown closes it.
func (n *Network) serve(ctx context.Context, r server, link, stopped string) {
	n.mu.Lock()
	n.responders = append(n.responders, r)
	n.mu.Unlock()
	logger := n.logger.WithField("link", link)
	n.wg.Go(func() {
		if err := r.Serve(ctx); err != nil && ctx.Err() == nil {
			logger.WithError(err).Error(stopped)
		}
	})
}

// NICs returns the guest NICs in CNI attach order.
func (n *Network) NICs() []NIC {
	return append([]NIC(nil), n.nics...)
}

// State returns what Restore needs to undo Setup.
func (n *Network) State() *State {
	return n.state.clone()
}

// Teardown stops the responders, closes the taps, removes the tc qdiscs and
// filters, taps, link-local addresses and host routes, and restores the
// recorded addresses and routes of each CNI interface exactly, so CNI DEL
// succeeds. Idempotent; after an error it can be called again.
func (n *Network) Teardown(ctx context.Context) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.done {
		return nil
	}
	n.cancel()
	n.fwdMu.Lock()
	if n.fwd != nil {
		if err := n.fwd.Close(); err != nil {
			n.logger.WithError(err).Debug("stop port-forward")
		}
		n.fwd = nil
	}
	n.fwdMu.Unlock()
	for _, r := range n.responders {
		if err := r.Close(); err != nil {
			n.logger.WithError(err).Debug("close dhcp responder")
		}
	}
	n.responders = nil
	if err := wait(ctx, &n.wg); err != nil {
		return fmt.Errorf("stop dhcp responders and port-forward in netns %s: %w", n.p.path, err)
	}
	n.closeTaps()
	if err := undo(ctx, n.p, n.state, n.logger); err != nil {
		return err
	}
	n.p.Close()
	n.done = true
	return nil
}

// closeTaps closes this process's tap fds; a tap nobody else holds vanishes.
func (n *Network) closeTaps() {
	for _, nic := range n.nics {
		if err := nic.Tap.Close(); err != nil && !errors.Is(err, os.ErrClosed) {
			n.logger.WithError(err).WithField("link", nic.Name).Debug("close tap")
		}
	}
}

// wait waits for wg or ctx, whichever is first.
func wait(ctx context.Context, wg *sync.WaitGroup) error {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Restore is Teardown from a State alone, for the shim's delete action
// after a crash. Idempotent. A netns that no longer exists, or whose path
// now names another namespace, is left alone.
func Restore(ctx context.Context, st *State) error {
	if st == nil || st.NetNS == "" {
		return nil
	}
	logger := log.G(ctx).WithField("netns", st.NetNS)
	p, err := openNS(st.NetNS)
	if errors.Is(err, errdefs.ErrNotFound) {
		logger.Debug("netns is gone, nothing to restore")
		return nil
	}
	if err != nil {
		return err
	}
	defer p.Close()
	if st.NetNSID != "" && p.ns.UniqueId() != st.NetNSID {
		logger.Warn("netns path names another namespace now, leaving it alone")
		return nil
	}
	return undo(ctx, p, st, logger)
}
