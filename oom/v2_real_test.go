package oom

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

const (
	// v2Root is where the cgroup v2 hierarchy is mounted.
	v2Root = "/sys/fs/cgroup"
	// keeperEnv makes the test binary a keeper: a process that waits in
	// the cgroup until its stdin closes, as the shim's scope placeholder
	// waits until the task is deleted.
	keeperEnv = "VMSHIM_OOM_TEST_KEEPER"
)

// keep is the keeper: it waits until stdin closes.
func keep() {
	var b [1]byte
	_, _ = os.Stdin.Read(b[:])
}

// TestV2RealKillAndRemovalInOneBatch is the race the shim must win on
// cgroup v2: the kernel raises oom_kill in memory.events, the process
// dies, and the cgroup is removed, all before the watch loop reads a
// single notification, so that the loop sees the change and the removal
// in one inotify batch, and reads the count only once the cgroup is gone.
// The count must not depend on that read: as the shim does, a keeper
// (oom_score_adj -1000, so the OOM killer never picks it) holds the
// cgroup until Killed has been read after the kill, and only then is the
// cgroup removed. It needs root on a cgroup v2 host with the memory
// controller; make test-cgroupv2 runs it, many times, in its node.
func TestV2RealKillAndRemovalInOneBatch(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to create a memory cgroup")
	}
	ctrls, err := os.ReadFile(filepath.Join(v2Root, "cgroup.subtree_control"))
	if err != nil || !strings.Contains(" "+strings.TrimSpace(string(ctrls))+" ", " memory ") {
		t.Skipf("no cgroup v2 hierarchy with the memory controller at %s (make test-cgroupv2 runs this in its node)", v2Root)
	}
	leakCheck(t)
	dir := filepath.Join(v2Root, fmt.Sprintf("vmshim-oom-test-%d-%d", os.Getpid(), time.Now().UnixNano()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatalf("create cgroup: %v", err)
	}
	t.Cleanup(func() {
		if err := removeCgroup(dir); err != nil {
			t.Error(err)
		}
	})
	writeFile(t, filepath.Join(dir, "memory.max"), strconv.Itoa(testLimit))
	writeFile(t, filepath.Join(dir, "memory.swap.max"), "0")
	cg, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer cg.Close()

	keeper, keeperIn := startIn(t, cg, keeperEnv)
	adj := -1000
	if err := SetScoreAdj(keeper.Process.Pid, &adj); err != nil {
		t.Fatal(err)
	}

	// The loop waits at the gate until the kill, the exit and the
	// removal are all queued.
	gate := make(chan struct{})
	batches := make(chan [2]int, 16)
	w, err := watch(context.Background(), dir, hooks{
		wait: func() { <-gate },
		batch: func(events int, gone bool) {
			g := 0
			if gone {
				g = 1
			}
			batches <- [2]int{events, g}
		},
	})
	if err != nil {
		t.Fatalf("watch: %v", err)
	}
	released := false
	release := func() {
		if !released {
			released = true
			close(gate)
		}
	}
	t.Cleanup(func() {
		release()
		if err := w.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	wantKilled(t, w, 0)

	child, childIn := startIn(t, cg, childEnv)
	if _, err := childIn.Write([]byte{1}); err != nil {
		t.Fatalf("start the child's allocation: %v", err)
	}
	err = child.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		t.Fatalf("child ended with %v, want SIGKILL", err)
	}
	if ws, ok := exit.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("child ended with %v, want SIGKILL", err)
	}
	// The task's read at the exit, before it publishes it: the loop has
	// not run, the keeper holds the cgroup.
	if n, err := w.Killed(); err != nil || n < 1 {
		t.Fatalf("killed at the exit = %d, %v; want at least 1", n, err)
	}
	if keeper.ProcessState != nil {
		t.Fatal("the OOM killer took the keeper")
	}

	// The delete: the keeper goes, then the cgroup; only then does the
	// loop read its notifications, in one batch.
	keeperIn.Close()
	if err := keeper.Wait(); err != nil {
		t.Fatalf("keeper: %v", err)
	}
	if err := removeCgroup(dir); err != nil {
		t.Fatal(err)
	}
	release()
	waitEnd(t, w)
	if err := w.Err(); err != nil {
		t.Fatalf("err after removal: %v", err)
	}
	select {
	case b := <-batches:
		if b[0] < 2 || b[1] != 1 {
			t.Fatalf("first batch: %d events, gone %v; want the kill and the removal together", b[0], b[1] == 1)
		}
	default:
		t.Fatal("the loop read no batch")
	}
	if n, _ := w.Killed(); n < 1 {
		t.Fatalf("killed after the removal = %d, want the count read at the exit", n)
	}
}

// startIn starts the test binary as the process env names, in the cgroup
// cg from its first instruction, and returns it with its stdin.
func startIn(t *testing.T, cg *os.File, env string) (*exec.Cmd, interface {
	Write([]byte) (int, error)
	Close() error
}) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env+"=1")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cg.Fd())}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", env, err)
	}
	t.Cleanup(func() {
		stdin.Close()
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	return cmd, stdin
}
