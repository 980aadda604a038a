package shim

import (
	"context"
	"io"
	"time"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/proto"

	"github.com/vmshim/vmshim/qemu"
)

// VM is what the task service needs of a virtual machine. Launch returns
// it created with its vCPUs stopped; Start runs them.
type VM interface {
	// Pid is the QEMU process id.
	Pid() int
	// Console is the guest's first serial port.
	Console() io.ReadWriteCloser
	// Start runs the vCPUs of a created VM.
	Start(ctx context.Context) error
	// Powerdown presses the ACPI power button.
	Powerdown(ctx context.Context) error
	// Kill stops QEMU at once.
	Kill() error
	// Pause and Resume stop and restart the vCPUs.
	Pause(ctx context.Context) error
	Resume(ctx context.Context) error
	// Done is closed once QEMU has exited.
	Done() <-chan struct{}
	// ExitStatus is QEMU's exit code, or 128+signal; valid after Done.
	ExitStatus() (int, time.Time)
	// Release frees every host resource held for the VM; it is called
	// after QEMU has exited. What it could not free stays recorded, and
	// a second call tries again.
	Release(ctx context.Context) error
	// GuestAgent is the guest agent's channel, or nil when the VM has
	// none (a pod sandbox).
	GuestAgent() GuestAgent
	// Stats reports the VM's cgroup usage as containerd metrics types.
	Stats(ctx context.Context) (proto.Message, error)
	// Update applies new resource limits to the running VM.
	Update(ctx context.Context, r *specs.LinuxResources) error
	// StartHooks is the work to do around Start, or nil for none.
	StartHooks() StartHooks
	// OOMKills counts the OOM kills in the VM's memory cgroup, or is nil
	// when none is watched.
	OOMKills() OOMCounter
	// IOPause is the disk error that holds the VM paused (nil while none
	// does) and a channel closed when that changes (nil: it never does).
	IOPause() (*qemu.IOPause, <-chan struct{})
}

// OOMCounter counts the OOM kills in a memory cgroup (see oom.Watcher).
type OOMCounter interface {
	// Events has a value after one or more kills; it is closed when the
	// watch ends.
	Events() <-chan struct{}
	// Killed reads the kernel's count of kills now.
	Killed() (uint64, error)
}

// StartHooks is work around a VM's Start (OCI hooks). It runs without the
// task's lock: a hook may call back into the shim, through containerd,
// for the task's state.
type StartHooks interface {
	// beforeStart runs before the vCPUs do; its failure fails Start.
	beforeStart(ctx context.Context) error
	// afterStart runs once they do.
	afterStart(ctx context.Context)
}

// GuestAgent runs programs in the guest.
type GuestAgent interface {
	// Exec starts a program and returns its guest pid.
	Exec(ctx context.Context, c qemu.GuestCommand) (int, error)
	// ExecStatus reports on a program Exec started.
	ExecStatus(ctx context.Context, pid int) (qemu.GuestExecStatus, error)
	// Ping checks that the agent answers.
	Ping(ctx context.Context) error
}

// CreateRequest is what Launch needs to create a VM for a task.
type CreateRequest struct {
	ID      string
	Bundle  string
	Rootfs  []mount.Mount
	Options typeurl.Any // runtime options from containerd, may be nil
	// Log writes a line into the container's log (its stdout) while it is
	// made: how a download or a disk copy goes. Never nil.
	Log func(line string)
}

// Launcher creates VMs.
type Launcher interface {
	Launch(ctx context.Context, r *CreateRequest) (VM, error)
}
