package launch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/vmshim/vmshim/jail"
	"github.com/vmshim/vmshim/oom"
	"github.com/vmshim/vmshim/pause"
)

// PauseName is argv[0] of a pod sandbox's process, and the name of the
// program it runs: vmshim-pause, installed next to the shim, or the shim
// binary itself run under that name where there is none (see package
// pause).
const PauseName = pause.Name

// pauseBinary is the program a pod sandbox's process runs: vmshim-pause
// next to the shim's executable, which costs a fraction of the shim's
// memory; the shim itself where there is none.
func pauseBinary() (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", err
	}
	p := filepath.Join(filepath.Dir(self), PauseName)
	if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
		return p, nil
	}
	return self, nil
}

// pauseCommand is a pause process of program prog (pauseBinary) that
// waits as id; arg names what it holds, for ps.
func pauseCommand(prog, arg string, id uint32) *exec.Cmd {
	return &exec.Cmd{Path: prog, Args: []string{PauseName, arg}, Env: pause.Env(id), Dir: "/"}
}

// placeholderID is the uid and gid a systemd scope's placeholder waits
// as: nobody's. It holds no namespace; one killed lets systemd drop the
// scope once the task's process is gone too.
const placeholderID = 65534

// placeholderScoreAdj keeps the placeholder from the OOM killer, even when
// a cgroup kills as a group (memory.oom.group): were it killed with the
// VM's process, systemd would remove the scope, and its oom_kill count,
// before the task has read it. It holds a few hundred KiB.
var placeholderScoreAdj = -1000

// startPlaceholder starts the process a new systemd scope is made around
// (see cgroup.NewHost): a pause process, with no privileges, that waits
// until the scope is stopped, and that the OOM killer never picks.
func startPlaceholder() (*exec.Cmd, error) {
	prog, err := pauseBinary()
	if err != nil {
		return nil, err
	}
	cmd := pauseCommand(prog, "scope-placeholder", placeholderID)
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	if err := oom.SetScoreAdj(cmd.Process.Pid, &placeholderScoreAdj); err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, fmt.Errorf("scope placeholder: %w", err)
	}
	return cmd, nil
}

// sandboxVM stands in for a pod's sandbox container: no VM, only a pause
// process in the pod's namespaces (see podNamespaces), which CRI points
// the pod's containers at. The network namespace belongs to the CRI; the
// IPC, UTS and PID namespaces made for the pod end with the process.
type sandboxVM struct {
	cmd      *exec.Cmd
	limits   *cgroupLimits
	rec      *Record
	console  net.Conn // the shim's end of a console that stays silent
	guestEnd net.Conn
	done     chan struct{}
	code     int // written before done is closed
	at       time.Time
}

// launchSandbox starts the pause process of a pod sandbox in the pod's
// namespaces ns, as an id of ids claimed for owner: a jail id, as a VM's
// QEMU has, so that no other process on the node shares it and may
// signal it.
func launchSandbox(ctx context.Context, r *Request, spec *specs.Spec, ns podNamespaces, ids jail.IDRange, owner string) (_ *sandboxVM, retErr error) {
	pauseProg, err := pauseBinary()
	if err != nil {
		return nil, err
	}
	var sysctls map[string]string
	if spec.Linux != nil {
		sysctls = spec.Linux.Sysctl
	}
	if err := ns.checkSysctls(sysctls); err != nil {
		return nil, err
	}
	rec := &Record{ID: r.ID, Bundle: r.Bundle}
	defer func() {
		if retErr != nil {
			if err := rec.Release(ctx); err != nil {
				log.G(ctx).WithError(err).WithField("id", r.ID).Warn("undo failed create; the delete action retries")
			}
		}
	}()
	if err := rec.push(madeJailID, func(r *Record) { r.JailOwner = owner }); err != nil {
		return nil, err
	}
	id, err := jail.Claim(idsDir, ids, owner)
	if err != nil {
		return nil, fmt.Errorf("config jail_ids: %w", err)
	}
	// Saved by the next push; until then, release finds the claim by its
	// owner.
	rec.JailID = id
	limits := &cgroupLimits{}
	if err := limits.create(ctx, spec, rec); err != nil {
		return nil, err
	}
	cmd := pauseCommand(pauseProg, ns.netns, id)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Cloneflags: ns.clone}
	// Forked from a thread in the pod's netns (and the pod's UTS
	// namespace, named), every thread of the pause process is there from
	// its start: /proc/PID/ns/*, through which the CRI hands the
	// namespaces to the pod's containers, leads to them.
	if err := limits.start(cmd, ns.steps()...); err != nil {
		if cmd.Process != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		return nil, fmt.Errorf("start pod sandbox process: %w", err)
	}
	start, _ := processStart(cmd.Process.Pid)
	if err := rec.push(madeProcess, func(r *Record) { r.Pid, r.PidStart = cmd.Process.Pid, start }); err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, err
	}
	if err := setOOMScoreAdj(cmd.Process.Pid, spec); err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, err
	}
	if err := setSysctls(cmd.Process.Pid, sysctls); err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, err
	}
	shimEnd, guestEnd := net.Pipe()
	s := &sandboxVM{cmd: cmd, limits: limits, rec: rec, console: shimEnd, guestEnd: guestEnd, done: make(chan struct{})}
	go s.wait()
	return s, nil
}

func (s *sandboxVM) wait() {
	err := s.cmd.Wait()
	s.at = time.Now()
	var ee *exec.ExitError
	switch {
	case err == nil:
		s.code = 0
	case errors.As(err, &ee):
		s.code = statusCode(ee.ProcessState)
	default:
		s.code = 255
	}
	s.guestEnd.Close() // the console reader sees EOF, so the exit can be reported
	close(s.done)
}

// statusCode maps a process state to a shell-style status.
func statusCode(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

// Pid is the pause process.
func (s *sandboxVM) Pid() int { return s.cmd.Process.Pid }

// Console is a console nothing writes to.
func (s *sandboxVM) Console() io.ReadWriteCloser { return s.console }

// Start does nothing: the pause process is already waiting.
func (s *sandboxVM) Start(context.Context) error { return nil }

// Powerdown asks the pause process to exit, as SIGTERM does for pause.
func (s *sandboxVM) Powerdown(context.Context) error {
	return s.cmd.Process.Signal(unix.SIGTERM)
}

// Kill stops the pause process at once.
func (s *sandboxVM) Kill() error {
	if err := s.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	return nil
}

// Pause and Resume have nothing to freeze.
func (s *sandboxVM) Pause(context.Context) error  { return nil }
func (s *sandboxVM) Resume(context.Context) error { return nil }

// GuestAgent is nil: a sandbox runs no guest.
func (s *sandboxVM) GuestAgent() GuestAgent { return nil }

// Stats reads the sandbox's cgroup.
func (s *sandboxVM) Stats(ctx context.Context) (proto.Message, error) { return s.limits.Stats(ctx) }

// Update changes the sandbox's cgroup limits.
func (s *sandboxVM) Update(ctx context.Context, r *specs.LinuxResources) error {
	return s.limits.Update(ctx, r)
}

// StartHooks is nil: a sandbox runs no hooks.
func (s *sandboxVM) StartHooks() StartHooks { return nil }

// Done is closed once the pause process has exited.
func (s *sandboxVM) Done() <-chan struct{} { return s.done }

// ExitStatus returns the pause process's status.
func (s *sandboxVM) ExitStatus() (int, time.Time) { return s.code, s.at }

// Release undoes the sandbox's record: its cgroup and the record itself.
func (s *sandboxVM) Release(ctx context.Context) error { return s.rec.Release(ctx) }

// OOMKills is nil: a pause process's OOM kills are no VM's.
func (s *sandboxVM) OOMKills() OOMCounter { return nil }

// IOPause is never set: a sandbox has no disks.
func (s *sandboxVM) IOPause() (fmt.Stringer, <-chan struct{}) { return nil, nil }
