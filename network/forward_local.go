package network

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"slices"
	"syscall"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// ownPortsMax bounds how many of dialNetns's connections may be under
// way at once.
const ownPortsMax = 1024

// newOwnPorts makes the map of dialNetns's source ports.
func newOwnPorts() (*ebpf.Map, error) {
	m, err := ebpf.NewMap(&ebpf.MapSpec{
		Name: "vmshim_fwd_own", Type: ebpf.Hash, KeySize: 4, ValueSize: 1, MaxEntries: ownPortsMax,
	})
	if err != nil {
		return nil, fmt.Errorf("create map of own ports: %w", err)
	}
	return m, nil
}

// ownKey is port's key in the map of own ports: the port in network
// order in the first two bytes, as the sk_lookup program stores the
// remote port it reads.
func ownKey(port int) uint32 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], uint16(port))
	return uint32(binary.NativeEndian.Uint16(b[:]))
}

// dialNetns connects to port on loopback (127.0.0.1 or ::1, the address
// the client dialled) inside the netns, where a container beside the VM
// may listen: a port some socket of the netns serves is its, as on the
// pod IP, and the guest gets only the others. The sk_lookup program
// would hand the connection back to the forwarder, so its source port
// is in the map of own ports while it connects. Nothing listening is an
// error wrapping ECONNREFUSED; so is a port of the forwarder's own
// listeners, which would take the connection back.
func (f *forwarder) dialNetns(loopback net.IP, port int) (*net.TCPConn, error) {
	if slices.ContainsFunc(f.lns, func(ln *net.TCPListener) bool { return ln.Addr().(*net.TCPAddr).Port == port }) {
		return nil, fmt.Errorf("port %d is port-forward's own: %w", port, unix.ECONNREFUSED)
	}
	ctx, cancel := context.WithTimeout(f.ctx, forwardDialTimeout)
	defer cancel()
	var key *uint32
	defer func() {
		if key != nil {
			_ = f.own.Delete(*key)
		}
	}()
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var err error
		cerr := rc.Control(func(fd uintptr) {
			var sa unix.Sockaddr = &unix.SockaddrInet4{}
			if loopback.To4() == nil {
				sa = &unix.SockaddrInet6{}
			}
			if err = unix.Bind(int(fd), sa); err != nil {
				return
			}
			if sa, err = unix.Getsockname(int(fd)); err != nil {
				return
			}
			var k uint32
			switch sa := sa.(type) {
			case *unix.SockaddrInet4:
				k = ownKey(sa.Port)
			case *unix.SockaddrInet6:
				k = ownKey(sa.Port)
			}
			if err = f.own.Update(k, uint8(1), ebpf.UpdateNoExist); err == nil {
				key = &k
			}
		})
		return errors.Join(cerr, err)
	}}
	addr := net.JoinHostPort(loopback.String(), fmt.Sprint(port))
	var c net.Conn
	err := f.p.do(func() error {
		var err error
		c, err = d.DialContext(ctx, "tcp", addr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("dial %s in the netns: %w", addr, err)
	}
	return c.(*net.TCPConn), nil
}
