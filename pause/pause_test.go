package pause

import (
	"errors"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestMain runs the test binary as a pause process when a test starts
// it with VMSHIM_PAUSE_TEST=1.
func TestMain(m *testing.M) {
	if os.Getenv("VMSHIM_PAUSE_TEST") == "1" {
		os.Exit(Run(os.Args[1:]))
	}
	os.Exit(m.Run())
}

func TestParseID(t *testing.T) {
	for in, want := range map[string]uint32{"70000": 70000, "1": 1, "2147483647": 2147483647} {
		if got, err := parseID(in); err != nil || got != want {
			t.Errorf("parseID(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "0", "-1", "abc", "2147483648", " 70000", "70000x"} {
		if got, err := parseID(in); err == nil {
			t.Errorf("parseID(%q) = %d, want an error", in, got)
		}
	}
}

// TestRunRefuses checks that a pause process told no id, or root's,
// exits at once with a one-line error rather than waiting as root.
func TestRunRefuses(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, env := range [][]string{nil, {IDEnv + "=0"}, {IDEnv + "=nobody"}} {
		cmd := exec.Command(self, "refused")
		cmd.Env = append([]string{"VMSHIM_PAUSE_TEST=1"}, env...)
		out, err := cmd.CombinedOutput()
		msg := strings.TrimSpace(string(out))
		if err == nil || strings.Contains(msg, "\n") || !strings.HasPrefix(msg, Name+": drop privileges: "+IDEnv+"=") {
			t.Errorf("env %q: %v, output %q; want exit 1 with one line naming %s", env, err, out, IDEnv)
		}
	}
	if got := Env(70000); len(got) != 1 || got[0] != IDEnv+"=70000" {
		t.Errorf("Env(70000) = %q", got)
	}
}

// TestReapAsPID1 makes a pause process PID 1 of a new pid namespace,
// starts a process in that namespace whose parent exits at once, so that
// pause inherits it, and checks that pause reaps it when it ends; then
// SIGTERM ends pause with status 0.
func TestReapAsPID1(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("a new pid namespace and dropping to an id need root")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	p := exec.Command(self, "pid-namespace")
	p.Env = append([]string{"VMSHIM_PAUSE_TEST=1"}, Env(2100190)...)
	p.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
	var out strings.Builder
	p.Stdout, p.Stderr = &out, &out
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	var waitErr error
	exited := make(chan struct{})
	go func() { waitErr = p.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = p.Process.Kill()
		<-exited
	})
	pid := p.Process.Pid
	if got := status(t, pid, "NSpid"); !strings.HasSuffix(got, " 1") {
		t.Fatalf("pause's NSpid is %q, want PID 1 of its own namespace", got)
	}
	// Pause reaps once its ids are dropped; wait for that.
	waitFor(t, "pause to drop its privileges", func() bool { return status(t, pid, "Uid") == "2100190 2100190 2100190 2100190" })

	// sh runs in pause's pid namespace, starts sleep there and exits:
	// sleep's new parent is PID 1 of that namespace, pause. (sleep's
	// output goes elsewhere, or sh.Wait would wait for it.)
	sh := exec.Command("/bin/sh", "-c", "sleep 1 >/dev/null 2>&1 & echo $!")
	var shOut strings.Builder
	sh.Stdout = &shOut
	if err := startInPidns(sh, pid); err != nil {
		t.Fatal(err)
	}
	if err := sh.Wait(); err != nil {
		t.Fatal(err)
	}
	orphan := childOf(t, pid)
	if orphan == 0 {
		t.Fatalf("no child of pause after sh exited (sh said %q)", shOut.String())
	}
	waitFor(t, "pause to reap its child "+strconv.Itoa(orphan), func() bool {
		_, err := os.Stat("/proc/" + strconv.Itoa(orphan))
		return errors.Is(err, os.ErrNotExist)
	})
	if err := p.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
		if waitErr != nil {
			t.Errorf("pause ended with %v after SIGTERM, want status 0 (output %q)", waitErr, out.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("pause still runs 10s after SIGTERM")
	}
}

// startInPidns starts cmd in the pid namespace of process pid, forked
// from a locked thread that joined it and ends with its goroutine.
func startInPidns(cmd *exec.Cmd, pid int) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		fd, err := syscall.Open("/proc/"+strconv.Itoa(pid)+"/ns/pid", syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
		if err != nil {
			errc <- err
			return
		}
		defer syscall.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWPID); err != nil {
			errc <- err
			return
		}
		errc <- cmd.Start()
	}()
	return <-errc
}

// childOf is a child of process pid, 0 when it has none.
func childOf(t *testing.T, pid int) int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		c, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if status(t, c, "PPid") == strconv.Itoa(pid) {
			return c
		}
	}
	return 0
}

// status is a field of /proc/PID/status with its blanks made single
// spaces; "" when the process is gone.
func status(t *testing.T, pid int, key string) string {
	t.Helper()
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return ""
	}
	for _, l := range strings.Split(string(data), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && k == key {
			return strings.Join(strings.Fields(v), " ")
		}
	}
	return ""
}

// waitFor polls cond for up to 10 seconds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
