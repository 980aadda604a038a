package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// SerialPortPrefix starts the guest's name of every port AddSerialPort
// adds; a number unique in the VM follows.
const SerialPortPrefix = "vmshim.tty."

// portUndoTimeout bounds the QMP calls that undo a port AddSerialPort
// could not finish, whatever is left of the caller's deadline.
const portUndoTimeout = 5 * time.Second

// ErrPortGone reports a port whose VM has gone: its QMP connection ended.
var ErrPortGone = fmt.Errorf("serial port: the vm has gone: %w", errdefs.ErrFailedPrecondition)

// SerialPort is a virtio-serial port added to a running VM for one
// session. Its host end is a socket the caller reads and writes; QEMU
// holds the other end, passed to it as an fd, so a jailed QEMU needs no
// path.
type SerialPort struct {
	vm   *VM
	n    int
	conn net.Conn

	opened  chan struct{} // closed once the guest has opened the port
	deleted chan struct{} // closed once QEMU has reported the device deleted
	gone    chan struct{} // closed once the VM's QMP connection has ended

	openOnce, deleteOnce, goneOnce sync.Once
}

// Name is the port's name in the guest, as /sys/class/virtio-ports/*/name
// and /dev/virtio-ports/ show it.
func (p *SerialPort) Name() string { return SerialPortPrefix + strconv.Itoa(p.n) }

// Conn is the host's end of the port. Once Remove has removed the
// chardev, reads end with EOF after what the guest wrote.
func (p *SerialPort) Conn() net.Conn { return p.conn }

// Opened is closed once the guest has opened the port.
func (p *SerialPort) Opened() <-chan struct{} { return p.opened }

// Gone is closed once the VM's QMP connection has ended: QEMU has exited,
// and the port with it.
func (p *SerialPort) Gone() <-chan struct{} { return p.gone }

// chardevID, deviceID and fdName name the port's chardev, its qdev
// device and the fd QEMU gets for it.
func (p *SerialPort) chardevID() string { return "tty" + strconv.Itoa(p.n) }
func (p *SerialPort) deviceID() string  { return p.chardevID() + "-port" }
func (p *SerialPort) fdName() string    { return p.chardevID() + "-fd" }

// chardevArgs are chardev-add's arguments: a client socket chardev on the
// fd passed as fdName.
func (p *SerialPort) chardevArgs() any {
	type fdAddr struct {
		Str string `json:"str"`
	}
	type addr struct {
		Type string `json:"type"`
		Data fdAddr `json:"data"`
	}
	type socket struct {
		Addr   addr `json:"addr"`
		Server bool `json:"server"`
	}
	type backend struct {
		Type string `json:"type"`
		Data socket `json:"data"`
	}
	return struct {
		ID      string  `json:"id"`
		Backend backend `json:"backend"`
	}{p.chardevID(), backend{"socket", socket{Addr: addr{"fd", fdAddr{p.fdName()}}}}}
}

// deviceArgs are device_add's arguments: a virtserialport on the
// controller the agent's port is on.
func (p *SerialPort) deviceArgs() map[string]string {
	return map[string]string{
		"driver": "virtserialport", "bus": SerialController + ".0",
		"id": p.deviceID(), "chardev": p.chardevID(), "name": p.Name(),
	}
}

// AddSerialPort hot-plugs a virtio-serial port on the VM's virtio-serial
// controller (the agent's): one end of a socketpair goes to QEMU (getfd),
// a socket chardev is made on it (chardev-add) and a virtserialport on
// that (device_add). ctx bounds the calls. On failure, what was made in
// QEMU is undone as far as QEMU answers.
func (v *VM) AddSerialPort(ctx context.Context) (_ *SerialPort, retErr error) {
	if v.agent == nil || v.qmp == nil {
		return nil, fmt.Errorf("add serial port: the vm has no virtio-serial controller: %w", errdefs.ErrFailedPrecondition)
	}
	p, err := v.ports.add(v)
	if err != nil {
		return nil, err
	}
	var undo []func(context.Context)
	defer func() {
		if retErr != nil {
			p.undo(ctx, undo)
		}
	}()
	theirs, err := p.socketpair()
	if err != nil {
		return nil, err
	}
	defer theirs.Close()
	closeFD := func(ctx context.Context) {
		_ = v.qmp.Execute(ctx, "closefd", map[string]string{"fdname": p.fdName()}, nil)
	}
	if err := v.qmp.SendFD(ctx, p.fdName(), theirs); err != nil {
		if errors.Is(err, ErrNoReply) {
			undo = append(undo, closeFD) // QEMU may have it
		}
		return nil, fmt.Errorf("add serial port %s: %w", p.Name(), err)
	}
	undo = append(undo, closeFD)
	if err := v.qmp.Execute(ctx, "chardev-add", p.chardevArgs(), nil); err != nil {
		return nil, fmt.Errorf("add serial port %s: %w", p.Name(), err)
	}
	undo = append(undo, func(ctx context.Context) {
		_ = v.qmp.Execute(ctx, "chardev-remove", map[string]string{"id": p.chardevID()}, nil)
	})
	if err := v.qmp.Execute(ctx, "device_add", p.deviceArgs(), nil); err != nil {
		// Without its reply the device may be there all the same: unplug
		// deletes it, if QEMU has it, before it removes the chardev.
		undo[len(undo)-1] = func(ctx context.Context) { _ = p.unplug(ctx) }
		return nil, fmt.Errorf("add serial port %s: %w", p.Name(), err)
	}
	return p, nil
}

// socketpair makes the port's socketpair: the host end becomes p.conn,
// QEMU's end is returned for SendFD.
func (p *SerialPort) socketpair() (*os.File, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("add serial port %s: socketpair: %w", p.Name(), err)
	}
	theirs := os.NewFile(uintptr(fds[0]), p.chardevID()+"-qemu")
	mine := os.NewFile(uintptr(fds[1]), p.chardevID())
	defer mine.Close()
	if p.conn, err = net.FileConn(mine); err != nil {
		theirs.Close()
		return nil, fmt.Errorf("add serial port %s: %w", p.Name(), err)
	}
	return theirs, nil
}

// undo runs the undo steps of a failed AddSerialPort, newest first, within
// portUndoTimeout, closes the host end and forgets the port.
func (p *SerialPort) undo(ctx context.Context, steps []func(context.Context)) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), portUndoTimeout)
	defer cancel()
	for i := len(steps) - 1; i >= 0; i-- {
		steps[i](ctx)
	}
	if p.conn != nil {
		_ = p.conn.Close()
	}
	p.vm.ports.forget(p)
}

// Remove unplugs the port (device_del, then QEMU's DEVICE_DELETED) and
// removes its chardev, within ctx. QEMU then closes its end of the
// socket; the host end stays the caller's to close. A port whose VM has
// gone needs nothing.
func (p *SerialPort) Remove(ctx context.Context) error {
	if err := p.unplug(ctx); err != nil {
		return err
	}
	p.vm.ports.forget(p)
	return nil
}

// unplug deletes the device, waits for QEMU to report it deleted, and
// removes the chardev. A device QEMU does not know is taken as deleted.
func (p *SerialPort) unplug(ctx context.Context) error {
	if p.isGone() {
		return nil
	}
	err := p.vm.qmp.Execute(ctx, "device_del", map[string]string{"id": p.deviceID()}, nil)
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
	case err != nil:
		return p.goneOr(fmt.Errorf("remove serial port %s: %w", p.Name(), err))
	default:
		select {
		case <-p.deleted:
		case <-p.gone:
			return nil
		case <-ctx.Done():
			return fmt.Errorf("remove serial port %s: qemu has not deleted the device: %w", p.Name(), ctx.Err())
		}
	}
	if err := p.vm.qmp.Execute(ctx, "chardev-remove", map[string]string{"id": p.chardevID()}, nil); err != nil {
		return p.goneOr(fmt.Errorf("remove serial port %s: %w", p.Name(), err))
	}
	return nil
}

// goneOr returns nil if the VM has gone (its ports with it), else err.
func (p *SerialPort) goneOr(err error) error {
	if p.isGone() {
		return nil
	}
	return err
}

// isGone reports whether the VM's QMP connection has ended.
func (p *SerialPort) isGone() bool {
	select {
	case <-p.gone:
		return true
	default:
		return false
	}
}

// portTable holds the ports AddSerialPort made, for QMP events to reach
// them.
type portTable struct {
	mu    sync.Mutex
	next  int                    // guarded by mu; the number of the last port
	ports map[string]*SerialPort // guarded by mu; by qdev id
	ended bool                   // guarded by mu; QMP has ended, the ports are gone
}

// add makes a port with the next number and registers it, unless the
// VM's QMP connection has ended.
func (t *portTable) add(v *VM) (*SerialPort, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ended {
		return nil, fmt.Errorf("add serial port: %w", ErrPortGone)
	}
	if t.ports == nil {
		t.ports = make(map[string]*SerialPort)
	}
	t.next++
	p := &SerialPort{vm: v, n: t.next, opened: make(chan struct{}), deleted: make(chan struct{}), gone: make(chan struct{})}
	t.ports[p.deviceID()] = p
	return p, nil
}

// forget drops a port from the table.
func (t *portTable) forget(p *SerialPort) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ports[p.deviceID()] == p {
		delete(t.ports, p.deviceID())
	}
}

// lookup returns the port whose qdev id is id, or nil.
func (t *portTable) lookup(id string) *SerialPort {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.ports[id]
}

// event applies a QMP event to the port it names: VSERPORT_CHANGE with
// open set opens it, DEVICE_DELETED deletes it. Other events, and events
// for other devices, are ignored.
func (t *portTable) event(ev Event) {
	var data struct {
		ID     string `json:"id"`     // VSERPORT_CHANGE
		Open   bool   `json:"open"`   // VSERPORT_CHANGE
		Device string `json:"device"` // DEVICE_DELETED
	}
	if json.Unmarshal(ev.Data, &data) != nil {
		return
	}
	switch ev.Name {
	case "VSERPORT_CHANGE":
		if p := t.lookup(data.ID); p != nil && data.Open {
			p.openOnce.Do(func() { close(p.opened) })
		}
	case "DEVICE_DELETED":
		if p := t.lookup(data.Device); p != nil {
			p.deleteOnce.Do(func() { close(p.deleted) })
		}
	}
}

// end marks every port gone as the VM's QMP connection ends; no port can
// be added after.
func (t *portTable) end() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.ended = true
	for id, p := range t.ports {
		p.goneOnce.Do(func() { close(p.gone) })
		delete(t.ports, id)
	}
}
