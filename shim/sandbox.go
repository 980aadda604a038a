package shim

import (
	"context"
	"io"
	"net"
	"os"
	"sync"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// containerTypeAnnotation is how containerd's CRI marks a pod's sandbox
// (pause) container.
const containerTypeAnnotation = "io.kubernetes.cri.container-type"

// isSandbox reports whether spec is a CRI pod sandbox container.
func isSandbox(spec *specs.Spec) bool {
	return spec.Annotations[containerTypeAnnotation] == "sandbox"
}

// sandboxVM stands in for a pod's sandbox container: it runs no VM and no
// process; it only holds the pod's place until it is stopped. The pod's
// network namespace belongs to the CRI, which created it.
type sandboxVM struct {
	console  net.Conn // the shim's end of a console that stays silent
	guestEnd net.Conn

	once sync.Once
	done chan struct{}
	code int // written once before done is closed
	at   time.Time
}

func newSandboxVM() *sandboxVM {
	shimEnd, guestEnd := net.Pipe()
	return &sandboxVM{console: shimEnd, guestEnd: guestEnd, done: make(chan struct{})}
}

// Pid reports the shim itself: the sandbox has no process of its own.
func (s *sandboxVM) Pid() int { return os.Getpid() }

// Console is a console nothing writes to.
func (s *sandboxVM) Console() io.ReadWriteCloser { return s.console }

// Start does nothing: there is nothing to run.
func (s *sandboxVM) Start(context.Context) error { return nil }

// Powerdown stops the sandbox as pause does on SIGTERM: exit 0.
func (s *sandboxVM) Powerdown(context.Context) error {
	s.exit(0)
	return nil
}

// Kill stops the sandbox with the status of SIGKILL.
func (s *sandboxVM) Kill() error {
	s.exit(128 + int(unix.SIGKILL))
	return nil
}

// Pause and Resume have nothing to freeze.
func (s *sandboxVM) Pause(context.Context) error  { return nil }
func (s *sandboxVM) Resume(context.Context) error { return nil }

// Done is closed once the sandbox is stopped.
func (s *sandboxVM) Done() <-chan struct{} { return s.done }

// ExitStatus returns the status the sandbox stopped with.
func (s *sandboxVM) ExitStatus() (int, time.Time) { return s.code, s.at }

// Release closes the silent console.
func (s *sandboxVM) Release(context.Context) { s.guestEnd.Close() }

func (s *sandboxVM) exit(code int) {
	s.once.Do(func() {
		s.code, s.at = code, time.Now()
		s.guestEnd.Close() // the console reader sees EOF, so the exit can be reported
		close(s.done)
	})
}
