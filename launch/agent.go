package launch

import (
	"context"
	"fmt"

	"github.com/vmshim/vmshim/qemu"
)

// guestChannel is the way into a QEMU guest: its agent, and the VM's
// virtio-serial controller, where terminal sessions get ports.
type guestChannel struct {
	agent *qemu.Agent
	vm    *qemu.VM
}

// newGuestChannel returns the guest channel of a QEMU VM, or nil when the
// VM has no agent.
func newGuestChannel(vm *qemu.VM) GuestAgent {
	a := vm.Agent()
	if a == nil {
		return nil
	}
	return guestChannel{agent: a, vm: vm}
}

// Exec starts a program in the guest and returns its guest pid.
func (g guestChannel) Exec(ctx context.Context, c GuestCommand) (int, error) {
	return g.agent.Exec(ctx, qemu.GuestCommand(c))
}

// ExecStatus reports on a program Exec started.
func (g guestChannel) ExecStatus(ctx context.Context, pid int) (GuestExecStatus, error) {
	st, err := g.agent.ExecStatus(ctx, pid)
	return GuestExecStatus(st), err
}

// Ping checks that the agent answers.
func (g guestChannel) Ping(ctx context.Context) error { return g.agent.Ping(ctx) }

// AddPort hot-plugs a virtio-serial port for a terminal session.
func (g guestChannel) AddPort(ctx context.Context) (GuestPort, error) {
	p, err := g.vm.AddSerialPort(ctx)
	if err != nil {
		return nil, err
	}
	return p, nil
}

// ioPause is what holds a QEMU VM paused: nil, not a nil pointer, when
// nothing does.
func ioPause(p *qemu.IOPause, changed <-chan struct{}) (fmt.Stringer, <-chan struct{}) {
	if p == nil {
		return nil, changed
	}
	return p, changed
}
