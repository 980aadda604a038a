package launch

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/vmshim/vmshim/config"
	"github.com/vmshim/vmshim/oom"
	"github.com/vmshim/vmshim/qemu"
)

// qemuVM is a QEMU VM with the host resources recorded for it. Each
// method says where it goes: the process (proc), the VM's cgroup
// (limits), the hooks, or the resources Release frees.
type qemuVM struct {
	proc     *qemu.VM
	limits   *cgroupLimits
	console  net.Conn
	rec      *Record
	stderr   io.Closer
	hooks    *ociHooks
	oom      *oom.Watcher // nil when the VM has no cgroup, or it could not be watched
	resize   *resizer     // resizes the running VM; nil until it runs
	saver    *saver       // saves the VM; nil for one without a filesystem root-disk volume
	suspend  *suspender   // saves the VM at a stop; nil for one that powers off
	relink   *relinker    // brings a resumed guest's NICs back up; nil for a booted one
	guestMem *guestMemory // the guest's memory statistics; nil without a balloon
	death    *deathWatch  // stops a dead guest; sets the task's exit status then
	pace     *pacer       // holds the vCPUs until the VM has a boot slot; nil unpaced

	unbooted atomic.Bool // stopped while it waited for a boot slot: it never ran

	closeOnce sync.Once // closes stderr and oom once
}

// Pid is QEMU's process id.
func (v *qemuVM) Pid() int { return v.proc.Pid() }

// Console returns the shim's end of the guest's serial port.
func (v *qemuVM) Console() io.ReadWriteCloser { return v.console }

// Start runs the vCPUs; a resumed guest's NICs come up a moment later.
func (v *qemuVM) Start(ctx context.Context) error {
	if v.pace != nil {
		return v.pace.start(ctx, v.proc.Start, v.proc.Done())
	}
	if err := v.proc.Start(ctx); err != nil {
		return err
	}
	v.relink.start(ctx, v.proc)
	return nil
}

// Powerdown presses the ACPI power button; a VM that suspends on stop
// is saved onto its volume instead, in the background, and QEMU ends
// once its state is whole.
func (v *qemuVM) Powerdown(ctx context.Context) error {
	if v.pace != nil && v.pace.abandon() {
		// It never ran: there is neither a guest to power down nor a
		// state to save.
		v.unbooted.Store(true)
		return v.proc.Kill()
	}
	if v.suspend != nil {
		v.suspend.start(ctx, v.proc)
		return nil
	}
	return v.proc.Powerdown(ctx)
}

// Checkpoint saves the VM into dir, as a suspend saves it onto its
// volume, and ends it: the checkpoint goes with the disk as it is now.
func (v *qemuVM) Checkpoint(ctx context.Context, dir string) error {
	if v.saver == nil {
		return fmt.Errorf("checkpoint of a VM needs its root disk on a filesystem volume (%s): the checkpoint holds its memory, and the disk it goes with must outlive the container: %w",
			config.AnnotationRootDiskVolume, errdefs.ErrNotImplemented)
	}
	return v.saver.checkpoint(ctx, v.proc, dir)
}

// Kill stops QEMU at once.
func (v *qemuVM) Kill() error { return v.proc.Kill() }

// Pause stops the vCPUs.
// A VM that waits for a boot slot is stopped already, and stays so.
func (v *qemuVM) Pause(ctx context.Context) error {
	if v.pace != nil && v.pace.pause() {
		return nil
	}
	return v.proc.Pause(ctx)
}

// Resume restarts the vCPUs; a VM that waits for a boot slot goes on
// waiting, and boots once it has one.
func (v *qemuVM) Resume(ctx context.Context) error {
	if v.pace != nil && v.pace.resume() {
		return nil
	}
	return v.proc.Resume(ctx)
}

// Done is closed once QEMU has exited.
func (v *qemuVM) Done() <-chan struct{} { return v.proc.Done() }

// ExitStatus is QEMU's exit status, once Done.
// A guest the shim found dead and stopped exits with deadStatus; a VM
// stopped before it booted exits 0, as one powered down would.
func (v *qemuVM) ExitStatus() (int, time.Time) {
	code, at := v.proc.ExitStatus()
	if v.unbooted.Load() && code == 128+int(unix.SIGKILL) {
		return 0, at
	}
	return v.death.exitStatus(code), at
}

// Stats reads the VM's cgroup: the host's view of what the VM costs,
// which the guest's own (GuestMemory) joins in the shim's debug log.
func (v *qemuVM) Stats(ctx context.Context) (proto.Message, error) {
	v.logGuestMemory(ctx)
	return v.limits.Stats(ctx)
}

// Update resizes the VM to new resources: its cgroup, vCPUs, guest RAM
// and pinning.
func (v *qemuVM) Update(ctx context.Context, r *specs.LinuxResources) error {
	if v.resize == nil {
		return v.limits.Update(ctx, r)
	}
	return v.resize.Update(ctx, r)
}

// GuestAgent returns the channel to the guest's agent, which can also
// give terminal sessions ports.
func (v *qemuVM) GuestAgent() GuestAgent { return newGuestChannel(v.proc) }

// StartHooks returns the VM's OCI hooks around Start.
func (v *qemuVM) StartHooks() StartHooks { return v }

// BeforeStart runs the startContainer hooks, in the VM's network
// namespace, just before the vCPUs run.
func (v *qemuVM) BeforeStart(ctx context.Context) error {
	return v.hooks.run(ctx, phaseStartContainer, specs.StateCreated, v.Pid())
}

// AfterStart runs the poststart hooks once the vCPUs run; their failures
// are logged, as the runtime spec asks.
func (v *qemuVM) AfterStart(ctx context.Context) {
	v.hooks.runAll(ctx, phasePoststart, specs.StateRunning, v.Pid())
}

// OOMKills is the watch on the VM's memory cgroup, or nil.
func (v *qemuVM) OOMKills() OOMCounter {
	if v.oom == nil {
		return nil
	}
	return v.oom
}

// IOPause is the disk error that holds the VM paused, if any.
func (v *qemuVM) IOPause() (fmt.Stringer, <-chan struct{}) { return ioPause(v.proc.IOPause()) }

// Release frees what the VM held once QEMU has exited: its record's undo
// stack, which keeps what it could not undo for the next call.
func (v *qemuVM) Release(ctx context.Context) error {
	v.closeOnce.Do(func() {
		v.stderr.Close()
		if v.oom != nil {
			_ = v.oom.Close()
		}
	})
	return v.rec.Release(ctx)
}
