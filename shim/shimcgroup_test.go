package shim

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

func TestShimCgroupPath(t *testing.T) {
	sandbox := map[string]string{containerTypeAnnotation: "sandbox"}
	for _, tc := range []struct {
		name   string
		annots map[string]string
		path   string
		noLin  bool
		want   string
		err    bool
	}{
		{name: "cgroupfs pod", annots: sandbox, path: "/kubepods/burstable/pod1/sb", want: "/kubepods/burstable/pod1/vmshim-shim-sb"},
		{name: "cgroupfs relative", annots: sandbox, path: "kubepods/pod1/sb", want: "/kubepods/pod1/vmshim-shim-sb"},
		{
			name: "systemd pod", annots: sandbox, path: "kubepods-burstable-pod1.slice:cri-containerd:sb",
			want: "kubepods-burstable-pod1.slice:vmshim-shim:sb",
		},
		{name: "below the root", annots: sandbox, path: "/sb"},
		{name: "root slice", annots: sandbox, path: "-.slice:cri-containerd:sb"},
		{name: "no cgroups path", annots: sandbox},
		{name: "no linux section", annots: sandbox, noLin: true},
		{name: "container, not sandbox", annots: map[string]string{containerTypeAnnotation: "container"}, path: "/kubepods/pod1/c"},
		{name: "ctr task", path: "/default/c"},
		{name: "invalid", annots: sandbox, path: "a.slice:p", err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := &specs.Spec{Annotations: tc.annots}
			if !tc.noLin {
				spec.Linux = &specs.Linux{CgroupsPath: tc.path}
			}
			got, err := shimCgroupPath("sb", spec)
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

// checkShimCgroupFile checks what the bundle's shimCgroupFile names ("" for no file).
func checkShimCgroupFile(t *testing.T, bundle, want string) {
	t.Helper()
	got, err := readShimCgroup(bundle)
	if err != nil || got != want {
		t.Fatalf("%s names %q, %v; want %q", shimCgroupFile, got, err, want)
	}
}

func TestShimCgroupV1FakeTree(t *testing.T) {
	skipCgroupUnlessRoot(t, "containerd/cgroups creates missing control files with mode 0, which only root can reopen")
	h := fakeV1Host(t)
	ctx := context.Background()
	bundle := t.TempDir()
	const raw = "/kubepods/pod1/vmshim-shim-sb"
	s, err := newShimCgroup(ctx, h, bundle, raw)
	if err != nil {
		t.Fatal(err)
	}
	checkShimCgroupFile(t, bundle, raw)
	if err := s.cg.Add(4242); err != nil {
		t.Fatal(err)
	}
	checkCgroupFile(t, filepath.Join(h.root, "memory", "kubepods", "pod1", "vmshim-shim-sb", "cgroup.procs"), "4242")

	// The shim leaves for the root of every hierarchy.
	if err := h.moveToRoot(4242); err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"cpu", "cpuacct", "memory", "pids", "freezer", "cpuset"} {
		checkCgroupFile(t, filepath.Join(h.root, c, "cgroup.procs"), "4242")
		writeCgroupFile(t, filepath.Join(h.root, c, "kubepods", "pod1", "vmshim-shim-sb", "cgroup.procs"), "")
	}
	// The shim was OOM-killed in it: the delete action still removes it.
	writeCgroupFile(t, filepath.Join(h.root, "memory", "kubepods", "pod1", "vmshim-shim-sb", "memory.oom_control"), "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")
	if err := removeShimCgroup(ctx, h, bundle); err != nil {
		t.Fatal(err)
	}
	checkCgroupGone(t, filepath.Join(h.root, "memory", "kubepods", "pod1", "vmshim-shim-sb"), filepath.Join(bundle, shimCgroupFile))
	// The pod's cgroup stays: it is the kubelet's.
	if _, err := os.Stat(filepath.Join(h.root, "memory", "kubepods", "pod1")); err != nil {
		t.Errorf("pod cgroup: %v", err)
	}
	if err := removeShimCgroup(ctx, h, bundle); err != nil {
		t.Fatalf("second delete: %v", err)
	}

	// A cgroup that cannot be made leaves no file naming it.
	writeCgroupFile(t, filepath.Join(h.root, "pids", "bad"), "not a directory")
	if _, err := newShimCgroup(ctx, h, bundle, "/bad/vmshim-shim-sb"); err == nil || !strings.Contains(err.Error(), "/bad/vmshim-shim-sb") {
		t.Fatalf("create over a file: %v", err)
	}
	checkCgroupGone(t, filepath.Join(bundle, shimCgroupFile), filepath.Join(h.root, "memory", "bad"))
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
	s, err := newShimCgroup(ctx, h, bundle, raw)
	if err != nil {
		t.Fatal(err)
	}
	// A leaf of the pod's cgroup, charged for memory.
	checkCgroupFile(t, filepath.Join(h.root, "kubepods", "pod1", "cgroup.subtree_control"), "+memory")
	if err := s.cg.Add(4242); err != nil {
		t.Fatal(err)
	}
	checkCgroupFile(t, filepath.Join(dir, "cgroup.procs"), "4242")
	if err := h.moveToRoot(4242); err != nil {
		t.Fatal(err)
	}
	checkCgroupFile(t, filepath.Join(h.root, "cgroup.procs"), "4242")
	writeCgroupFile(t, filepath.Join(dir, "cgroup.procs"), "")
	if err := removeShimCgroupAt(ctx, h, raw); err != nil {
		t.Fatal(err)
	}
	checkCgroupGone(t, dir)
	// The file goes with the bundle; the delete action finds nothing left.
	if err := removeShimCgroup(ctx, h, bundle); err != nil {
		t.Fatal(err)
	}
	checkCgroupGone(t, filepath.Join(bundle, shimCgroupFile))
}

func TestShimCgroupSystemd(t *testing.T) {
	skipCgroupUnlessRoot(t, "containerd/cgroups creates missing control files with mode 0, which only root can reopen")
	h, units := fakeV2Host(t)
	ctx := context.Background()
	bundle := t.TempDir()
	const raw = "kubepods-pod1.slice:vmshim-shim:sb"
	s, err := newShimCgroup(ctx, h, bundle, raw)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sleep", "600")
	if err := s.start(cmd); err != nil {
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
	if err := removeShimCgroup(ctx, h, bundle); err != nil {
		t.Fatal(err)
	}
	if got := units.callList(); len(got) != 2 || got[1] != "stop vmshim-shim-sb.scope" {
		t.Errorf("calls %q", got)
	}
	checkCgroupGone(t, dir, filepath.Join(bundle, shimCgroupFile))

	// systemd refuses the scope: the shim process does not stay.
	units.startErr = errors.New("unit exists")
	s, err = newShimCgroup(ctx, h, bundle, raw)
	if err != nil {
		t.Fatal(err)
	}
	cmd = exec.Command("sleep", "600")
	if err := s.start(cmd); err == nil || !strings.Contains(err.Error(), "unit exists") {
		t.Fatalf("start with systemd refusing: %v", err)
	}
	if cmd.ProcessState == nil {
		t.Error("the shim process was left running")
	}
	if err := s.remove(); err != nil {
		t.Fatal(err)
	}
	checkCgroupGone(t, filepath.Join(bundle, shimCgroupFile))
}

// TestShimCgroupV1Real starts a process as the start action starts the
// shim, on this machine's cgroup v1 hierarchies, and checks that its
// memory cgroup is inside the pod's from the start, then removes it.
func TestShimCgroupV1Real(t *testing.T) {
	skipUnlessCgroupV1(t)
	ctx := context.Background()
	h := defaultCgroupHost()
	pod := fmt.Sprintf("/vmshimt%08x/pod1", rand.Uint32())
	t.Cleanup(func() {
		dirs, _ := filepath.Glob(filepath.Join(cgroupRoot, "*", pod))
		for _, d := range dirs {
			_ = os.Remove(d)
			_ = os.Remove(filepath.Dir(d))
		}
	})
	spec := &specs.Spec{
		Annotations: map[string]string{containerTypeAnnotation: "sandbox"},
		Linux:       &specs.Linux{CgroupsPath: pod + "/sb"},
	}
	raw, err := shimCgroupPath("sb", spec)
	if err != nil || raw != pod+"/vmshim-shim-sb" {
		t.Fatalf("shim cgroup %q, %v", raw, err)
	}
	bundle := t.TempDir()
	s, err := newShimCgroup(ctx, h, bundle, raw)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sleep", "600")
	if err := s.start(cmd); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	for _, c := range []string{"memory", "pids", "cpu"} {
		if got := memoryCgroupOf(t, cmd.Process.Pid, c); got != raw {
			t.Errorf("%s cgroup of the process: %q, want %q", c, got, raw)
		}
	}
	// A busy cgroup stays, and so does the file naming it.
	if err := removeShimCgroupAt(ctx, h, raw); err == nil {
		t.Fatal("removed a cgroup with a process in it")
	}
	// Leaving for the root empties it.
	if err := h.moveToRoot(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if got := memoryCgroupOf(t, cmd.Process.Pid, "memory"); got != "/" {
		t.Errorf("memory cgroup after leaving: %q", got)
	}
	if err := removeShimCgroup(ctx, h, bundle); err != nil {
		t.Fatal(err)
	}
	checkCgroupGone(t, filepath.Join(cgroupRoot, "memory", raw), filepath.Join(bundle, shimCgroupFile))
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
	if n := oomKillCount(dir); n != 0 {
		t.Errorf("no files: %d", n)
	}
	if n := oomKillCount(""); n != 0 {
		t.Errorf("no directory: %d", n)
	}
	writeCgroupFile(t, filepath.Join(dir, "memory.oom_control"), "oom_kill_disable 0\nunder_oom 0\noom_kill 4\n")
	if n := oomKillCount(dir); n != 4 {
		t.Errorf("v1: %d", n)
	}
	writeCgroupFile(t, filepath.Join(dir, "memory.events"), "low 0\nhigh 0\nmax 9\noom 2\noom_kill 1\noom_group_kill 0\n")
	if n := oomKillCount(dir); n != 1 {
		t.Errorf("v2: %d", n)
	}
	writeCgroupFile(t, filepath.Join(dir, "memory.events"), "oom_kill x\n")
	if n := oomKillCount(dir); n != 0 {
		t.Errorf("garbled: %d", n)
	}
}

func TestRaiseOOMScoreAdj(t *testing.T) {
	cmd := startSleep(t)
	pid := cmd.Process.Pid
	file := fmt.Sprintf("/proc/%d/oom_score_adj", pid)
	if err := os.WriteFile(file, []byte("100"), 0); err != nil {
		t.Fatal(err)
	}
	adj := func(v int) *specs.Spec { return &specs.Spec{Process: &specs.Process{OOMScoreAdj: &v}} }
	for _, tc := range []struct {
		spec *specs.Spec
		want string
	}{
		{spec: &specs.Spec{}, want: "100"},
		{spec: &specs.Spec{Process: &specs.Process{}}, want: "100"},
		{spec: adj(-998), want: "100"}, // never lowered
		{spec: adj(100), want: "100"},
		{spec: adj(999), want: "999"},
		{spec: adj(500), want: "999"},
	} {
		if err := raiseOOMScoreAdj(pid, tc.spec); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(file)
		if err != nil || strings.TrimSpace(string(b)) != tc.want {
			t.Fatalf("oom_score_adj %q, %v; want %s", b, err, tc.want)
		}
	}
	if err := raiseOOMScoreAdj(1<<22+1, adj(1)); err == nil || strings.Contains(err.Error(), "\n") {
		t.Errorf("missing process: %v", err)
	}
}

func TestReadShimCgroup(t *testing.T) {
	bundle := t.TempDir()
	checkShimCgroupFile(t, bundle, "")
	for _, bad := range []string{"{", `{"cgroup":""}`, `{"cgroup":"/"}`, `{"cgroup":"a:b"}`} {
		writeCgroupFile(t, filepath.Join(bundle, shimCgroupFile), bad)
		if got, err := readShimCgroup(bundle); err == nil || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: got %q, %v; want a one-line error", bad, got, err)
		}
	}
}

// TestShimOOMKilledTasks checks which VM the delete actions of a pod
// whose shim was OOM-killed report, from the sandbox's bundle and from
// the VM's record, and that nothing is reported when the shim was not.
func TestShimOOMKilledTasks(t *testing.T) {
	skipCgroupUnlessRoot(t, "containerd/cgroups creates missing control files with mode 0, which only root can reopen")
	h := fakeV1Host(t)
	ctx := context.Background()
	bundles := t.TempDir()
	sandbox, vmBundle := filepath.Join(bundles, "sb"), filepath.Join(bundles, "vm")
	for _, b := range []string{sandbox, vmBundle} {
		if err := os.Mkdir(b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	const raw = "/kubepods/pod1/vmshim-shim-sb"
	if _, err := newShimCgroup(ctx, h, sandbox, raw); err != nil {
		t.Fatal(err)
	}
	if err := writePodState(sandbox, podState{VM: "vm"}); err != nil {
		t.Fatal(err)
	}
	vmRec := &record{ID: "vm", Bundle: vmBundle, Pod: sandbox}
	check := func(what string, got []string, want ...string) {
		t.Helper()
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: reported %q, want %q", what, got, want)
		}
	}
	oomControl := filepath.Join(h.root, "memory", "kubepods", "pod1", "vmshim-shim-sb", "memory.oom_control")
	writeCgroupFile(t, oomControl, "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")
	check("sandbox, no OOM kill", shimOOMKilledTasks(ctx, h, sandbox, "sb", nil))
	check("vm, no OOM kill", shimOOMKilledTasks(ctx, h, vmBundle, "vm", vmRec))

	writeCgroupFile(t, oomControl, "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")
	check("sandbox", shimOOMKilledTasks(ctx, h, sandbox, "sb", nil), "vm")
	check("vm", shimOOMKilledTasks(ctx, h, vmBundle, "vm", vmRec), "vm")
	check("a task of no pod", shimOOMKilledTasks(ctx, h, vmBundle, "vm", &record{ID: "vm", Bundle: vmBundle}))
	check("no record", shimOOMKilledTasks(ctx, h, vmBundle, "vm", nil))

	// The VM released its claim first: the sandbox has no VM to report.
	if err := writePodState(sandbox, podState{}); err != nil {
		t.Fatal(err)
	}
	check("sandbox after the VM's delete", shimOOMKilledTasks(ctx, h, sandbox, "sb", nil))
	// The sandbox's delete removed the cgroup first: nothing left to read.
	for _, c := range []string{"cpu", "cpuacct", "memory", "pids", "freezer", "cpuset"} {
		writeCgroupFile(t, filepath.Join(h.root, c, "kubepods", "pod1", "vmshim-shim-sb", "cgroup.procs"), "")
	}
	if err := removeShimCgroup(ctx, h, sandbox); err != nil {
		t.Fatal(err)
	}
	check("vm after the sandbox's delete", shimOOMKilledTasks(ctx, h, vmBundle, "vm", vmRec))
}
