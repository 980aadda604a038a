package jail

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// probeEnv makes the test binary, run confined, try the calls the filter
// rules on and print what each returned, instead of running tests.
const probeEnv = "VMSHIM_CONFINE_PROBE"

func init() {
	switch os.Getenv(probeEnv) {
	case "calls":
		os.Exit(probeCalls())
	case "x32":
		// An x32 call (getpid's x32 number) kills the process.
		unix.RawSyscall(x32Bit|unix.SYS_GETPID, 0, 0, 0)
		os.Exit(0)
	}
}

// probeCalls tries each call once and prints "name errno" lines (errno 0
// for success), then its pid and network namespace.
func probeCalls() int {
	errno := func(_, _ uintptr, e syscall.Errno) int { return int(e) }
	socket := func(family int) int {
		fd, _, e := unix.RawSyscall(unix.SYS_SOCKET, uintptr(family), unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if e == 0 {
			unix.Close(int(fd))
		}
		return int(e)
	}
	atFDCWD := unix.AT_FDCWD
	sh, _ := syscall.BytePtrFromString("/bin/sh")
	argv := []*byte{sh, nil}
	results := []struct {
		name string
		e    int
	}{
		{"execve", errno(unix.RawSyscall(unix.SYS_EXECVE, uintptr(unsafe.Pointer(sh)), uintptr(unsafe.Pointer(&argv[0])), 0))},
		{"execveat", errno(unix.RawSyscall6(unix.SYS_EXECVEAT, uintptr(atFDCWD), uintptr(unsafe.Pointer(sh)), uintptr(unsafe.Pointer(&argv[0])), 0, 0, 0))},
		{"setuid", errno(unix.RawSyscall(unix.SYS_SETUID, 0, 0, 0))},
		{"setresgid", errno(unix.RawSyscall(unix.SYS_SETRESGID, 0, 0, 0))},
		{"setgroups", errno(unix.RawSyscall(unix.SYS_SETGROUPS, 0, 0, 0))},
		{"socket-inet", socket(unix.AF_INET)},
		{"socket-inet6", socket(unix.AF_INET6)},
		{"socket-netlink", socket(unix.AF_NETLINK)},
		{"socket-packet", socket(unix.AF_PACKET)},
		{"socket-unix", socket(unix.AF_UNIX)},
		{"socket-unix-high-bits", socket(1<<32 | unix.AF_UNIX)},
		{"socket-inet-high-bits", socket(1<<32 | unix.AF_INET)},
		{"ptrace", errno(unix.RawSyscall(unix.SYS_PTRACE, unix.PTRACE_TRACEME, 0, 0))},
		{"unshare", errno(unix.RawSyscall(unix.SYS_UNSHARE, unix.CLONE_NEWUSER, 0, 0))},
		{"setns", errno(unix.RawSyscall(unix.SYS_SETNS, 0, 0, 0))},
		{"mount", errno(unix.RawSyscall6(unix.SYS_MOUNT, 0, 0, 0, 0, 0, 0))},
		{"bpf", errno(unix.RawSyscall(unix.SYS_BPF, 0, 0, 0))},
		{"keyctl", errno(unix.RawSyscall(unix.SYS_KEYCTL, 0, 0, 0))},
		{"personality", errno(unix.RawSyscall(unix.SYS_PERSONALITY, 0xffffffff, 0, 0))},
		{"io_uring_setup", errno(unix.RawSyscall(unix.SYS_IO_URING_SETUP, 0, 0, 0))},
		// Flags the kernel would refuse with EINVAL (a thread that shares
		// no memory): EPERM says the filter answered first.
		{"clone-newnet", errno(unix.RawSyscall(unix.SYS_CLONE, unix.CLONE_NEWNET|unix.CLONE_THREAD, 0, 0))},
		{"clone3", errno(unix.RawSyscall(unix.SYS_CLONE3, 0, 0, 0))},
		{"getpid", errno(unix.RawSyscall(unix.SYS_GETPID, 0, 0, 0))},
	}
	for _, r := range results {
		fmt.Printf("%s %d\n", r.name, r.e)
	}
	netns, _ := os.Readlink("/proc/self/ns/net")
	fmt.Printf("pid %d\nnetns %s\n", os.Getpid(), netns)
	return 0
}

// runProbe runs the test binary confined in probe mode, and returns its
// output and how it ended.
func runProbe(t *testing.T, mode string) (string, error) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("confinement makes namespaces, which needs root")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), probeEnv+"="+mode)
	var out, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &stderr
	c, err := Confine(cmd, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if err := c.Started(context.Background(), cmd.Process.Pid); err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("Started() = %v; stderr: %s", err, stderr.String())
	}
	err = cmd.Wait()
	if stderr.Len() > 0 {
		t.Logf("stderr: %s", stderr.String())
	}
	return out.String(), err
}

// TestFilter runs a program confined and checks what the filter lets it
// do: the one exec that started it, then no exec, no change of ids, no
// socket but AF_UNIX, no namespaces, no tracing, mounts or kernel calls;
// it is process 1 of a PID namespace and has a network namespace that is
// not the test's.
func TestFilter(t *testing.T) {
	out, err := runProbe(t, "calls")
	if err != nil {
		t.Fatalf("probe: %v; output:\n%s", err, out)
	}
	got := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		k, v, _ := strings.Cut(line, " ")
		got[k] = v
	}
	eperm, enosys := fmt.Sprint(int(unix.EPERM)), fmt.Sprint(int(unix.ENOSYS))
	want := map[string]string{
		"execve": enosys, "execveat": enosys,
		"setuid": eperm, "setresgid": eperm, "setgroups": eperm,
		"socket-inet": eperm, "socket-inet6": eperm, "socket-netlink": eperm, "socket-packet": eperm,
		"socket-unix": "0", "socket-unix-high-bits": "0", "socket-inet-high-bits": eperm,
		"ptrace": eperm, "unshare": eperm, "setns": eperm, "mount": eperm, "bpf": eperm,
		"keyctl": eperm, "personality": eperm, "io_uring_setup": eperm,
		"clone-newnet": eperm, "clone3": enosys, "getpid": "0",
		"pid": "1",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: got %q, want %q", k, got[k], v)
		}
	}
	own, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	if got["netns"] == "" || got["netns"] == own {
		t.Errorf("confined network namespace %q, want one that is not the test's %q", got["netns"], own)
	}
}

// TestFilterX32 checks an x32 system call kills the confined process.
func TestFilterX32(t *testing.T) {
	out, err := runProbe(t, "x32")
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) {
		t.Fatalf("probe = %v, want killed; output:\n%s", err, out)
	}
	ws := exitErr.Sys().(syscall.WaitStatus)
	if !ws.Signaled() || ws.Signal() != unix.SIGSYS {
		t.Fatalf("probe ended %v, want killed by SIGSYS", exitErr)
	}
}

// TestConfineMissingProgram checks a program that cannot be executed
// fails Started with the reason, and nothing is left running.
func TestConfineMissingProgram(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("confinement makes namespaces, which needs root")
	}
	cmd := exec.Command("/nonexistent/program")
	cmd.Path = "/nonexistent/program"
	c, err := Confine(cmd, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	err = c.Started(context.Background(), cmd.Process.Pid)
	_ = cmd.Wait()
	if err == nil || err.Error() != "exec /nonexistent/program: no such file or directory" {
		t.Fatalf("Started() = %v, want the exec's error", err)
	}
}

// TestConfineSignalled checks a runner signalled while its exec waits for
// the shim still execs the program: each signal withdraws the exec's
// notification, received or not, and the exec, restarted, notifies
// again. The race is in microseconds, so the test runs a few programs,
// signals as fast as it can and has the runner, at a real-time priority,
// handle each signal at once.
func TestConfineSignalled(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("confinement makes namespaces, which needs root")
	}
	for range 10 {
		runSignalled(t)
	}
}

// runSignalled runs /bin/true confined and sends its runner's main thread,
// the one that execs, SIGURG until Started is done: the runner's Go
// runtime handles it, and true ignores it.
func runSignalled(t *testing.T) {
	t.Helper()
	cmd, c := startConfinedTrue(t)
	pid := cmd.Process.Pid
	if err := unix.SchedSetAttr(pid, &unix.SchedAttr{Policy: unix.SCHED_FIFO, Priority: 1}, 0); err != nil {
		t.Logf("runner at real-time priority: %v", err)
	}
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			select {
			case <-stop:
				return
			default:
			}
			// The runner is not reaped before Started is done.
			_ = unix.Tgkill(pid, pid, unix.SIGURG)
		}
	}()
	err := c.Started(context.Background(), pid)
	close(stop)
	<-stopped
	if err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("Started() = %v", err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("true: %v", err)
	}
}

// startConfinedTrue starts /bin/true confined; the caller calls Started
// and waits for it.
func startConfinedTrue(t *testing.T) (*exec.Cmd, *Confinement) {
	t.Helper()
	cmd := exec.Command("/bin/true")
	c, err := Confine(cmd, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd, c
}

// TestConfineRunnerKilled checks a runner killed while its exec waits
// fails Started at once, not when runnerWait ends, though it is not
// reaped yet.
func TestConfineRunnerKilled(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("confinement makes namespaces, which needs root")
	}
	cmd, c := startConfinedTrue(t)
	defer func() { _ = cmd.Wait() }()
	pid := cmd.Process.Pid
	// /proc/PID/syscall starts with the number of the call a blocked
	// task waits in.
	execve := fmt.Sprintf("%d ", unix.SYS_EXECVE)
	for start := time.Now(); ; time.Sleep(time.Millisecond) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/syscall", pid))
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(string(b), execve) {
			break
		}
		if time.Since(start) > 10*time.Second {
			t.Fatalf("runner not in execve: %s", b)
		}
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	// Dead, not reaped: Started is to see that at once.
	var info unix.Siginfo
	if err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil); err != nil {
		t.Fatal(err)
	}
	// Waiting until runnerWait ends would fail with its deadline.
	err := c.Started(context.Background(), pid)
	if !errdefs.IsFailedPrecondition(err) || err.Error() != "confine /bin/true: runner exited before its exec: failed precondition" {
		t.Errorf("Started() = %v, want the runner exited before its exec", err)
	}
}
