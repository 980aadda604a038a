package network

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/errdefs"
	"github.com/insomniacslk/dhcp/dhcpv6"
	"github.com/insomniacslk/dhcp/iana"
	"github.com/mdlayher/ndp"
	"github.com/mdlayher/packet"
	"github.com/sirupsen/logrus"
	"golang.org/x/net/bpf"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"
)

// Responder6 is the guest's IPv6 router and DHCPv6 server on one tap.
//
// It answers the guest's router solicitations with router advertisements
// and sends one every raInterval, from the tap's link-local address. It
// reads DHCPv6 through a packet socket, which sees the guest's frames
// before tc ingress and tells their source MAC, so only the guest's NIC
// is answered; the replies go out through a UDP socket on the tap's
// link-local address, port 547. Everything it sends goes to the tap, so
// to the guest alone.
type Responder6 struct {
	ifi      *net.Interface // the tap
	router   netip.Addr     // the tap's link-local address
	lease    Lease6
	serverID dhcpv6.DUID
	ra       *ndp.RouterAdvertisement
	log      *logrus.Entry

	pkt *packet.Conn // DHCPv6 from the guest
	udp *net.UDPConn // DHCPv6 replies
	nd  *ndp.Conn    // router solicitations in, advertisements out

	guest     atomic.Pointer[net.IP] // the link-local address the guest's DHCPv6 came from
	closed    atomic.Bool
	closeOnce sync.Once
	closeErr  error
}

// NewResponder6 opens the responder's sockets on the interface with index
// ifindex IN THE CALLER'S NETWORK NAMESPACE, which they keep (the caller
// enters the netns on a locked OS thread around this call). The interface
// must have router, a link-local address, without duplicate address
// detection pending.
func NewResponder6(ifindex int, router net.IP, lease Lease6, logger *logrus.Entry) (_ *Responder6, retErr error) {
	if err := checkLease6(&lease); err != nil {
		return nil, err
	}
	rtr, ok := netip.AddrFromSlice(router.To16())
	if !ok || !rtr.IsLinkLocalUnicast() {
		return nil, fmt.Errorf("dhcpv6 responder on ifindex %d: router address %v is not link-local: %w", ifindex, router, errdefs.ErrInvalidArgument)
	}
	ifi, err := net.InterfaceByIndex(ifindex)
	if err != nil {
		return nil, fmt.Errorf("dhcpv6 responder: find ifindex %d: %w", ifindex, err)
	}
	if logger == nil {
		l := logrus.New()
		l.Out = io.Discard
		logger = logrus.NewEntry(l)
	}
	ra, err := routerAdvertisement(&lease, ifi.HardwareAddr)
	if err != nil {
		return nil, err
	}
	r := &Responder6{
		ifi: ifi, router: rtr, lease: lease, ra: ra,
		serverID: &dhcpv6.DUIDLL{HWType: iana.HWTypeEthernet, LinkLayerAddr: ifi.HardwareAddr},
		log:      logger.WithField("ifindex", ifindex),
	}
	defer func() {
		if retErr != nil {
			_ = r.Close()
		}
	}()
	filter, err := bpf.Assemble(append([]bpf.Instruction{
		bpf.LoadExtension{Num: bpf.ExtType},
		bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: unix.PACKET_OUTGOING, SkipTrue: 1},
		bpf.RetConstant{Val: 0},
	}, dhcp6Filter()...))
	if err != nil {
		return nil, fmt.Errorf("dhcpv6 responder on %s: assemble bpf filter: %w", ifi.Name, err)
	}
	if r.pkt, err = packet.Listen(ifi, packet.Raw, unix.ETH_P_ALL, &packet.Config{Filter: filter}); err != nil {
		return nil, fmt.Errorf("dhcpv6 responder: open packet socket on %s: %w", ifi.Name, err)
	}
	zone := strconv.Itoa(ifi.Index)
	if r.udp, err = net.ListenUDP("udp6", &net.UDPAddr{IP: router, Port: dhcp6ServerPort, Zone: zone}); err != nil {
		return nil, fmt.Errorf("dhcpv6 responder: listen on [%s%%%s]:%d: %w", router, ifi.Name, dhcp6ServerPort, err)
	}
	if r.nd, _, err = ndp.Listen(ifi, ndp.Addr(rtr.String())); err != nil {
		return nil, fmt.Errorf("router advertisements on %s: %w", ifi.Name, err)
	}
	var f ipv6.ICMPFilter
	f.SetAll(true)
	f.Accept(ipv6.ICMPTypeRouterSolicitation)
	if err := r.nd.SetICMPFilter(&f); err != nil {
		return nil, fmt.Errorf("router advertisements on %s: %w", ifi.Name, err)
	}
	if err := r.nd.SetControlMessage(ipv6.FlagHopLimit, true); err != nil {
		return nil, fmt.Errorf("router advertisements on %s: %w", ifi.Name, err)
	}
	if err := r.nd.JoinGroup(netip.IPv6LinkLocalAllRouters()); err != nil {
		return nil, fmt.Errorf("router advertisements on %s: join all-routers: %w", ifi.Name, err)
	}
	return r, nil
}

// GuestAddr is the guest's link-local address on the tap: the source of
// its last DHCPv6 message, else the one its MAC gives in modified EUI-64
// form.
func (r *Responder6) GuestAddr() net.IP {
	if ip := r.guest.Load(); ip != nil {
		return *ip
	}
	return eui64LinkLocal(r.lease.MAC)
}

// Serve answers until ctx is done or Close is called; returns nil then.
// Errors on single packets are logged at debug level and do not stop it.
func (r *Responder6) Serve(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(ctx, func() {
		past := time.Unix(1, 0)
		_ = r.pkt.SetReadDeadline(past)
		_ = r.udp.SetReadDeadline(past)
		_ = r.nd.SetReadDeadline(past)
	})
	defer stop()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	run := func(f func(context.Context) error) {
		wg.Go(func() {
			if err := f(ctx); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
				cancel()
			}
		})
	}
	run(r.serveDHCP)
	run(r.serveRS)
	run(r.drain)
	run(r.advertise)
	wg.Wait()
	return errors.Join(errs...)
}

// serveDHCP answers the guest's DHCPv6 messages.
func (r *Responder6) serveDHCP(ctx context.Context) error {
	buf := make([]byte, 1<<16)
	for ctx.Err() == nil {
		n, _, err := r.pkt.ReadFrom(buf)
		if err != nil {
			if stop, err := r.readError(ctx, err); stop {
				return err
			}
			continue
		}
		if err := r.answer(buf[:n]); err != nil {
			r.log.WithError(err).Debug("dhcpv6 packet dropped")
		}
	}
	return nil
}

// readError sorts out a read error: stop (with an error, or nil when ctx
// is done or the responder closed) or go on.
func (r *Responder6) readError(ctx context.Context, err error) (bool, error) {
	switch {
	case ctx.Err() != nil, r.closed.Load(), errors.Is(err, os.ErrClosed), errors.Is(err, net.ErrClosed):
		return true, nil
	case errors.Is(err, unix.ENETDOWN), errors.Is(err, unix.ENOBUFS), errors.Is(err, os.ErrDeadlineExceeded):
		r.log.WithError(err).Debug("ipv6 responder receive")
		return false, nil
	default:
		return true, fmt.Errorf("ipv6 responder on %s: %w", r.ifi.Name, err)
	}
}

// answer handles one frame from the tap.
func (r *Responder6) answer(frame []byte) error {
	mac, src, payload, err := parseDHCP6Frame(frame)
	if err != nil {
		return err
	}
	if mac.String() != r.lease.MAC.String() {
		return fmt.Errorf("dhcpv6 message from %s, not the guest's %s", mac, r.lease.MAC)
	}
	msg, err := dhcpv6.MessageFromBytes(payload)
	if err != nil {
		return fmt.Errorf("parse dhcpv6 message from %s: %w", src, err)
	}
	r.guest.Store(&src)
	reply, err := Handle6(msg, &r.lease, r.serverID)
	if err != nil || reply == nil {
		if err == nil {
			r.log.WithField("type", dhcp6Name(msg.Type())).Debug("dhcpv6 message ignored")
		}
		return err
	}
	if err := r.udp.SetWriteDeadline(time.Now().Add(dhcpWriteTimeout)); err != nil {
		return err
	}
	dst := &net.UDPAddr{IP: src, Port: dhcp6ClientPort, Zone: strconv.Itoa(r.ifi.Index)}
	if _, err := r.udp.WriteToUDP(reply.ToBytes(), dst); err != nil {
		return fmt.Errorf("send dhcpv6 %s to %s: %w", reply.Type(), dst, err)
	}
	log := r.log.WithFields(logrus.Fields{"mac": mac.String(), "ip": r.lease.IP.String()})
	switch {
	case msg.Type() == dhcpv6.MessageTypeRequest,
		msg.Type() == dhcpv6.MessageTypeSolicit && reply.Type() == dhcpv6.MessageTypeReply:
		log.Info("dhcpv6 lease given")
	case msg.Type() == dhcpv6.MessageTypeDecline:
		// The guest found the address in use on the tap's link; it will
		// be offered the same one again.
		log.WithField("declined", fmt.Sprint(dhcp6Addrs(msg))).Warn("dhcpv6 client declined the address")
	case msg.Type() == dhcpv6.MessageTypeRelease:
		log.Info("dhcpv6 client released the address")
	default:
		log.WithField("type", dhcp6Name(reply.Type())).Debug("dhcpv6 reply sent")
	}
	return nil
}

// serveRS answers router solicitations: to the soliciting address, or to
// all nodes on the tap when it came from the unspecified address.
func (r *Responder6) serveRS(ctx context.Context) error {
	for ctx.Err() == nil {
		m, cm, src, err := r.nd.ReadFrom()
		if err != nil {
			if stop, err := r.readError(ctx, err); stop {
				return err
			}
			continue
		}
		rs, ok := m.(*ndp.RouterSolicitation)
		if !ok || cm == nil || cm.HopLimit != ndp.HopLimit {
			continue
		}
		if mac := solicitorMAC(rs); mac != nil && mac.String() != r.lease.MAC.String() {
			r.log.WithField("mac", mac.String()).Debug("router solicitation from another mac ignored")
			continue
		}
		dst := src
		if src.IsUnspecified() {
			dst = netip.IPv6LinkLocalAllNodes()
		}
		if err := r.sendRA(dst); err != nil {
			r.log.WithError(err).Debug("send router advertisement")
		}
	}
	return nil
}

// solicitorMAC is a solicitation's source link-layer address, if it has one.
func solicitorMAC(rs *ndp.RouterSolicitation) net.HardwareAddr {
	for _, o := range rs.Options {
		if lla, ok := o.(*ndp.LinkLayerAddress); ok && lla.Direction == ndp.Source {
			return lla.Addr
		}
	}
	return nil
}

// advertise sends an unsolicited router advertisement now and every
// raInterval.
func (r *Responder6) advertise(ctx context.Context) error {
	t := time.NewTicker(raInterval)
	defer t.Stop()
	for {
		if err := r.sendRA(netip.IPv6LinkLocalAllNodes()); err != nil && ctx.Err() == nil && !r.closed.Load() {
			r.log.WithError(err).Debug("send router advertisement")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (r *Responder6) sendRA(dst netip.Addr) error {
	if err := r.nd.SetWriteDeadline(time.Now().Add(dhcpWriteTimeout)); err != nil {
		return err
	}
	return r.nd.WriteTo(r.ra, nil, dst)
}

// drain reads and drops what reaches the reply socket: DHCPv6 unicast to
// the tap's address, already answered from the packet socket.
func (r *Responder6) drain(ctx context.Context) error {
	buf := make([]byte, 1<<16)
	for ctx.Err() == nil {
		if _, _, err := r.udp.ReadFromUDP(buf); err != nil {
			if stop, err := r.readError(ctx, err); stop {
				return err
			}
		}
	}
	return nil
}

// Close closes the sockets; a running Serve returns nil.
func (r *Responder6) Close() error {
	r.closeOnce.Do(func() {
		r.closed.Store(true)
		var errs []error
		if r.pkt != nil {
			errs = append(errs, r.pkt.Close())
		}
		if r.udp != nil {
			errs = append(errs, r.udp.Close())
		}
		if r.nd != nil {
			errs = append(errs, r.nd.Close())
		}
		if err := errors.Join(errs...); err != nil {
			r.closeErr = fmt.Errorf("close ipv6 responder on %s: %w", r.ifi.Name, err)
		}
	})
	return r.closeErr
}

// eui64LinkLocal is the link-local address that mac gives in modified
// EUI-64 form (RFC 4291 appendix A).
func eui64LinkLocal(mac net.HardwareAddr) net.IP {
	if len(mac) != 6 {
		return nil
	}
	ip := make(net.IP, net.IPv6len)
	ip[0], ip[1] = 0xfe, 0x80
	copy(ip[8:], []byte{mac[0] ^ 2, mac[1], mac[2], 0xff, 0xfe, mac[3], mac[4], mac[5]})
	return ip
}
