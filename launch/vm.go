// Package launch is a task's VM on this host: made step by step from its
// bundle (Launcher.Launch), driven while it runs (VM), and unmade from
// the task record it keeps in the bundle, by the task's Delete or, after
// a crash, by the delete action (ReadRecord, Record.Release). A pod
// sandbox is made here too: a pause process holding the pod's network
// namespace. The task service sees all of it through the interfaces of
// this file.
package launch

import (
	"context"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/proto"
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
	// IOPause is the disk error that holds the VM paused, nil while none
	// does (each pause is a value of its own), and a channel closed when
	// that changes (nil: it never does).
	IOPause() (fmt.Stringer, <-chan struct{})
}

// Checkpointer is a VM that can be checkpointed: its state is written
// into a directory containerd made (the task API's Checkpoint), and the
// VM ends. A task created with that directory as its checkpoint resumes
// it (Request.Checkpoint).
type Checkpointer interface {
	Checkpoint(ctx context.Context, dir string) error
}

// GuestMemoryReporter is a VM whose guest reports its own view of its
// memory (through its balloon): GuestMemory is one line of figures for
// the shim's log, "" when the guest has reported none.
type GuestMemoryReporter interface {
	GuestMemory(ctx context.Context) (string, error)
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
	// BeforeStart runs before the vCPUs do; its failure fails Start.
	BeforeStart(ctx context.Context) error
	// AfterStart runs once they do.
	AfterStart(ctx context.Context)
}

// GuestAgent runs programs in the guest.
type GuestAgent interface {
	// Exec starts a program and returns its guest pid.
	Exec(ctx context.Context, c GuestCommand) (int, error)
	// ExecStatus reports on a program Exec started.
	ExecStatus(ctx context.Context, pid int) (GuestExecStatus, error)
	// Ping checks that the agent answers.
	Ping(ctx context.Context) error
}

// GuestCommand is a program for the guest agent to run.
type GuestCommand struct {
	Path  string   // program; the guest's PATH is searched
	Args  []string // arguments after the program name
	Env   []string // KEY=value entries replacing the agent's environment; nil keeps it
	Input []byte   // written to the program's stdin, which is then closed
}

// GuestExecStatus is what the guest agent reports of a started program.
type GuestExecStatus struct {
	Exited    bool
	ExitCode  int // exit code, or 128+signal; valid once Exited
	Signal    int // the signal that ended the program, or 0
	Stdout    []byte
	Stderr    []byte
	Truncated bool // the agent dropped output beyond its capture limit
}

// TerminalGuest is a guest agent whose VM can also give an exec a
// virtio-serial port of its own, the line of its terminal.
type TerminalGuest interface {
	GuestAgent
	// AddPort hot-plugs a port for one terminal session.
	AddPort(ctx context.Context) (GuestPort, error)
}

// GuestPort is a virtio-serial port hot-plugged for one terminal session
// (see qemu.SerialPort).
type GuestPort interface {
	// Name is the port's name in the guest.
	Name() string
	// Conn is the host's end; reads end with EOF once the port is removed.
	Conn() net.Conn
	// Opened is closed once the guest has the port open; Gone once the
	// VM has gone, and the port with it.
	Opened() <-chan struct{}
	Gone() <-chan struct{}
	// Remove unplugs the port and removes its chardev.
	Remove(ctx context.Context) error
}

// Request is what Launch needs to make a task's VM.
type Request struct {
	ID      string
	Bundle  string
	Rootfs  []mount.Mount
	Options typeurl.Any // runtime options from containerd, may be nil
	// Log writes a line into the container's log (its stdout) while it is
	// made: how a download or a disk copy goes. Never nil.
	Log func(line string)
	// Checkpoint is a directory holding a checkpoint (Checkpointer) to
	// resume instead of booting; "" for none.
	Checkpoint string
}

// Launcher makes VMs.
type Launcher interface {
	// Classify decides whether the container r makes runs a VM (or a
	// pod sandbox) this package makes, or is an ordinary container.
	Classify(ctx context.Context, r *Request) (Class, error)
	// Launch makes the VM of a container Classify found to be one.
	Launch(ctx context.Context, r *Request) (VM, error)
}
