package oom

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const (
	// childEnv makes the test binary the child that runs out of memory.
	childEnv = "VMSHIM_OOM_TEST_CHILD"
	// memoryRoot is where the v1 memory hierarchy is mounted.
	memoryRoot = "/sys/fs/cgroup/memory"
	// testLimit is the memory limit of the test's cgroup.
	testLimit = 32 << 20
	// childAlloc is what the child touches, well over testLimit.
	childAlloc = 512 << 20
	// rmdirTimeout bounds how long removing the test's cgroup is retried.
	rmdirTimeout = 10 * time.Second
)

// allocate is the child: once a byte arrives on stdin, which the test
// sends after moving it into the cgroup, it touches childAlloc bytes.
func allocate() {
	var b [1]byte
	if _, err := os.Stdin.Read(b[:]); err != nil {
		os.Exit(2)
	}
	mem := make([]byte, childAlloc)
	for i := 0; i < len(mem); i += os.Getpagesize() {
		mem[i] = 1
	}
	runtime.KeepAlive(mem)
}

func TestV1RealOOMKill(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to create a memory cgroup")
	}
	if _, err := os.Stat(filepath.Join(memoryRoot, oomControlFile)); err != nil {
		t.Skipf("no cgroup v1 memory controller at %s: %v", memoryRoot, err)
	}
	leakCheck(t)
	dir := filepath.Join(memoryRoot, fmt.Sprintf("vmshim-oom-test-%d-%d", os.Getpid(), time.Now().UnixNano()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatalf("create cgroup: %v", err)
	}
	t.Cleanup(func() {
		if err := removeCgroup(dir); err != nil {
			t.Error(err)
		}
	})
	writeFile(t, filepath.Join(dir, "memory.limit_in_bytes"), strconv.Itoa(testLimit))
	if memsw := filepath.Join(dir, "memory.memsw.limit_in_bytes"); exists(memsw) {
		writeFile(t, memsw, strconv.Itoa(testLimit))
	}

	w, _ := startWatch(t, dir)
	wantKilled(t, w, 0)

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start child: %v", err)
	}
	t.Cleanup(func() {
		stdin.Close()
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	writeFile(t, filepath.Join(dir, "cgroup.procs"), strconv.Itoa(cmd.Process.Pid))
	if _, err := stdin.Write([]byte{1}); err != nil {
		t.Fatalf("start the child's allocation: %v", err)
	}

	waitEvent(t, w)
	if n, err := w.Killed(); err != nil || n < 1 {
		t.Fatalf("killed after the event = %d, %v; want at least 1", n, err)
	}
	err = cmd.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		t.Fatalf("child ended with %v, want SIGKILL", err)
	}
	if ws, ok := exit.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("child ended with %v, want SIGKILL", err)
	}
	n, err := w.Killed()
	if err != nil || n < 1 {
		t.Fatalf("killed after exit = %d, %v; want at least 1", n, err)
	}

	if err := removeCgroup(dir); err != nil {
		t.Fatal(err)
	}
	waitEnd(t, w)
	if err := w.Err(); err != nil {
		t.Fatalf("err after removal: %v", err)
	}
}

// removeCgroup removes the cgroup directory dir, retrying while its
// processes finish exiting.
func removeCgroup(dir string) error {
	deadline := time.Now().Add(rmdirTimeout)
	for {
		err := unix.Rmdir(dir)
		if err == nil || errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			return fmt.Errorf("remove cgroup %s: %w", dir, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// exists reports whether path exists.
func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// fakeV1 makes a directory that looks like a v1 memory cgroup, with the
// given memory.oom_control content, and returns it.
func fakeV1(t *testing.T, content string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "cg")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, oomControlFile), content)
	writeFile(t, filepath.Join(dir, eventControlFile), "")
	return dir
}

// notifier returns a function that signals the eventfd the watcher
// registered in the fake cgroup dir, as the kernel does on an OOM.
func notifier(t *testing.T, dir string) func() {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, eventControlFile))
	if err != nil {
		t.Fatal(err)
	}
	fields := strings.Fields(string(data))
	if len(fields) != 2 {
		t.Fatalf("registration %q: want two fds", data)
	}
	efd, err := strconv.Atoi(fields[0])
	if err != nil {
		t.Fatalf("registration %q: %v", data, err)
	}
	return func() {
		t.Helper()
		var b [8]byte
		binary.NativeEndian.PutUint64(b[:], 1)
		if _, err := unix.Write(efd, b[:]); err != nil {
			t.Fatalf("signal eventfd: %v", err)
		}
	}
}

func TestV1NotificationsCounted(t *testing.T) {
	leakCheck(t)
	dir := fakeV1(t, "oom_kill_disable 0\nunder_oom 0\n")
	w, _ := startWatch(t, dir)
	notify := notifier(t, dir)
	wantKilled(t, w, 0)
	notify()
	waitEvent(t, w)
	wantKilled(t, w, 1)
	notify()
	notify()
	wantKilled(t, w, 3)
	waitEvent(t, w)
	noEvent(t, w)
}

func TestV1KillAfterNotification(t *testing.T) {
	leakCheck(t)
	dir := fakeV1(t, "oom_kill_disable 0\nunder_oom 1\noom_kill 0\n")
	w, r := startWatch(t, dir)
	notify := notifier(t, dir)
	notify()
	r.waitFor(t, "under_oom 1")
	noEvent(t, w)
	writeFile(t, filepath.Join(dir, oomControlFile), "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")
	waitEvent(t, w)
	wantKilled(t, w, 1)
}

func TestV1RemovalEnds(t *testing.T) {
	leakCheck(t)
	dir := fakeV1(t, "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")
	w, _ := startWatch(t, dir)
	notify := notifier(t, dir)
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	notify()
	waitEnd(t, w)
	if err := w.Err(); err != nil {
		t.Fatalf("err after removal: %v", err)
	}
}

func TestV1ContextEndsWatch(t *testing.T) {
	leakCheck(t)
	dir := fakeV1(t, "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")
	ctx, cancel := context.WithCancel(context.Background())
	w, err := Watch(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	waitEnd(t, w)
	if err := w.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
}
