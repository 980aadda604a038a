package cgroup

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func TestSibling(t *testing.T) {
	for _, tc := range []struct {
		name, path, want string
		err              bool
	}{
		{name: "cgroupfs pod", path: "/kubepods/burstable/pod1/sb", want: "/kubepods/burstable/pod1/vmshim-shim-sb"},
		{name: "cgroupfs relative", path: "kubepods/pod1/sb", want: "/kubepods/pod1/vmshim-shim-sb"},
		{name: "systemd pod", path: "kubepods-burstable-pod1.slice:cri-containerd:sb", want: "kubepods-burstable-pod1.slice:vmshim-shim:sb"},
		{name: "below the root", path: "/sb"},
		{name: "root slice", path: "-.slice:cri-containerd:sb"},
		{name: "invalid", path: "a.slice:p", err: true},
		{name: "empty", path: "", err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Sibling(tc.path, ShimName, "sb")
			if tc.err {
				if err == nil || !strings.Contains(err.Error(), tc.path) {
					t.Fatalf("got %q, %v; want an error naming %q", got, err, tc.path)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// shimCgroup makes the shim's cgroup as StartShim does, with no process
// started in it: the fake trees have no cgroups to fork into.
func shimCgroup(ctx context.Context, h Host, bundle, raw string) (Cgroup, error) {
	if err := noteShim(bundle, raw); err != nil {
		return nil, err
	}
	cg, err := h.Create(ctx, raw, &specs.LinuxResources{Memory: &specs.LinuxMemory{}})
	if err != nil {
		_ = os.Remove(filepath.Join(bundle, ShimFile))
	}
	return cg, err
}

// checkShimCgroupFile checks what the bundle's ShimFile names ("" for no file).
func checkShimCgroupFile(t *testing.T, bundle, want string) {
	t.Helper()
	got, err := ReadShim(bundle)
	if err != nil || got != want {
		t.Fatalf("%s names %q, %v; want %q", ShimFile, got, err, want)
	}
}

func TestShimCgroupV1FakeTree(t *testing.T) {
	skipCgroupUnlessRoot(t, "containerd/cgroups creates missing control files with mode 0, which only root can reopen")
	h := fakeV1Host(t)
	ctx := context.Background()
	bundle := t.TempDir()
	const raw = "/kubepods/pod1/vmshim-shim-sb"
	cg, err := shimCgroup(ctx, h, bundle, raw)
	if err != nil {
		t.Fatal(err)
	}
	checkShimCgroupFile(t, bundle, raw)
	if err := cg.Add(4242); err != nil {
		t.Fatal(err)
	}
	checkCgroupFile(t, filepath.Join(h.root, "memory", "kubepods", "pod1", "vmshim-shim-sb", "cgroup.procs"), "4242")

	// The shim leaves for the root of every hierarchy.
	if err := h.MoveToRoot(4242); err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"cpu", "cpuacct", "memory", "pids", "freezer", "cpuset"} {
		checkCgroupFile(t, filepath.Join(h.root, c, "cgroup.procs"), "4242")
		writeCgroupFile(t, filepath.Join(h.root, c, "kubepods", "pod1", "vmshim-shim-sb", "cgroup.procs"), "")
	}
	// The shim was OOM-killed in it: the delete action still removes it.
	writeCgroupFile(t, filepath.Join(h.root, "memory", "kubepods", "pod1", "vmshim-shim-sb", "memory.oom_control"), "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")
	if err := h.RemoveShim(ctx, bundle); err != nil {
		t.Fatal(err)
	}
	checkCgroupGone(t, filepath.Join(h.root, "memory", "kubepods", "pod1", "vmshim-shim-sb"), filepath.Join(bundle, ShimFile))
	// The pod's cgroup stays: it is the kubelet's.
	if _, err := os.Stat(filepath.Join(h.root, "memory", "kubepods", "pod1")); err != nil {
		t.Errorf("pod cgroup: %v", err)
	}
	if err := h.RemoveShim(ctx, bundle); err != nil {
		t.Fatalf("second delete: %v", err)
	}

	// A cgroup that cannot be made leaves no file naming it.
	writeCgroupFile(t, filepath.Join(h.root, "pids", "bad"), "not a directory")
	if err := h.StartShim(ctx, bundle, "/bad/vmshim-shim-sb", exec.Command("true")); err == nil || !strings.Contains(err.Error(), "/bad/vmshim-shim-sb") {
		t.Fatalf("create over a file: %v", err)
	}
	checkCgroupGone(t, filepath.Join(bundle, ShimFile), filepath.Join(h.root, "memory", "bad"))
}

func TestShimCgroupV2FakeTree(t *testing.T) {
	skipCgroupUnlessRoot(t, "containerd/cgroups creates missing control files with mode 0, which only root can reopen")
	h, _ := fakeV2Host(t)
	ctx := context.Background()
	bundle := t.TempDir()
	writeCgroupFile(t, filepath.Join(h.root, "kubepods", "cgroup.subtree_control"), "")
	writeCgroupFile(t, filepath.Join(h.root, "kubepods", "pod1", "cgroup.subtree_control"), "")
	const raw = "/kubepods/pod1/vmshim-shim-sb"
	dir := filepath.Join(h.root, "kubepods", "pod1", "vmshim-shim-sb")
	cg, err := shimCgroup(ctx, h, bundle, raw)
	if err != nil {
		t.Fatal(err)
	}
	// A leaf of the pod's cgroup, charged for memory.
	checkCgroupFile(t, filepath.Join(h.root, "kubepods", "pod1", "cgroup.subtree_control"), "+memory")
	if err := cg.Add(4242); err != nil {
		t.Fatal(err)
	}
	checkCgroupFile(t, filepath.Join(dir, "cgroup.procs"), "4242")
	if err := h.MoveToRoot(4242); err != nil {
		t.Fatal(err)
	}
	checkCgroupFile(t, filepath.Join(h.root, "cgroup.procs"), "4242")
	writeCgroupFile(t, filepath.Join(dir, "cgroup.procs"), "")
	if err := h.removeShimAt(ctx, raw); err != nil {
		t.Fatal(err)
	}
	checkCgroupGone(t, dir)
	// The file goes with the bundle; the delete action finds nothing left.
	if err := h.RemoveShim(ctx, bundle); err != nil {
		t.Fatal(err)
	}
	checkCgroupGone(t, filepath.Join(bundle, ShimFile))
}

func TestShimCgroupSystemd(t *testing.T) {
	skipCgroupUnlessRoot(t, "containerd/cgroups creates missing control files with mode 0, which only root can reopen")
	h, units := fakeV2Host(t)
	ctx := context.Background()
	bundle := t.TempDir()
	const raw = "kubepods-pod1.slice:vmshim-shim:sb"
	cmd := exec.Command("sleep", "600")
	if err := h.StartShim(ctx, bundle, raw, cmd); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	want := []string{fmt.Sprintf("start kubepods-pod1.slice vmshim-shim-sb.scope %d", cmd.Process.Pid)}
	if got := units.callList(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("calls %q, want %q", got, want)
	}
	if props := propString(units.props[0]); !strings.Contains(props, "CollectMode") || !strings.Contains(props, "inactive-or-failed") {
		t.Errorf("scope properties %s: systemd would keep a failed shim's scope", props)
	}
	dir := filepath.Join(h.root, "kubepods.slice", "kubepods-pod1.slice", "vmshim-shim-sb.scope")
	checkCgroupFile(t, filepath.Join(dir, "cgroup.procs"), strconv.Itoa(cmd.Process.Pid))

	// The shim is gone; the delete action stops the scope.
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if err := h.RemoveShim(ctx, bundle); err != nil {
		t.Fatal(err)
	}
	if got := units.callList(); len(got) != 2 || got[1] != "stop vmshim-shim-sb.scope" {
		t.Errorf("calls %q", got)
	}
	checkCgroupGone(t, dir, filepath.Join(bundle, ShimFile))

	// systemd refuses the scope: the shim process does not stay.
	units.startErr = errors.New("unit exists")
	cmd = exec.Command("sleep", "600")
	if err := h.StartShim(ctx, bundle, raw, cmd); err == nil || !strings.Contains(err.Error(), "unit exists") {
		t.Fatalf("start with systemd refusing: %v", err)
	}
	if cmd.ProcessState == nil {
		t.Error("the shim process was left running")
	}
	checkCgroupGone(t, filepath.Join(bundle, ShimFile))
}

// TestShimCgroupV1Real starts a process as the start action starts the
// shim, on this machine's cgroup v1 hierarchies, and checks that its
// memory cgroup is inside the pod's from the start, then removes it.
func TestShimCgroupV1Real(t *testing.T) {
	skipUnlessCgroupV1(t)
	ctx := context.Background()
	h := NewHost(nil)
	pod := fmt.Sprintf("/vmshimt%08x/pod1", rand.Uint32())
	t.Cleanup(func() {
		dirs, _ := filepath.Glob(filepath.Join(cgroupRoot, "*", pod))
		for _, d := range dirs {
			_ = os.Remove(d)
			_ = os.Remove(filepath.Dir(d))
		}
	})
	raw, err := Sibling(pod+"/sb", ShimName, "sb")
	if err != nil || raw != pod+"/vmshim-shim-sb" {
		t.Fatalf("shim cgroup %q, %v", raw, err)
	}
	bundle := t.TempDir()
	cmd := exec.Command("sleep", "600")
	if err := h.StartShim(ctx, bundle, raw, cmd); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	for _, c := range []string{"memory", "pids", "cpu"} {
		if got := memoryCgroupOf(t, cmd.Process.Pid, c); got != raw {
			t.Errorf("%s cgroup of the process: %q, want %q", c, got, raw)
		}
	}
	// A busy cgroup stays, and so does the file naming it.
	if err := h.removeShimAt(ctx, raw); err == nil {
		t.Fatal("removed a cgroup with a process in it")
	}
	// Leaving for the root empties it.
	if err := h.MoveToRoot(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if got := memoryCgroupOf(t, cmd.Process.Pid, "memory"); got != "/" {
		t.Errorf("memory cgroup after leaving: %q", got)
	}
	if err := h.RemoveShim(ctx, bundle); err != nil {
		t.Fatal(err)
	}
	checkCgroupGone(t, filepath.Join(cgroupRoot, "memory", raw), filepath.Join(bundle, ShimFile))
}

// memoryCgroupOf returns pid's cgroup in a v1 controller's hierarchy.
func memoryCgroupOf(t *testing.T, pid int, controller string) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 && strings.Contains(","+parts[1]+",", ","+controller+",") {
			return parts[2]
		}
	}
	t.Fatalf("no %s cgroup for %d: %s", controller, pid, b)
	return ""
}

func TestOOMKillCount(t *testing.T) {
	dir := t.TempDir()
	if n := OOMKillCount(dir); n != 0 {
		t.Errorf("no files: %d", n)
	}
	if n := OOMKillCount(""); n != 0 {
		t.Errorf("no directory: %d", n)
	}
	writeCgroupFile(t, filepath.Join(dir, "memory.oom_control"), "oom_kill_disable 0\nunder_oom 0\noom_kill 4\n")
	if n := OOMKillCount(dir); n != 4 {
		t.Errorf("v1: %d", n)
	}
	writeCgroupFile(t, filepath.Join(dir, "memory.events"), "low 0\nhigh 0\nmax 9\noom 2\noom_kill 1\noom_group_kill 0\n")
	if n := OOMKillCount(dir); n != 1 {
		t.Errorf("v2: %d", n)
	}
	writeCgroupFile(t, filepath.Join(dir, "memory.events"), "oom_kill x\n")
	if n := OOMKillCount(dir); n != 0 {
		t.Errorf("garbled: %d", n)
	}
}

func TestReadShimCgroup(t *testing.T) {
	bundle := t.TempDir()
	checkShimCgroupFile(t, bundle, "")
	for _, bad := range []string{"{", `{"cgroup":""}`, `{"cgroup":"/"}`, `{"cgroup":"a:b"}`} {
		writeCgroupFile(t, filepath.Join(bundle, ShimFile), bad)
		if got, err := ReadShim(bundle); err == nil || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: got %q, %v; want a one-line error", bad, got, err)
		}
	}
}
