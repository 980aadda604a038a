package jail

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"time"
	"unsafe"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// RunnerName is the name (argv[0]) under which a binary that imports this
// package is the runner of a confined program instead of itself: it
// applies the run's limits, installs the seccomp filter and execs the
// program. Confine re-executes the running binary (/proc/self/exe) under
// it, so the runner is always the shim that asked for it.
const RunnerName = "vmshim-confined"

// maxOpenFiles is the most files a confined program may have open.
const maxOpenFiles = 1024

// runnerWait bounds how long a started runner may take to hand over its
// filter's listener and ask to exec: it is the shim's own code, which
// does that at once.
const runnerWait = 30 * time.Second

func init() {
	if len(os.Args) > 0 && filepath.Base(os.Args[0]) == RunnerName {
		// Before anything else the binary would do: the filter goes on
		// this thread, which then execs the program.
		runtime.LockOSThread()
		os.Exit(runRunner(os.Args[1:]))
	}
}

// Limits are the resource limits a confined program runs under.
type Limits struct {
	CPU          time.Duration // CPU time; past it the kernel kills the program
	AddressSpace uint64        // bytes it may map
}

// Confinement is the confinement of one program run, made by Confine.
//
// The program runs in a PID namespace of its own, of which it is process
// 1 (anything it forks dies with it), in a new, empty network namespace,
// with no_new_privs, without core dumps, with at most maxOpenFiles open
// files, under Limits and under a seccomp
// filter (see filter) that lets one execve through: the runner's, of the
// program. The filter hands execve and execveat to the shim
// (SECCOMP_RET_USER_NOTIF); Started lets the runner's through and closes
// the filter's listener once the runner has exec'd, after which every
// execve the program tries fails with ENOSYS, whatever its arguments.
type Confinement struct {
	program string
	parent  *os.File // the shim's end of the runner's socket
	child   *os.File // the runner's end, until Started
}

// Confine makes cmd, not yet started, run cmd.Path (with cmd.Args)
// confined: it is rewritten to start the runner, with the runner's socket
// as its last extra file. Start cmd (in its cgroup, from a jail's thread
// if it is to be jailed) and call Started; Close in any case.
func Confine(cmd *exec.Cmd, lim Limits) (*Confinement, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("confine %s: %w", cmd.Path, err)
	}
	c := &Confinement{program: cmd.Path, parent: os.NewFile(uintptr(fds[0]), "runner"), child: os.NewFile(uintptr(fds[1]), "runner")}
	argv := cmd.Args
	if len(argv) == 0 {
		argv = []string{cmd.Path}
	}
	cmd.ExtraFiles = append(cmd.ExtraFiles, c.child)
	fd := 2 + len(cmd.ExtraFiles)
	cmd.Args = append([]string{RunnerName, strconv.FormatInt(int64(lim.CPU/time.Second), 10),
		strconv.FormatUint(lim.AddressSpace, 10), strconv.Itoa(fd), cmd.Path}, argv...)
	cmd.Path = "/proc/self/exe"
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	// Clone flags rather than thread steps (thread.NewNetns): the child
	// gets its namespaces as it is made, and no thread of the shim is
	// moved, or has to be moved back.
	cmd.SysProcAttr.Cloneflags |= unix.CLONE_NEWPID | unix.CLONE_NEWNET
	return c, nil
}

// Started lets the runner of cmd, started as pid, exec the program: it
// takes the filter's listener from the runner, allows the runner's
// execve and, once the runner has exec'd, closes the listener. An error
// means the program will not run; the caller kills and reaps the runner.
func (c *Confinement) Started(ctx context.Context, pid int) error {
	c.child.Close()
	c.child = nil
	ctx, cancel := context.WithTimeout(ctx, runnerWait)
	defer cancel()
	listener, err := c.receive(ctx)
	if err != nil {
		return fmt.Errorf("confine %s: %w", c.program, err)
	}
	allowed, err := allowExec(ctx, listener, int(c.parent.Fd()), pid)
	unix.Close(listener)
	if err != nil {
		return fmt.Errorf("confine %s: %w", c.program, err)
	}
	return c.execed(ctx, allowed)
}

// execed reads how the runner ended: its socket closes when it execs or
// dies (allowed says whether it was let exec), and says why when it fails.
func (c *Confinement) execed(ctx context.Context, allowed bool) error {
	fd := int(c.parent.Fd())
	if err := waitReadable(ctx, fd); err != nil {
		return fmt.Errorf("confine %s: wait for exec: %w", c.program, err)
	}
	buf := make([]byte, 512)
	n, _, _, _, err := unix.Recvmsg(fd, buf, nil, 0)
	switch {
	case err != nil:
		return fmt.Errorf("confine %s: wait for exec: %w", c.program, err)
	case n > 0:
		return errdefs.ErrFailedPrecondition.WithMessage(string(buf[:n]))
	case !allowed:
		return fmt.Errorf("confine %s: runner exited before its exec: %w", c.program, errdefs.ErrFailedPrecondition)
	}
	return nil
}

// Close closes the runner's socket.
func (c *Confinement) Close() {
	c.parent.Close()
	if c.child != nil {
		c.child.Close()
	}
}

// receive reads the runner's message: its filter's listener, or why it
// could not install the filter.
func (c *Confinement) receive(ctx context.Context) (int, error) {
	fd := int(c.parent.Fd())
	if err := waitReadable(ctx, fd); err != nil {
		return -1, fmt.Errorf("runner: %w", err)
	}
	buf := make([]byte, 512)
	oob := make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := unix.Recvmsg(fd, buf, oob, unix.MSG_CMSG_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("runner: %w", err)
	}
	var fds []int
	if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
		for _, m := range msgs {
			if r, err := unix.ParseUnixRights(&m); err == nil {
				fds = append(fds, r...)
			}
		}
	}
	if n == 2 && string(buf[:2]) == "ok" && len(fds) == 1 {
		return fds[0], nil
	}
	for _, f := range fds {
		unix.Close(f)
	}
	if n == 0 {
		return -1, errdefs.ErrFailedPrecondition.WithMessage("runner exited before it installed its seccomp filter")
	}
	return -1, errdefs.ErrFailedPrecondition.WithMessage(string(buf[:n]))
}

// seccompNotif and seccompNotifResp are struct seccomp_notif and
// seccomp_notif_resp (linux/seccomp.h).
type seccompNotif struct {
	ID    uint64
	Pid   uint32
	Flags uint32
	Nr    int32
	Arch  uint32
	IP    uint64
	Args  [6]uint64
}

type seccompNotifResp struct {
	ID    uint64
	Val   int64
	Error int32
	Flags uint32
}

// allowExec lets the runner's execve on listener through, and returns
// once the runner's socket sock reads: the runner has exec'd, failed or
// died. allowed says whether it was let exec.
//
// A signal to the runner while its execve waits (the Go runtime's own
// SIGURG, say) withdraws the notification, and the execve, restarted
// after the handler, notifies again: RECV or SEND fail with ENOENT, or
// SEND succeeds but the runner never sees the answer. So every
// notification from the runner before its exec is let through; one that
// comes after its socket closed (the exec closes it before the program
// runs) is the program's own, and is left to fail with ENOSYS when the
// listener closes.
func allowExec(ctx context.Context, listener, sock, pid int) (allowed bool, err error) {
	for {
		var ready bool
		ready, err = waitNotification(ctx, listener, sock)
		if err != nil || !ready {
			return allowed, err
		}
		var n seccompNotif
		err = ioctl(listener, unix.SECCOMP_IOCTL_NOTIF_RECV, unsafe.Pointer(&n))
		switch {
		case errors.Is(err, unix.ENOENT):
			continue // withdrawn before it was received
		case err != nil:
			return allowed, fmt.Errorf("receive the runner's exec: %w", err)
		case readable(sock):
			return allowed, nil
		}
		resp := seccompNotifResp{ID: n.ID, Flags: unix.SECCOMP_USER_NOTIF_FLAG_CONTINUE}
		if int(n.Pid) != pid {
			resp = seccompNotifResp{ID: n.ID, Error: -int32(unix.EPERM)}
		}
		err = ioctl(listener, unix.SECCOMP_IOCTL_NOTIF_SEND, unsafe.Pointer(&resp))
		switch {
		case int(n.Pid) != pid:
			return allowed, fmt.Errorf("exec asked by pid %d, not the runner's %d: %w", n.Pid, pid, errdefs.ErrFailedPrecondition)
		case errors.Is(err, unix.ENOENT):
			// withdrawn: the restarted execve notifies again
		case err != nil:
			return allowed, fmt.Errorf("allow the runner's exec: %w", err)
		default:
			allowed = true
		}
	}
}

// waitNotification waits until listener has a notification to receive,
// and says so, or the runner's socket sock reads, or ctx ends. The
// listener hanging up (no task uses the filter) means the runner is
// exiting: its socket reads soon.
func waitNotification(ctx context.Context, listener, sock int) (bool, error) {
	for {
		if err := ctx.Err(); err != nil {
			return false, fmt.Errorf("wait for the runner's exec: %w", err)
		}
		pfd := []unix.PollFd{{Fd: int32(sock), Events: unix.POLLIN}, {Fd: int32(listener), Events: unix.POLLIN}}
		_, err := unix.Poll(pfd, 100)
		switch {
		case errors.Is(err, unix.EINTR):
		case err != nil:
			return false, fmt.Errorf("wait for the runner's exec: %w", err)
		case pfd[0].Revents != 0 || pfd[1].Revents&unix.POLLHUP != 0:
			return false, nil
		case pfd[1].Revents&unix.POLLIN != 0:
			return true, nil
		}
		// POLLERR alone: the kernel's poll of the listener was
		// interrupted.
	}
}

// readable says whether fd reads at once.
func readable(fd int) bool {
	pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	n, _ := unix.Poll(pfd, 0)
	return n > 0
}

func ioctl(fd int, req uint, arg unsafe.Pointer) error {
	for {
		_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(req), uintptr(arg))
		if errno == unix.EINTR {
			continue
		}
		if errno != 0 {
			return errno
		}
		return nil
	}
}

// waitReadable waits until fd is readable or hung up, or ctx ends.
func waitReadable(ctx context.Context, fd int) error {
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(pfd, 100)
		if errors.Is(err, unix.EINTR) || n == 0 {
			continue
		}
		if err != nil {
			return err
		}
		return nil
	}
}

// runRunner is the runner: args are CPU seconds, address space bytes,
// the socket's fd, the program and its argv. It returns only on failure,
// with an exit code.
func runRunner(args []string) int {
	if len(args) < 5 {
		fmt.Fprintf(os.Stderr, "%s: want CPU AS FD PROGRAM ARGV0 [ARG...]\n", RunnerName)
		return 126
	}
	fd, err := strconv.Atoi(args[2])
	if err != nil || fd < 3 {
		fmt.Fprintf(os.Stderr, "%s: bad fd %q\n", RunnerName, args[2])
		return 126
	}
	unix.CloseOnExec(fd)
	fail := func(err error) int {
		msg := []byte(err.Error())
		if len(msg) > 500 {
			msg = msg[:500]
		}
		_ = unix.Sendmsg(fd, msg, nil, nil, 0)
		return 126
	}
	as, err := confineSelf(args[0], args[1], fd)
	if err != nil {
		return fail(err)
	}
	path, err1 := syscall.BytePtrFromString(args[3])
	argv, err2 := syscall.SlicePtrFromStrings(args[4:])
	envv, err3 := syscall.SlicePtrFromStrings(os.Environ())
	if err := errors.Join(err1, err2, err3); err != nil {
		return fail(fmt.Errorf("exec %s: %w", args[3], err))
	}
	// The address space limit comes last: the runner itself may have
	// mapped more (the race detector's shadow does), and allocates no
	// more from here to the exec.
	if as > 0 {
		if err := unix.Setrlimit(unix.RLIMIT_AS, &unix.Rlimit{Cur: as, Max: as}); err != nil {
			return fail(fmt.Errorf("limit address space: %w", err))
		}
	}
	// The socket is closed by a successful exec; the shim reads that as
	// the program running, and anything else as why it does not. While
	// the execve waits for the shim, the Go runtime signals this thread
	// (SIGURG, every 10ms: a raw call looks like a running goroutine) and
	// the execve restarts; allowExec copes. Neither blocking signals,
	// which the program would inherit, nor unix.Syscall, which may start
	// a thread under the address space limit, is worth it.
	_, _, errno := unix.RawSyscall(unix.SYS_EXECVE, uintptr(unsafe.Pointer(path)),
		uintptr(unsafe.Pointer(&argv[0])), uintptr(unsafe.Pointer(&envv[0])))
	return fail(fmt.Errorf("exec %s: %w", args[3], errno))
}

// confineSelf applies the CPU and core limits, installs the filter and
// hands its listener over the socket fd; it returns the address space
// limit, for the caller to apply just before it execs.
func confineSelf(cpu, as string, fd int) (uint64, error) {
	sec, err1 := strconv.ParseUint(cpu, 10, 64)
	bytes, err2 := strconv.ParseUint(as, 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("runner limits: %w", err)
	}
	if sec > 0 {
		if err := unix.Setrlimit(unix.RLIMIT_CPU, &unix.Rlimit{Cur: sec, Max: sec}); err != nil {
			return 0, fmt.Errorf("runner: limit CPU time: %w", err)
		}
	}
	if err := unix.Setrlimit(unix.RLIMIT_CORE, &unix.Rlimit{}); err != nil {
		return 0, fmt.Errorf("runner: no core dumps: %w", err)
	}
	// Go raised the soft limit on open files for the runner; the program
	// gets a modest one, hard too.
	var nofile unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &nofile); err != nil {
		return 0, fmt.Errorf("runner: open files limit: %w", err)
	}
	nofile.Max = min(nofile.Max, maxOpenFiles)
	nofile.Cur = nofile.Max
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &nofile); err != nil {
		return 0, fmt.Errorf("runner: limit open files: %w", err)
	}
	listener, err := installFilter()
	if err != nil {
		return 0, err
	}
	defer unix.Close(listener)
	if err := unix.Sendmsg(fd, []byte("ok"), unix.UnixRights(listener), nil, 0); err != nil {
		return 0, fmt.Errorf("runner: hand over the filter's listener: %w", err)
	}
	return bytes, nil
}
