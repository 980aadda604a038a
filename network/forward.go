package network

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/containerd/errdefs"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
)

// forwardDialTimeout bounds a dial to the guest, which may be slow to
// answer under TCG.
const forwardDialTimeout = 10 * time.Second

// acceptBackoff is the pause after an accept error that is not a close,
// such as running out of descriptors.
const acceptBackoff = 100 * time.Millisecond

// Offsets in the kernel's struct bpf_sk_lookup (include/uapi/linux/bpf.h).
const (
	skLookupFamily   = 8  // __u32
	skLookupProtocol = 12 // __u32
	skLookupRemPort  = 36 // __be16
	skLookupLocalIP4 = 40 // __u32, network order
	skLookupLocalIP6 = 44 // __u32[4], network order
)

// skPass lets a socket lookup go on with the socket selected, if any.
const skPass = 1

// Keys of the listening sockets in the sockmap.
const (
	keyLoopback4 uint32 = iota // 127.0.0.1
	keyLoopback6               // ::1
)

// guestAddr says where the guest is: its IPv4 address, or its IPv6
// link-local address with the tap's index as the zone.
type guestAddr func() *net.IPAddr

// fixedGuest is a guest at ip; nil when ip is nil.
func fixedGuest(ip net.IP) guestAddr {
	if ip == nil {
		return nil
	}
	return func() *net.IPAddr { return &net.IPAddr{IP: ip} }
}

// forwarder relays TCP connections made to the netns's loopback, on any
// port, to the same port on the guest, or to a socket of the netns that
// listens on it (dialNetns). A sk_lookup program attached to the netns
// hands every TCP lookup for 127.0.0.1 (and ::1) to one listening socket
// of the forwarder, but for the forwarder's own connections to the
// netns's listeners; the port the client dialled is the accepted
// connection's local port. A second program, on the guest's tap, brings
// back the guest's replies to the relay's source address even when the
// guest routes them through its gateway (steerReplies). The programs are
// detached when their links' fds are closed, by Close or by the process
// dying; nothing is pinned.
type forwarder struct {
	p      *podNS
	guest  guestAddr
	local  map[int]func(*net.TCPConn) // ports served by their handlers, not the guest
	src    net.IP                     // the relay's source address; nil: the route's
	logger *logrus.Entry
	ctx    context.Context // ends dials; cancelled by Close
	cancel context.CancelFunc

	sockmap   *ebpf.Map
	own       *ebpf.Map // source ports of dialNetns's connections, which the program leaves alone
	prog      *ebpf.Program
	link      link.Link
	replyProg *ebpf.Program // brings the guest's replies to src back (steerReplies); nil without it
	replyLink link.Link
	lns       []*net.TCPListener
	stop      func() bool // unregisters the listeners' closing on ctx
	wg        sync.WaitGroup

	mu     sync.Mutex // guards conns and closed
	conns  map[*net.TCPConn]struct{}
	closed bool
}

// startForwarder makes every TCP connection to the loopback of p, on any
// port, reach the same port on guest. It stops when ctx is done or Close
// is called; only Close releases it.
func startForwarder(ctx context.Context, p *podNS, guest guestAddr, local map[int]func(*net.TCPConn), logger *logrus.Entry) (_ *forwarder, retErr error) {
	if guest == nil {
		return nil, fmt.Errorf("port-forward in netns %s: no guest address: %w", p.path, errdefs.ErrInvalidArgument)
	}
	fctx, cancel := context.WithCancel(ctx)
	f := &forwarder{
		p: p, guest: guest, local: local, logger: logger.WithField("netns", p.path),
		ctx: fctx, cancel: cancel, conns: map[*net.TCPConn]struct{}{},
	}
	defer func() {
		if retErr != nil {
			_ = f.Close()
		}
	}()
	var err error
	f.sockmap, err = ebpf.NewMap(&ebpf.MapSpec{
		Name: "vmshim_fwd", Type: ebpf.SockMap, KeySize: 4, ValueSize: 8, MaxEntries: 2,
	})
	if err != nil {
		return nil, fmt.Errorf("create sockmap: %w", err)
	}
	if f.own, err = newOwnPorts(); err != nil {
		return nil, err
	}
	f.prog, err = ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:         "vmshim_fwd",
		Type:         ebpf.SkLookup,
		AttachType:   ebpf.AttachSkLookup,
		Instructions: lookupProgram(f.sockmap.FD(), f.own.FD()),
		License:      "Dual MIT/GPL",
	})
	if err != nil {
		return nil, fmt.Errorf("load sk_lookup program: %w", err)
	}
	if err := f.listen("tcp4", net.IPv4(127, 0, 0, 1), keyLoopback4); err != nil {
		return nil, err
	}
	if err := f.listen("tcp6", net.IPv6loopback, keyLoopback6); err != nil {
		// Only IPv4 is required: CRI dials tcp4 first.
		f.logger.WithError(err).Debug("no port-forward on ::1")
	}
	if guest().IP.To4() != nil {
		if f.src, err = f.steerReplies(); err != nil {
			// Guests that route the tap's address on-link still answer.
			f.logger.WithError(err).Warn("port-forward reaches only guests that apply DHCP option 121 (classless routes)")
		}
	}
	l, err := link.AttachNetNs(int(p.ns), f.prog)
	if err != nil {
		return nil, fmt.Errorf("attach sk_lookup program to netns %s: %w", p.path, err)
	}
	f.link = l
	f.stop = context.AfterFunc(fctx, f.closeListeners)
	for _, ln := range f.lns {
		f.wg.Go(func() { f.serve(ln) })
	}
	f.logger.WithField("guest", guest().String()).Debug("port-forward to the guest ready")
	return f, nil
}

// lookupProgram is the sk_lookup program: a TCP lookup for 127.0.0.1 or
// ::1, any port, selects the socket at keyLoopback4 or keyLoopback6 of the
// sockmap; a lookup from a source port in the own map (dialNetns's), any
// other lookup, or a missing socket, goes on unchanged.
func lookupProgram(sockmap, own int) asm.Instructions {
	// The addresses are in network order in memory; a 32-bit load reads
	// them in host order.
	lo4 := int32(binary.NativeEndian.Uint32([]byte{127, 0, 0, 1}))
	lo6 := int32(binary.NativeEndian.Uint32([]byte{0, 0, 0, 1}))
	return asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.LoadMem(asm.R2, asm.R6, skLookupProtocol, asm.Word),
		asm.JNE.Imm32(asm.R2, unix.IPPROTO_TCP, "pass"),

		// bpf_map_lookup_elem(&own, &remote_port): one of ours
		asm.LoadMem(asm.R2, asm.R6, skLookupRemPort, asm.Half),
		asm.StoreMem(asm.RFP, -4, asm.R2, asm.Word),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -4),
		asm.LoadMapPtr(asm.R1, own),
		asm.FnMapLookupElem.Call(),
		asm.JNE.Imm(asm.R0, 0, "pass"),

		asm.LoadMem(asm.R2, asm.R6, skLookupFamily, asm.Word),
		asm.JEq.Imm32(asm.R2, unix.AF_INET6, "ip6"),
		asm.JNE.Imm32(asm.R2, unix.AF_INET, "pass"),
		asm.LoadMem(asm.R2, asm.R6, skLookupLocalIP4, asm.Word),
		asm.JNE.Imm32(asm.R2, lo4, "pass"),
		asm.Mov.Imm(asm.R7, int32(keyLoopback4)),
		asm.Ja.Label("lookup"),

		asm.LoadMem(asm.R2, asm.R6, skLookupLocalIP6, asm.Word).WithSymbol("ip6"),
		asm.JNE.Imm32(asm.R2, 0, "pass"),
		asm.LoadMem(asm.R2, asm.R6, skLookupLocalIP6+4, asm.Word),
		asm.JNE.Imm32(asm.R2, 0, "pass"),
		asm.LoadMem(asm.R2, asm.R6, skLookupLocalIP6+8, asm.Word),
		asm.JNE.Imm32(asm.R2, 0, "pass"),
		asm.LoadMem(asm.R2, asm.R6, skLookupLocalIP6+12, asm.Word),
		asm.JNE.Imm32(asm.R2, lo6, "pass"),
		asm.Mov.Imm(asm.R7, int32(keyLoopback6)),

		// sk = bpf_map_lookup_elem(&sockmap, &key)
		asm.StoreMem(asm.RFP, -4, asm.R7, asm.Word).WithSymbol("lookup"),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -4),
		asm.LoadMapPtr(asm.R1, sockmap),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "pass"),
		// bpf_sk_assign(ctx, sk, 0); bpf_sk_release(sk)
		asm.Mov.Reg(asm.R7, asm.R0),
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.Mov.Reg(asm.R2, asm.R7),
		asm.Mov.Imm(asm.R3, 0),
		asm.FnSkAssign.Call(),
		asm.Mov.Reg(asm.R1, asm.R7),
		asm.FnSkRelease.Call(),

		asm.Mov.Imm(asm.R0, skPass).WithSymbol("pass"),
		asm.Return(),
	}
}

// listen opens a listening socket on ip, port 0, inside the netns and puts
// it in the sockmap at key.
func (f *forwarder) listen(network string, ip net.IP, key uint32) error {
	var ln *net.TCPListener
	err := f.p.do(func() error {
		// A sockmap takes only plain TCP sockets, not MPTCP ones.
		var lc net.ListenConfig
		lc.SetMultipathTCP(false)
		l, err := lc.Listen(f.ctx, network, net.JoinHostPort(ip.String(), "0"))
		if err == nil {
			ln = l.(*net.TCPListener)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("listen on %s in netns %s: %w", ip, f.p.path, err)
	}
	rc, err := ln.SyscallConn()
	if err == nil {
		cerr := rc.Control(func(fd uintptr) {
			err = f.sockmap.Update(key, uint64(fd), ebpf.UpdateAny)
		})
		err = errors.Join(cerr, err)
	}
	if err != nil {
		_ = ln.Close()
		return fmt.Errorf("put listener on %s in sockmap: %w", ip, err)
	}
	f.lns = append(f.lns, ln)
	return nil
}

// serve accepts steered connections on ln until it is closed.
func (f *forwarder) serve(ln *net.TCPListener) {
	for {
		c, err := ln.AcceptTCP()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			f.logger.WithError(err).Debug("port-forward accept")
			select {
			case <-f.ctx.Done():
				return
			case <-time.After(acceptBackoff):
			}
			continue
		}
		f.wg.Go(func() { f.relay(c) })
	}
}

// relay connects c, whose local port is the one its client dialled, to the
// same port of a listener of the netns, or else of the guest, and copies
// both ways until both are done; a port of f.local goes to its handler
// instead.
func (f *forwarder) relay(c *net.TCPConn) {
	port := c.LocalAddr().(*net.TCPAddr).Port
	if serve := f.local[port]; serve != nil {
		serve(c)
		return
	}
	logger := f.logger.WithField("port", port)
	if !f.track(c) {
		return
	}
	defer f.untrack(c)
	g, err := f.dialNetns(c.LocalAddr().(*net.TCPAddr).IP, port)
	if errors.Is(err, unix.ECONNREFUSED) {
		g, err = f.dial(port)
	}
	if err != nil {
		logger.WithError(err).Debug("port-forward dial")
		_ = c.SetLinger(0) // the client sees a reset, not an empty reply
		return
	}
	if !f.track(g) {
		return
	}
	defer f.untrack(g)
	var wg sync.WaitGroup
	wg.Go(func() { f.pipe(g, c, logger.WithField("direction", "to guest")) })
	f.pipe(c, g, logger.WithField("direction", "from guest"))
	wg.Wait()
}

// pipe copies src to dst, then half-closes dst. On an error it closes
// both, which ends the other direction too.
func (f *forwarder) pipe(dst, src *net.TCPConn, logger *logrus.Entry) {
	_, err := io.Copy(dst, src)
	if err == nil {
		err = dst.CloseWrite()
	}
	if err != nil && !errors.Is(err, net.ErrClosed) {
		logger.WithError(err).Debug("port-forward relay")
		_ = src.SetLinger(0)
		_ = dst.SetLinger(0)
		_ = src.Close()
		_ = dst.Close()
	}
}

// dial connects to port on the guest from inside the netns, from the
// address whose replies steerReplies brings back.
func (f *forwarder) dial(port int) (*net.TCPConn, error) {
	ctx, cancel := context.WithTimeout(f.ctx, forwardDialTimeout)
	defer cancel()
	g := f.guest()
	addr := (&net.TCPAddr{IP: g.IP, Port: port, Zone: g.Zone}).String()
	var c net.Conn
	err := f.p.do(func() error {
		var (
			d   net.Dialer
			err error
		)
		if f.src != nil {
			d.LocalAddr = &net.TCPAddr{IP: f.src}
		}
		c, err = d.DialContext(ctx, "tcp", addr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("dial guest %s: %w", addr, err)
	}
	return c.(*net.TCPConn), nil
}

// track registers a live connection so Close can end it. After Close it
// closes c and reports false.
func (f *forwarder) track(c *net.TCPConn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		_ = c.Close()
		return false
	}
	f.conns[c] = struct{}{}
	return true
}

// untrack closes c and forgets it.
func (f *forwarder) untrack(c *net.TCPConn) {
	f.mu.Lock()
	delete(f.conns, c)
	f.mu.Unlock()
	_ = c.Close()
}

// closeListeners stops accepting.
func (f *forwarder) closeListeners() {
	for _, ln := range f.lns {
		if err := ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			f.logger.WithError(err).Debug("close port-forward listener")
		}
	}
}

// Close stops accepting, detaches the program, ends the live relays and
// waits for them. Idempotent.
func (f *forwarder) Close() error {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil
	}
	f.closed = true
	conns := f.conns
	f.conns = nil
	f.mu.Unlock()

	var errs []error
	if f.link != nil {
		if err := f.link.Close(); err != nil {
			errs = append(errs, fmt.Errorf("detach sk_lookup program from netns %s: %w", f.p.path, err))
		}
	}
	if f.replyLink != nil {
		if err := f.replyLink.Close(); err != nil {
			errs = append(errs, fmt.Errorf("detach tc program from the guest's tap: %w", err))
		}
	}
	if f.stop == nil || f.stop() {
		// The listeners were not closed by the context yet.
		f.closeListeners()
	}
	f.cancel()
	for c := range conns {
		_ = c.SetLinger(0)
		_ = c.Close()
	}
	f.wg.Wait()
	if f.prog != nil {
		if err := f.prog.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close sk_lookup program: %w", err))
		}
	}
	if f.replyProg != nil {
		if err := f.replyProg.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close tc program: %w", err))
		}
	}
	if f.sockmap != nil {
		if err := f.sockmap.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close sockmap: %w", err))
		}
	}
	if f.own != nil {
		if err := f.own.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close map of own ports: %w", err))
		}
	}
	return errors.Join(errs...)
}
