package launch

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/vmshim/vmshim/pause"
)

// TestMain lets the test binary stand in for a pause process: run as
// PauseName, it is one.
func TestMain(m *testing.M) {
	if filepath.Base(os.Args[0]) == PauseName {
		os.Exit(pause.Run(os.Args[1:]))
	}
	os.Exit(m.Run())
}

func TestSandboxBundle(t *testing.T) {
	for id, want := range map[string]string{
		"abc":   "/state/k8s.io/abc",
		"":      "",
		".":     "",
		"..":    "",
		"a/b":   "",
		"a\x00": "",
	} {
		if got := sandboxBundle("/state/k8s.io/ctr1", id); got != want {
			t.Errorf("sandboxBundle(%q) = %q, want %q", id, got, want)
		}
	}
}

// TestClaimPod checks that a pod runs one VM, that the claim lives in the
// sandbox's bundle (a shim that restarts sees it), that giving it back
// frees the pod, and that a container whose sandbox is not a vmshim
// sandbox claims nothing.
func TestClaimPod(t *testing.T) {
	sandbox := filepath.Join(t.TempDir(), "sb")
	if err := os.Mkdir(sandbox, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := ClaimPod(sandbox, "vm1"); err != nil {
		t.Fatalf("claim without a pod state: %v", err)
	}
	if _, ok, _ := readPodState(sandbox); ok {
		t.Fatal("a claim on a bundle without pod state wrote one")
	}
	if err := writePodState(sandbox, podState{}); err != nil {
		t.Fatal(err)
	}
	if err := ClaimPod(sandbox, "vm1"); err != nil {
		t.Fatalf("first claim: %v", err)
	}
	err := ClaimPod(sandbox, "vm2")
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "pod already runs a VM in container vm1") {
		t.Fatalf("second claim: %v, want the pod's VM named", err)
	}
	if err := ReleasePod(sandbox, "vm1"); err != nil {
		t.Fatal(err)
	}
	if err := ClaimPod(sandbox, "vm2"); err != nil {
		t.Fatalf("claim after release: %v", err)
	}
	// An old release does not free a newer claim.
	if err := ReleasePod(sandbox, "vm1"); err != nil {
		t.Fatal(err)
	}
	if st, ok, err := readPodState(sandbox); err != nil || !ok || st.VM != "vm2" {
		t.Fatalf("pod state %+v, %v, %v; want vm2's claim", st, ok, err)
	}
	if err := ReleasePod(sandbox, "vm2"); err != nil {
		t.Fatal(err)
	}
	if st, _, _ := readPodState(sandbox); st.VM != "" {
		t.Fatalf("pod state %+v after release", st)
	}
	if err := ReleasePod(filepath.Join(sandbox, "gone"), "vm2"); err != nil {
		t.Errorf("release on a pod that is gone: %v", err)
	}
}

// TestClaimPodRace checks that of many containers claiming one pod at
// once, exactly one gets it.
func TestClaimPodRace(t *testing.T) {
	sandbox := t.TempDir()
	if err := writePodState(sandbox, podState{}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var won []string
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("vm%d", i)
			if err := ClaimPod(sandbox, id); err == nil {
				mu.Lock()
				won = append(won, id)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if st, _, _ := readPodState(sandbox); len(won) != 1 || st.VM != won[0] {
		t.Fatalf("claims won by %v, pod state %+v; want exactly one", won, st)
	}
}

// TestPodNetns checks that the /proc path of a pause process's netns
// maps to the path it names, and only when both are the same namespace.
func TestPodNetns(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("a pause process drops to an id of its own, which needs root")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	own := fmt.Sprintf("/proc/%d/ns/net", os.Getpid()) // the pause process's netns too
	for _, tc := range []struct{ named, want string }{
		{own, own},
		{"/dev/null", ""}, // not its namespace: the /proc path stays
	} {
		cmd := &exec.Cmd{Path: self, Args: []string{PauseName, tc.named}, Env: pause.Env(70031)}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		proc := fmt.Sprintf("/proc/%d/ns/net", cmd.Process.Pid)
		want := tc.want
		if want == "" {
			want = proc
		}
		// The pause process names its namespace from its start.
		deadline := time.Now().Add(10 * time.Second)
		got := podNetns(proc)
		for got != want && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
			got = podNetns(proc)
		}
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		if got != want {
			t.Errorf("podNetns(%s) naming %s = %q, want %q", proc, tc.named, got, want)
		}
	}
	for _, p := range []string{"/run/netns/x", "/proc/self/ns/net", "/proc/1/x/ns/net", ""} {
		if got := podNetns(p); got != p {
			t.Errorf("podNetns(%q) = %q, want it as is", p, got)
		}
	}
}

// TestRecordReleasesPodClaim checks that the delete action, through the
// task record, gives back the pod claim of a VM whose shim died.
func TestRecordReleasesPodClaim(t *testing.T) {
	dir := t.TempDir()
	sandbox, bundle := filepath.Join(dir, "sb"), filepath.Join(dir, "vm1")
	for _, d := range []string{sandbox, bundle} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := writePodState(sandbox, podState{VM: "vm1"}); err != nil {
		t.Fatal(err)
	}
	rec := &Record{ID: "vm1", Bundle: bundle, Pod: sandbox}
	if err := rec.save(); err != nil {
		t.Fatal(err)
	}
	saved, err := ReadRecord(bundle)
	if err != nil {
		t.Fatal(err)
	}
	saved.Release(context.Background())
	if st, ok, err := readPodState(sandbox); err != nil || !ok || st.VM != "" {
		t.Fatalf("pod state %+v, %v, %v after release; want no VM", st, ok, err)
	}
}

// A sandbox runs vmshim-pause when it is installed next to the shim, the
// shim itself otherwise.
func TestPauseBinary(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if got, err := pauseBinary(); err != nil || got != self {
		t.Fatalf("pauseBinary() = %q, %v; want the shim itself, %q", got, err, self)
	}
	p := filepath.Join(filepath.Dir(self), PauseName)
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Skipf("cannot write next to the test binary: %v", err)
	}
	t.Cleanup(func() { os.Remove(p) })
	if got, _ := pauseBinary(); got != self {
		t.Errorf("pauseBinary() = %q, want the shim: %s is not executable", got, p)
	}
	if err := os.Chmod(p, 0o755); err != nil {
		t.Fatal(err)
	}
	if got, _ := pauseBinary(); got != p {
		t.Errorf("pauseBinary() = %q, want %q", got, p)
	}
}
