package network

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/errdefs"
	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/mdlayher/packet"
	"github.com/sirupsen/logrus"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// dhcpWriteTimeout bounds the send of one reply.
const dhcpWriteTimeout = time.Second

// Responder answers DHCP for one lease on one interface through a packet
// (AF_PACKET) socket.
//
// A packet socket bound for all protocols sees the VM's frames before tc
// ingress (where DHCP is dropped or redirected on the tap) and needs no
// address on the interface. Replies are built as whole Ethernet frames, so
// unicast replies need no ARP.
type Responder struct {
	ifindex int
	srcMAC  net.HardwareAddr
	lease   Lease
	log     *logrus.Entry

	conn      *packet.Conn // in the runtime poller; deadlines wake a blocked read
	closed    atomic.Bool  // set by Close before the socket is closed
	closeOnce sync.Once
	closeErr  error
}

// NewResponder opens and binds the packet socket to the interface with index ifindex IN THE CALLER'S
// CURRENT NETWORK NAMESPACE (the socket keeps that namespace afterwards; the caller, when it must,
// enters the netns on a locked OS thread around this call). srcMAC is the interface's own MAC (used
// as the Ethernet source of replies).
func NewResponder(ifindex int, srcMAC net.HardwareAddr, lease Lease, logger *logrus.Entry) (*Responder, error) {
	if ifindex <= 0 {
		return nil, fmt.Errorf("dhcp responder: invalid ifindex %d: %w", ifindex, errdefs.ErrInvalidArgument)
	}
	if len(srcMAC) != 6 {
		return nil, fmt.Errorf("dhcp responder on ifindex %d: invalid source mac %q: %w", ifindex, srcMAC, errdefs.ErrInvalidArgument)
	}
	lease = cloneDHCPLease(lease)
	if err := checkDHCPLease(&lease); err != nil {
		return nil, err
	}
	if logger == nil {
		l := logrus.New()
		l.Out = io.Discard
		logger = logrus.NewEntry(l)
	}
	// The socket also sees the frames the interface sends (to the VM), and
	// ReadFrom does not tell their packet type: the first instructions drop
	// them, then dhcpFilter selects.
	filter, err := bpf.Assemble(append([]bpf.Instruction{
		bpf.LoadExtension{Num: bpf.ExtType},
		bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: unix.PACKET_OUTGOING, SkipTrue: 1},
		bpf.RetConstant{Val: 0},
	}, dhcpFilter()...))
	if err != nil {
		return nil, fmt.Errorf("dhcp responder on ifindex %d: assemble bpf filter: %w", ifindex, err)
	}
	// ETH_P_ALL, not ETH_P_IP: only "all protocols" taps run before tc
	// ingress, which on the tap redirects or drops what the VM sends. Listen
	// attaches the filter before it binds, so no other frame gets queued.
	// It uses only the Index of the interface (and the MAC in errors).
	ifi := &net.Interface{Index: ifindex, HardwareAddr: srcMAC}
	conn, err := packet.Listen(ifi, packet.Raw, unix.ETH_P_ALL, &packet.Config{Filter: filter})
	if err != nil {
		if errors.Is(err, unix.ENODEV) {
			err = fmt.Errorf("%w: %w", errdefs.ErrNotFound, err)
		}
		return nil, fmt.Errorf("dhcp responder: open packet socket on ifindex %d: %w", ifindex, err)
	}
	return &Responder{
		ifindex: ifindex,
		srcMAC:  append(net.HardwareAddr(nil), srcMAC...),
		lease:   lease,
		log:     logger.WithField("ifindex", ifindex),
		conn:    conn,
	}, nil
}

// Serve answers until ctx is done or Close is called; returns nil then. Never blocks forever.
//
// Serve must not be called concurrently with itself. Errors on single
// packets are logged at debug level and do not stop it.
func (r *Responder) Serve(ctx context.Context) error {
	if err := r.conn.SetReadDeadline(time.Time{}); err != nil {
		if r.isClosed(err) {
			return nil
		}
		return fmt.Errorf("dhcp responder on ifindex %d: %w", r.ifindex, err)
	}
	// A deadline in the past wakes the blocked read when ctx is done.
	stop := context.AfterFunc(ctx, func() { _ = r.conn.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()

	buf := make([]byte, 1<<16)
	for ctx.Err() == nil {
		n, _, err := r.conn.ReadFrom(buf)
		switch {
		case ctx.Err() != nil, err != nil && r.isClosed(err):
			return nil
		case errors.Is(err, os.ErrDeadlineExceeded):
			// Left by the context of an earlier Serve. Clear it, then look
			// at ctx again: a cancel from now on sets a new deadline.
			if err := r.conn.SetReadDeadline(time.Time{}); err != nil && !r.isClosed(err) {
				return fmt.Errorf("dhcp responder on ifindex %d: %w", r.ifindex, err)
			}
			continue
		case errors.Is(err, unix.ENETDOWN), errors.Is(err, unix.ENOBUFS):
			r.log.WithError(err).Debug("dhcp receive")
			continue
		case err != nil:
			return fmt.Errorf("dhcp responder: receive on ifindex %d: %w", r.ifindex, err)
		}
		if err := r.answer(buf[:n]); err != nil {
			r.log.WithError(err).Debug("dhcp packet dropped")
		}
	}
	return nil
}

// answer handles one received frame and sends the reply, if any.
func (r *Responder) answer(frame []byte) error {
	x, err := replyFrame(r.srcMAC, &r.lease, frame)
	if err != nil {
		return err
	}
	req, reply := x.req, x.reply
	log := r.log.WithField("mac", req.ClientHWAddr.String())
	if reply == nil {
		switch req.MessageType() {
		case dhcpv4.MessageTypeDecline:
			log.WithField("ip", req.RequestedIPAddress().String()).Warn("dhcp client declined the address")
		case dhcpv4.MessageTypeRelease:
			log.WithField("ip", req.ClientIPAddr.String()).Info("dhcp client released the address")
		default:
			log.WithField("type", req.MessageType()).Debug("dhcp message ignored")
		}
		return nil
	}
	if err := r.send(x.frame, x.dst.MAC); err != nil {
		return fmt.Errorf("send dhcp %s to %s: %w", reply.MessageType(), x.dst.MAC, err)
	}
	switch {
	case reply.MessageType() == dhcpv4.MessageTypeNak:
		log.WithFields(logrus.Fields{"ip": r.lease.IP.String(), "requested": dhcpRequestedAddr(req).String()}).
			Info("dhcp request for another address refused")
	case reply.MessageType() == dhcpv4.MessageTypeAck && req.MessageType() == dhcpv4.MessageTypeRequest:
		log.WithField("ip", r.lease.IP.String()).Info("dhcp lease given")
	default:
		log.WithFields(logrus.Fields{"ip": r.lease.IP.String(), "type": reply.MessageType()}).Debug("dhcp reply sent")
	}
	return nil
}

// send writes one frame to the interface, waiting at most dhcpWriteTimeout.
func (r *Responder) send(frame []byte, dstMAC net.HardwareAddr) error {
	if err := r.conn.SetWriteDeadline(time.Now().Add(dhcpWriteTimeout)); err != nil {
		return err
	}
	_, err := r.conn.WriteTo(frame, &packet.Addr{HardwareAddr: dstMAC})
	return err
}

// Close closes the socket; a running Serve returns nil.
func (r *Responder) Close() error {
	r.closeOnce.Do(func() {
		r.closed.Store(true)
		if err := r.conn.Close(); err != nil {
			r.closeErr = fmt.Errorf("close dhcp responder on ifindex %d: %w", r.ifindex, err)
		}
	})
	return r.closeErr
}

// isClosed reports whether err comes from a socket closed by Close. A read
// blocked at Close fails with the runtime poller's unexported error, a later
// one with EBADF.
func (r *Responder) isClosed(err error) bool {
	return r.closed.Load() || errors.Is(err, os.ErrClosed)
}

// dhcpRequestedAddr is the address a REQUEST asks for: the requested-IP option,
// else ciaddr.
func dhcpRequestedAddr(req *dhcpv4.DHCPv4) net.IP {
	if ip := req.RequestedIPAddress(); ip != nil && !ip.IsUnspecified() {
		return ip
	}
	return req.ClientIPAddr
}

// cloneDHCPLease returns a copy of l that shares no memory with it.
func cloneDHCPLease(l Lease) Lease {
	ip := func(v net.IP) net.IP {
		if v == nil {
			return nil
		}
		return append(net.IP(nil), v...)
	}
	c := l
	c.MAC = append(net.HardwareAddr(nil), l.MAC...)
	c.IP, c.Gateway, c.ServerID = ip(l.IP), ip(l.Gateway), ip(l.ServerID)
	c.Mask = append(net.IPMask(nil), l.Mask...)
	c.DNS = nil
	for _, s := range l.DNS {
		c.DNS = append(c.DNS, ip(s))
	}
	c.Search = append([]string(nil), l.Search...)
	c.Routes = nil
	for _, rt := range l.Routes {
		n := Route{Gw: ip(rt.Gw)}
		if rt.Dst != nil {
			n.Dst = &net.IPNet{IP: ip(rt.Dst.IP), Mask: append(net.IPMask(nil), rt.Dst.Mask...)}
		}
		c.Routes = append(c.Routes, n)
	}
	return c
}
