package shim

import (
	"context"
	"io"
	"time"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/typeurl/v2"
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
	// after QEMU has exited.
	Release(ctx context.Context)
}

// CreateRequest is what Launch needs to create a VM for a task.
type CreateRequest struct {
	ID      string
	Bundle  string
	Rootfs  []mount.Mount
	Options typeurl.Any // runtime options from containerd, may be nil
}

// Launcher creates VMs.
type Launcher interface {
	Launch(ctx context.Context, r *CreateRequest) (VM, error)
}
