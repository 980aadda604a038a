package network

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/sirupsen/logrus"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// dhcpWriteTimeout bounds the send of one reply.
const dhcpWriteTimeout = time.Second

// Responder answers DHCP for one lease on one interface through an AF_PACKET socket.
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

	file      *os.File // the packet socket, non-blocking, in the runtime poller
	raw       syscall.RawConn
	closed    atomic.Bool // set by Close before the socket is closed
	closeOnce sync.Once
	closeErr  error
}

// NewResponder opens and binds the packet socket to the interface with index ifindex IN THE CALLER'S
// CURRENT NETWORK NAMESPACE (the socket keeps that namespace afterwards; the caller, when it must,
// enters the netns on a locked OS thread around this call). srcMAC is the interface's own MAC (used
// as the Ethernet source of replies).
func NewResponder(ifindex int, srcMAC net.HardwareAddr, lease Lease, logger *logrus.Entry) (_ *Responder, retErr error) {
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
	filter, err := bpf.Assemble(dhcpFilter())
	if err != nil {
		return nil, fmt.Errorf("dhcp responder on ifindex %d: assemble bpf filter: %w", ifindex, err)
	}
	// Protocol 0: the socket receives nothing until it is bound, and by then
	// the filter is in place.
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("dhcp responder on ifindex %d: open packet socket: %w", ifindex, err)
	}
	defer func() {
		if retErr != nil && fd >= 0 {
			_ = unix.Close(fd)
		}
	}()
	prog := make([]unix.SockFilter, len(filter))
	for i, ins := range filter {
		prog[i] = unix.SockFilter{Code: ins.Op, Jt: ins.Jt, Jf: ins.Jf, K: ins.K}
	}
	if err := unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER,
		&unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}); err != nil {
		return nil, fmt.Errorf("dhcp responder on ifindex %d: attach bpf filter: %w", ifindex, err)
	}
	// ETH_P_ALL, not ETH_P_IP: only "all protocols" taps run before tc
	// ingress, which on the tap redirects or drops what the VM sends. The
	// filter does the selecting.
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: dhcpHtons(unix.ETH_P_ALL), Ifindex: ifindex}); err != nil {
		if errors.Is(err, unix.ENODEV) {
			err = fmt.Errorf("%w: %w", errdefs.ErrNotFound, err)
		}
		return nil, fmt.Errorf("dhcp responder: bind packet socket to ifindex %d: %w", ifindex, err)
	}
	file := os.NewFile(uintptr(fd), fmt.Sprintf("dhcp-packet-socket-%d", ifindex))
	fd = -1 // owned by file now
	defer func() {
		if retErr != nil {
			_ = file.Close()
		}
	}()
	raw, err := file.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("dhcp responder on ifindex %d: %w", ifindex, err)
	}
	return &Responder{
		ifindex: ifindex,
		srcMAC:  append(net.HardwareAddr(nil), srcMAC...),
		lease:   lease,
		log:     logger.WithField("ifindex", ifindex),
		file:    file,
		raw:     raw,
	}, nil
}

// Serve answers until ctx is done or Close is called; returns nil then. Never blocks forever.
//
// Serve must not be called concurrently with itself. Errors on single
// packets are logged at debug level and do not stop it.
func (r *Responder) Serve(ctx context.Context) error {
	if err := r.file.SetReadDeadline(time.Time{}); err != nil {
		if r.isClosed(err) {
			return nil
		}
		return fmt.Errorf("dhcp responder on ifindex %d: %w", r.ifindex, err)
	}
	// A deadline in the past wakes the blocked read when ctx is done.
	stop := context.AfterFunc(ctx, func() { _ = r.file.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()

	buf := make([]byte, 1<<16)
	for ctx.Err() == nil {
		n, from, err := r.recv(buf)
		switch {
		case ctx.Err() != nil, err != nil && r.isClosed(err):
			return nil
		case errors.Is(err, os.ErrDeadlineExceeded):
			// Left by the context of an earlier Serve. Clear it, then look
			// at ctx again: a cancel from now on sets a new deadline.
			if err := r.file.SetReadDeadline(time.Time{}); err != nil && !r.isClosed(err) {
				return fmt.Errorf("dhcp responder on ifindex %d: %w", r.ifindex, err)
			}
			continue
		case errors.Is(err, unix.ENETDOWN), errors.Is(err, unix.ENOBUFS), errors.Is(err, unix.EINTR):
			r.log.WithError(err).Debug("dhcp receive")
			continue
		case err != nil:
			return fmt.Errorf("dhcp responder: receive on ifindex %d: %w", r.ifindex, err)
		}
		if from != nil && from.Pkttype == unix.PACKET_OUTGOING {
			continue
		}
		if err := r.answer(buf[:n]); err != nil {
			r.log.WithError(err).Debug("dhcp packet dropped")
		}
	}
	return nil
}

// recv reads one frame, waiting in the runtime poller.
func (r *Responder) recv(buf []byte) (int, *unix.SockaddrLinklayer, error) {
	var (
		n    int
		from unix.Sockaddr
		rerr error
	)
	err := r.raw.Read(func(fd uintptr) bool {
		n, from, rerr = unix.Recvfrom(int(fd), buf, 0)
		return !errors.Is(rerr, unix.EAGAIN)
	})
	if err == nil {
		err = rerr
	}
	if err != nil {
		return 0, nil, err
	}
	ll, _ := from.(*unix.SockaddrLinklayer)
	return n, ll, nil
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
	if err := r.file.SetWriteDeadline(time.Now().Add(dhcpWriteTimeout)); err != nil {
		return err
	}
	to := &unix.SockaddrLinklayer{Protocol: dhcpHtons(unix.ETH_P_IP), Ifindex: r.ifindex, Halen: 6}
	copy(to.Addr[:], dstMAC)
	var werr error
	err := r.raw.Write(func(fd uintptr) bool {
		werr = unix.Sendto(int(fd), frame, 0, to)
		return !errors.Is(werr, unix.EAGAIN)
	})
	if err != nil {
		return err
	}
	return werr
}

// Close closes the socket; a running Serve returns nil.
func (r *Responder) Close() error {
	r.closeOnce.Do(func() {
		r.closed.Store(true)
		if err := r.file.Close(); err != nil {
			r.closeErr = fmt.Errorf("close dhcp responder on ifindex %d: %w", r.ifindex, err)
		}
	})
	return r.closeErr
}

// isClosed reports whether err comes from a socket closed by Close. The
// runtime poller reports a closed descriptor with an unexported error.
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

// dhcpHtons converts a 16-bit value to network byte order as stored in host
// memory.
func dhcpHtons(v uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], v)
	return binary.NativeEndian.Uint16(b[:])
}
