package cgroup

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/cgroups/v3"
	cgroup1stats "github.com/containerd/cgroups/v3/cgroup1/stats"
	cgroup2stats "github.com/containerd/cgroups/v3/cgroup2/stats"
	"github.com/containerd/errdefs"
	sddbus "github.com/coreos/go-systemd/v22/dbus"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// waitTimeout bounds the waits of these tests.
const waitTimeout = 5 * time.Second

func TestCgroupParsePath(t *testing.T) {
	for _, tc := range []struct {
		raw   string
		dir   string
		slice string
		unit  string
		err   bool
	}{
		{raw: "/kubepods/burstable/pod1/abc", dir: "/kubepods/burstable/pod1/abc"},
		{raw: "/default/abc", dir: "/default/abc"},
		{raw: "default/abc", dir: "/default/abc"},
		{raw: "/a/../../b/", dir: "/b"},
		{
			raw:   "kubepods-burstable-pod1.slice:cri-containerd:abc",
			dir:   "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice/cri-containerd-abc.scope",
			slice: "kubepods-burstable-pod1.slice", unit: "cri-containerd-abc.scope",
		},
		{raw: "system.slice:docker:x", dir: "/system.slice/docker-x.scope", slice: "system.slice", unit: "docker-x.scope"},
		{raw: "machine.slice::x", dir: "/machine.slice/x.scope", slice: "machine.slice", unit: "x.scope"},
		{raw: "-.slice:p:x", dir: "/p-x.scope", slice: "-.slice", unit: "p-x.scope"},
		{raw: "", err: true},
		{raw: "/", err: true},
		{raw: "/..", err: true},
		{raw: "a.slice:p", err: true},
		{raw: "a.slice:p:x:y", err: true},
		{raw: "a.slice:p:", err: true},
		{raw: "kubepods:cri-containerd:abc", err: true},
		{raw: ".slice:p:x", err: true},
		{raw: ":p:x", err: true},
		{raw: "a--b.slice:p:x", err: true},
		{raw: "a-.slice:p:x", err: true},
		{raw: "a/b.slice:p:x", err: true},
		{raw: "a.slice:p/q:x", err: true},
	} {
		t.Run(tc.raw, func(t *testing.T) {
			p, err := parsePath(tc.raw)
			if tc.err {
				if !errdefs.IsInvalidArgument(err) {
					t.Fatalf("got %+v, %v; want invalid argument", p, err)
				}
				if !strings.Contains(err.Error(), fmt.Sprintf("%q", tc.raw)) {
					t.Errorf("error %q does not name the path", err)
				}
				return
			}
			want := cgPath{raw: tc.raw, dir: tc.dir, slice: tc.slice, unit: tc.unit}
			if err != nil || p != want {
				t.Fatalf("got %+v, %v; want %+v", p, err, want)
			}
		})
	}
}

func TestCgroupDriver(t *testing.T) {
	const fsPath, sdPath = "/kubepods/pod1/abc", "kubepods.slice:cri-containerd:abc"
	for _, tc := range []struct {
		name    string
		mode    cgroups.CGMode
		systemd bool
		path    string
		want    driver
		class   func(error) bool
		msg     string
	}{
		{name: "v2 cgroupfs", mode: cgroups.Unified, path: fsPath, want: cgroupfsV2},
		{name: "v2 systemd", mode: cgroups.Unified, systemd: true, path: sdPath, want: systemdV2},
		{name: "v1 systemd", mode: cgroups.Hybrid, systemd: true, path: sdPath, want: systemdV1},
		{name: "hybrid cgroupfs", mode: cgroups.Hybrid, path: fsPath, want: cgroupfsV1},
		{name: "legacy cgroupfs", mode: cgroups.Legacy, systemd: true, path: fsPath, want: cgroupfsV1},
		{
			name: "systemd absent", mode: cgroups.Hybrid, path: sdPath, class: errdefs.IsFailedPrecondition,
			msg: "cgroup path " + sdPath + " uses the systemd cgroup driver, but systemd is not running",
		},
		{name: "no cgroups", mode: cgroups.Unavailable, path: fsPath, class: errdefs.IsFailedPrecondition, msg: fsPath},
		{name: "invalid", mode: cgroups.Unified, path: "a:b", class: errdefs.IsInvalidArgument, msg: "a:b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := Host{
				mode:    func() cgroups.CGMode { return tc.mode },
				root:    t.TempDir(),
				systemd: func() bool { return tc.systemd },
			}
			_, d, err := h.resolve(tc.path)
			if tc.class != nil {
				if !tc.class(err) || !strings.Contains(err.Error(), tc.msg) {
					t.Fatalf("got %v, %v; want error class %s containing %q", d, err, tc.name, tc.msg)
				}
				if _, err := h.Create(context.Background(), tc.path, nil); !tc.class(err) {
					t.Fatalf("create: got %v", err)
				}
				return
			}
			if err != nil || d != tc.want {
				t.Fatalf("got %v, %v; want %v", d, err, tc.want)
			}
		})
	}
}

// fakeUnits plays systemd: a started scope's directory appears under root
// (with a cgroup.subtree_control in each new parent, as on cgroup v2).
type fakeUnits struct {
	root     string
	startErr error

	mu    sync.Mutex // guards calls, props and dirs
	calls []string
	props [][]sddbus.Property // of each start and set call
	dirs  map[string]string   // unit -> directory
}

func (u *fakeUnits) startScope(_ context.Context, slice, unit string, pid int, res []sddbus.Property) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.calls = append(u.calls, fmt.Sprintf("start %s %s %d", slice, unit, pid))
	u.props = append(u.props, res)
	if u.startErr != nil {
		return u.startErr
	}
	sliceDir, err := expandSlice(slice)
	if err != nil {
		return err
	}
	dir := filepath.Join(u.root, sliceDir)
	if err := os.MkdirAll(filepath.Join(dir, unit), 0o755); err != nil {
		return err
	}
	for d := dir; d != u.root; d = filepath.Dir(d) {
		if err := os.WriteFile(filepath.Join(d, "cgroup.subtree_control"), nil, 0o644); err != nil {
			return err
		}
	}
	u.dirs[unit] = filepath.Join(dir, unit)
	return os.WriteFile(filepath.Join(dir, unit, "cgroup.procs"), []byte(strconv.Itoa(pid)+"\n"), 0o644)
}

func (u *fakeUnits) setProperties(_ context.Context, unit string, res []sddbus.Property) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.calls = append(u.calls, "set "+unit)
	u.props = append(u.props, res)
	return nil
}

func (u *fakeUnits) stopUnit(_ context.Context, unit string) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.calls = append(u.calls, "stop "+unit)
	if dir, ok := u.dirs[unit]; ok {
		delete(u.dirs, unit)
		return os.RemoveAll(dir)
	}
	return nil
}

func (u *fakeUnits) callList() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.calls...)
}

// fakeV2Host is a cgroup v2 host whose hierarchy is a directory tree in a
// temporary directory.
func fakeV2Host(t *testing.T) (Host, *fakeUnits) {
	t.Helper()
	root := t.TempDir()
	writeCgroupFile(t, filepath.Join(root, "cgroup.controllers"), "cpuset cpu io memory hugetlb pids rdma misc")
	writeCgroupFile(t, filepath.Join(root, "cgroup.subtree_control"), "")
	units := &fakeUnits{root: root, dirs: map[string]string{}}
	return Host{
		mode:    func() cgroups.CGMode { return cgroups.Unified },
		root:    root,
		systemd: func() bool { return true },
		units:   units,
	}, units
}

func writeCgroupFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func checkCgroupFile(t *testing.T, path, want string) {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(string(got)) != want {
		t.Errorf("%s = %q, want %q", path, got, want)
	}
}

func checkCgroupGone(t *testing.T, paths ...string) {
	t.Helper()
	for _, p := range paths {
		if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s still exists (%v)", p, err)
		}
	}
}

func testCgroupResources(mem int64, quota int64) *specs.LinuxResources {
	period := uint64(100000)
	return &specs.LinuxResources{
		Memory: &specs.LinuxMemory{Limit: &mem},
		CPU:    &specs.LinuxCPU{Quota: &quota, Period: &period},
	}
}

func TestCgroupV2FakeTree(t *testing.T) {
	skipCgroupUnlessRoot(t, "containerd/cgroups creates missing control files with mode 0, which only root can reopen")
	h, _ := fakeV2Host(t)
	ctx := context.Background()

	// The parent's cgroup.subtree_control is missing: creation fails and
	// the directories it made are removed.
	writeCgroupFile(t, filepath.Join(h.root, "kubepods", "cgroup.subtree_control"), "")
	if _, err := h.Create(ctx, "/kubepods/pod1/abc", testCgroupResources(64<<20, 50000)); err == nil || !strings.Contains(err.Error(), "/kubepods/pod1/abc") {
		t.Fatalf("create without parent controls: %v", err)
	}
	checkCgroupGone(t, filepath.Join(h.root, "kubepods", "pod1"))

	writeCgroupFile(t, filepath.Join(h.root, "kubepods", "pod1", "cgroup.subtree_control"), "")
	cg, err := h.Create(ctx, "/kubepods/pod1/abc", testCgroupResources(64<<20, 50000))
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(h.root, "kubepods", "pod1", "abc")
	checkCgroupFile(t, filepath.Join(dir, "memory.max"), "67108864")
	checkCgroupFile(t, filepath.Join(dir, "cpu.max"), "50000 100000")
	checkCgroupFile(t, filepath.Join(h.root, "kubepods", "pod1", "cgroup.subtree_control"), "+cpu +memory")
	if cg.Path() != "/kubepods/pod1/abc" {
		t.Errorf("path %q", cg.Path())
	}

	if err := cg.Add(4242); err != nil {
		t.Fatal(err)
	}
	checkCgroupFile(t, filepath.Join(dir, "cgroup.procs"), "4242")
	if err := cg.Update(testCgroupResources(128<<20, 20000)); err != nil {
		t.Fatal(err)
	}
	checkCgroupFile(t, filepath.Join(dir, "memory.max"), "134217728")
	checkCgroupFile(t, filepath.Join(dir, "cpu.max"), "20000 100000")

	writeCgroupFile(t, filepath.Join(dir, "memory.current"), "1234\n")
	writeCgroupFile(t, filepath.Join(dir, "memory.stat"), "anon 1000\nfile 234\n")
	writeCgroupFile(t, filepath.Join(dir, "cpu.stat"), "usage_usec 77\n")
	st, err := cg.Stats()
	if err != nil {
		t.Fatal(err)
	}
	m, ok := st.(*cgroup2stats.Metrics)
	if !ok || m.GetMemory().GetUsage() != 1234 || m.GetMemory().GetAnon() != 1000 || m.GetCPU().GetUsageUsec() != 77 {
		t.Fatalf("stats %T %v", st, st)
	}

	// A process that never leaves: Delete gives up after a short wait.
	start := time.Now()
	if err := cg.Delete(); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "/kubepods/pod1/abc") {
		t.Fatalf("delete busy cgroup: %v", err)
	}
	if d := time.Since(start); d < cgroupDeleteTimeout || d > cgroupDeleteTimeout+2*time.Second {
		t.Errorf("delete waited %v", d)
	}

	// The process leaves while Delete waits.
	go func() {
		time.Sleep(200 * time.Millisecond)
		_ = os.WriteFile(filepath.Join(dir, "cgroup.procs"), nil, 0o644)
	}()
	if err := cg.Delete(); err != nil {
		t.Fatal(err)
	}
	checkCgroupGone(t, dir)
	if err := cg.Delete(); err != nil {
		t.Fatalf("second delete: %v", err)
	}
	if _, err := h.Load(ctx, "/kubepods/pod1/abc"); !errdefs.IsNotFound(err) {
		t.Fatalf("load deleted: %v", err)
	}
}

func TestCgroupV2Load(t *testing.T) {
	h, _ := fakeV2Host(t)
	writeCgroupFile(t, filepath.Join(h.root, "ns", "abc", "cgroup.procs"), "")
	cg, err := h.Load(context.Background(), "ns/abc")
	if err != nil {
		t.Fatal(err)
	}
	if err := cg.Delete(); err != nil {
		t.Fatal(err)
	}
	checkCgroupGone(t, filepath.Join(h.root, "ns", "abc"))
}

func TestCgroupV2Systemd(t *testing.T) {
	skipCgroupUnlessRoot(t, "containerd/cgroups creates missing control files with mode 0, which only root can reopen")
	h, units := fakeV2Host(t)
	const path = "kubepods-pod1.slice:cri-containerd:abc"
	dir := filepath.Join(h.root, "kubepods.slice", "kubepods-pod1.slice", "cri-containerd-abc.scope")
	cg, err := h.Create(context.Background(), path, testCgroupResources(64<<20, 50000))
	if err != nil {
		t.Fatal(err)
	}
	if len(units.callList()) != 0 {
		t.Fatalf("scope started before a process was added: %v", units.callList())
	}
	if _, err := cg.Stats(); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("stats before add: %v", err)
	}
	if err := cg.Update(testCgroupResources(96<<20, 30000)); err != nil {
		t.Fatal(err)
	}
	if err := cg.Add(4242); err != nil {
		t.Fatal(err)
	}
	checkCgroupFile(t, filepath.Join(dir, "memory.max"), strconv.Itoa(96<<20))
	checkCgroupFile(t, filepath.Join(dir, "cpu.max"), "30000 100000")
	checkCgroupFile(t, filepath.Join(dir, "cgroup.procs"), "4242")
	if err := cg.Update(testCgroupResources(128<<20, 20000)); err != nil {
		t.Fatal(err)
	}
	checkCgroupFile(t, filepath.Join(dir, "memory.max"), strconv.Itoa(128<<20))
	if _, err := cg.Stats(); err != nil {
		t.Fatal(err)
	}
	if err := cg.Delete(); err != nil {
		t.Fatal(err)
	}
	checkCgroupGone(t, dir)
	want := []string{"start kubepods-pod1.slice cri-containerd-abc.scope 4242", "set cri-containerd-abc.scope", "stop cri-containerd-abc.scope"}
	if got := units.callList(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("calls %q, want %q", got, want)
	}
	// systemd is told the limits too, so that a daemon-reload keeps them.
	wantProps := []string{
		"MemoryMax=t 100663296 CPUQuotaPerSecUSec=t 300000",
		"MemoryMax=t 134217728 CPUQuotaPerSecUSec=t 200000",
	}
	for i, props := range units.props {
		if got := propString(props); i >= len(wantProps) || got != wantProps[i] {
			t.Errorf("properties of call %d: %s", i, got)
		}
	}
}

// propString renders unit properties as NAME=TYPE VALUE, space-separated.
func propString(props []sddbus.Property) string {
	var parts []string
	for _, p := range props {
		parts = append(parts, fmt.Sprintf("%s=%s %v", p.Name, p.Value.Signature(), p.Value.Value()))
	}
	return strings.Join(parts, " ")
}

func TestScopeProperties(t *testing.T) {
	i64 := func(v int64) *int64 { return &v }
	u64 := func(v uint64) *uint64 { return &v }
	for _, tc := range []struct {
		name string
		r    *specs.LinuxResources
		v2   bool
		want string
	}{
		{"none", nil, true, ""},
		{"v2 all", &specs.LinuxResources{
			Memory: &specs.LinuxMemory{Limit: i64(512 << 20), Swap: i64(512 << 20)},
			CPU:    &specs.LinuxCPU{Shares: u64(1024), Quota: i64(150000), Period: u64(100000), Cpus: "0-2,9", Mems: "0"},
			Pids:   &specs.LinuxPids{Limit: i64(4096)},
		}, true, "MemoryMax=t 536870912 MemorySwapMax=t 0 CPUWeight=t 39 CPUQuotaPerSecUSec=t 1500000 " +
			"AllowedCPUs=ay [7 2] AllowedMemoryNodes=ay [1] TasksMax=t 4096"},
		{"v2 unlimited swap", &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: i64(1 << 30), Swap: i64(-1)}}, true,
			"MemoryMax=t 1073741824 MemorySwapMax=t 18446744073709551615"},
		{"v1", &specs.LinuxResources{
			Memory: &specs.LinuxMemory{Limit: i64(256 << 20)},
			CPU:    &specs.LinuxCPU{Shares: u64(512), Cpus: "1"},
		}, false, "MemoryLimit=t 268435456 CPUShares=t 512"},
		{"quota rounded up to 10ms", &specs.LinuxResources{CPU: &specs.LinuxCPU{Quota: i64(12345), Period: u64(100000)}}, true,
			"CPUQuotaPerSecUSec=t 130000"},
		{"period not the default", &specs.LinuxResources{CPU: &specs.LinuxCPU{Quota: i64(50000), Period: u64(50000)}}, true,
			"CPUQuotaPeriodUSec=t 50000 CPUQuotaPerSecUSec=t 1000000"},
		{"bad cpuset left to the files", &specs.LinuxResources{CPU: &specs.LinuxCPU{Cpus: "3-1"}}, true, ""},
	} {
		if got := propString(scopeProperties(tc.r, tc.v2)); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
}

func TestCgroupSystemdFailures(t *testing.T) {
	h, units := fakeV2Host(t)
	units.startErr = errors.New("no dbus")
	cg, err := h.Create(context.Background(), "a.slice:p:x", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := cg.Add(7); !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "a.slice:p:x") {
		t.Fatalf("add with failing systemd: %v", err)
	}
	if err := cg.Delete(); err != nil {
		t.Fatalf("delete of a never started scope: %v", err)
	}

	// systemd starts the scope, but the limits cannot be written: the scope
	// is stopped again.
	h, units = fakeV2Host(t)
	pids := int64(100)
	cg, err = h.Create(context.Background(), "a.slice:p:x", &specs.LinuxResources{Pids: &specs.LinuxPids{Limit: &pids}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(h.root, "a.slice"), 0o755); err != nil {
		t.Fatal(err)
	}
	// pids.max as a directory makes writing the limit fail.
	if err := os.MkdirAll(filepath.Join(h.root, "a.slice", "p-x.scope", "pids.max"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := cg.Add(7); err == nil {
		t.Fatal("add succeeded")
	}
	want := []string{"start a.slice p-x.scope 7", "stop p-x.scope"}
	if got := units.callList(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("calls %q, want %q", got, want)
	}
	checkCgroupGone(t, filepath.Join(h.root, "a.slice", "p-x.scope"))
}

// fakeV1Host is a cgroup v1 host whose hierarchies are directories in a
// temporary directory, without swap accounting.
func fakeV1Host(t *testing.T) Host {
	t.Helper()
	root := t.TempDir()
	for _, c := range []string{"cpu", "cpuacct", "memory", "pids", "freezer"} {
		if err := os.Mkdir(filepath.Join(root, c), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	writeCgroupFile(t, filepath.Join(root, "cpuset", "cpuset.cpus"), "0-1")
	writeCgroupFile(t, filepath.Join(root, "cpuset", "cpuset.mems"), "0")
	return Host{
		mode:    func() cgroups.CGMode { return cgroups.Hybrid },
		root:    root,
		systemd: func() bool { return false },
	}
}

func TestCgroupV1FakeTree(t *testing.T) {
	skipCgroupUnlessRoot(t, "containerd/cgroups creates missing control files with mode 0, which only root can reopen")
	h := fakeV1Host(t)
	ctx := context.Background()
	r := testCgroupResources(64<<20, 50000)
	swap := int64(128 << 20)
	r.Memory.Swap = &swap
	cg, err := h.Create(ctx, "/ns/abc", r)
	if err != nil {
		t.Fatal(err)
	}
	checkCgroupFile(t, filepath.Join(h.root, "memory", "ns", "abc", "memory.limit_in_bytes"), "67108864")
	checkCgroupGone(t, filepath.Join(h.root, "memory", "ns", "abc", "memory.memsw.limit_in_bytes"))
	checkCgroupFile(t, filepath.Join(h.root, "cpu", "ns", "abc", "cpu.cfs_quota_us"), "50000")
	checkCgroupFile(t, filepath.Join(h.root, "cpuset", "ns", "abc", "cpuset.cpus"), "0-1")
	if err := cg.Add(4242); err != nil {
		t.Fatal(err)
	}
	checkCgroupFile(t, filepath.Join(h.root, "freezer", "ns", "abc", "cgroup.procs"), "4242")
	if st, err := cg.Stats(); err != nil {
		t.Fatal(err)
	} else if _, ok := st.(*cgroup1stats.Metrics); !ok {
		t.Fatalf("stats are %T", st)
	}
	for _, c := range []string{"cpu", "cpuacct", "memory", "pids", "freezer", "cpuset"} {
		writeCgroupFile(t, filepath.Join(h.root, c, "ns", "abc", "cgroup.procs"), "")
	}
	if err := cg.Delete(); err != nil {
		t.Fatal(err)
	}
	checkCgroupGone(t, filepath.Join(h.root, "memory", "ns", "abc"), filepath.Join(h.root, "cpuset", "ns", "abc"))

	// Creation fails in the pids hierarchy: what was made elsewhere goes.
	writeCgroupFile(t, filepath.Join(h.root, "pids", "bad"), "not a directory")
	if _, err := h.Create(ctx, "/bad/abc", r); err == nil || !strings.Contains(err.Error(), "/bad/abc") {
		t.Fatalf("create over a file: %v", err)
	}
	checkCgroupGone(t, filepath.Join(h.root, "freezer", "bad"), filepath.Join(h.root, "memory", "bad"))
	if _, err := h.Load(ctx, "/missing"); !errdefs.IsNotFound(err) {
		t.Fatalf("load missing: %v", err)
	}
}

// skipCgroupUnlessRoot skips t, for reason, when the test does not run as root.
func skipCgroupUnlessRoot(t *testing.T, reason string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: " + reason)
	}
}

// skipUnlessCgroupV1 skips a test that creates cgroups on this machine's
// cgroup v1 hierarchies unless it runs as root on a v1 host.
func skipUnlessCgroupV1(t *testing.T) {
	t.Helper()
	skipCgroupUnlessRoot(t, "creates cgroups")
	if _, err := os.Stat("/sys/fs/cgroup/memory/memory.limit_in_bytes"); err != nil {
		t.Skip("no cgroup v1 memory hierarchy")
	}
	if m := cgroups.Mode(); m != cgroups.Legacy && m != cgroups.Hybrid {
		t.Skip("not a cgroup v1 host")
	}
}

// TestCgroupV1Real runs against this machine's cgroup v1 hierarchies.
func TestCgroupV1Real(t *testing.T) {
	skipUnlessCgroupV1(t)
	ctx := context.Background()
	parent := fmt.Sprintf("/vmshim-test-%08x", rand.Uint32())
	path := parent + "/task1"
	var hierarchies []string
	for _, c := range []string{"memory", "cpu", "cpuacct", "pids", "freezer", "blkio", "devices", "cpuset", "systemd"} {
		if _, err := os.Stat(filepath.Join(cgroupRoot, c)); err == nil {
			hierarchies = append(hierarchies, filepath.Join(cgroupRoot, c))
		}
	}
	t.Cleanup(func() {
		for _, h := range hierarchies {
			_ = os.Remove(filepath.Join(h, path))
			_ = os.Remove(filepath.Join(h, parent))
		}
		checkCgroupGone(t, func() (ps []string) {
			for _, h := range hierarchies {
				ps = append(ps, filepath.Join(h, parent))
			}
			return ps
		}()...)
	})

	cg, err := NewHost(nil).Create(ctx, path, testCgroupResources(64<<20, 50000))
	if err != nil {
		t.Fatal(err)
	}
	checkCgroupFile(t, filepath.Join(cgroupRoot, "memory", path, "memory.limit_in_bytes"), "67108864")
	checkCgroupFile(t, filepath.Join(cgroupRoot, "cpu", path, "cpu.cfs_quota_us"), "50000")
	if got := cg.MemoryDir(); got != filepath.Join(cgroupRoot, "memory", path) {
		t.Errorf("memory dir %q", got)
	}

	// The child execs sleep once it is in the cgroup, so its memory is
	// charged there.
	cmd := exec.Command("sh", "-c", "read x; exec sleep 30")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if err := cg.Add(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if _, err := stdin.Write([]byte("\n")); err != nil {
		t.Fatal(err)
	}
	own, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{":memory:" + path + "\n", ":cpu:" + path + "\n", ":cpuacct:" + path + "\n"} {
		if !strings.Contains(string(own), want) {
			t.Errorf("/proc/PID/cgroup lacks %q:\n%s", want, own)
		}
	}

	if err := cg.Update(testCgroupResources(128<<20, 20000)); err != nil {
		t.Fatal(err)
	}
	checkCgroupFile(t, filepath.Join(cgroupRoot, "memory", path, "memory.limit_in_bytes"), "134217728")
	checkCgroupFile(t, filepath.Join(cgroupRoot, "cpu", path, "cpu.cfs_quota_us"), "20000")

	// A VM that grows raises memory+swap with its memory limit, and the
	// kernel refuses a memory limit above memory.memsw.limit_in_bytes.
	if _, err := os.Stat(filepath.Join(cgroupRoot, "memory", path, "memory.memsw.limit_in_bytes")); err == nil {
		for _, mib := range []int64{128, 256, 96} {
			r := testCgroupResources(mib<<20, 20000)
			swap := mib << 20
			r.Memory.Swap = &swap
			if err := cg.Update(r); err != nil {
				t.Fatalf("update to %d MiB with as much memory+swap: %v", mib, err)
			}
			checkCgroupFile(t, filepath.Join(cgroupRoot, "memory", path, "memory.limit_in_bytes"), fmt.Sprint(mib<<20))
			checkCgroupFile(t, filepath.Join(cgroupRoot, "memory", path, "memory.memsw.limit_in_bytes"), fmt.Sprint(mib<<20))
		}
	}

	var usage uint64
	for deadline := time.Now().Add(5 * time.Second); usage == 0 && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		st, err := cg.Stats()
		if err != nil {
			t.Fatal(err)
		}
		m, ok := st.(*cgroup1stats.Metrics)
		if !ok {
			t.Fatalf("stats are %T", st)
		}
		usage = m.GetMemory().GetUsage().GetUsage()
	}
	if usage == 0 {
		t.Error("memory usage stays 0")
	}

	// Start puts a child in the cgroup from its first instruction, and
	// leaves every thread of this process where it was.
	before, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	started := exec.Command("sleep", "30")
	if err := cg.Start(started); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = started.Process.Kill(); _ = started.Wait() })
	if got, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", started.Process.Pid)); !strings.Contains(string(got), ":memory:"+path+"\n") {
		t.Errorf("started child's cgroups:\n%s", got)
	}
	tasks, _ := filepath.Glob("/proc/self/task/*/cgroup")
	for _, f := range tasks {
		if b, _ := os.ReadFile(f); strings.Contains(string(b), path) {
			t.Errorf("thread %s of the test joined the cgroup:\n%s", f, b)
		}
	}
	if after, _ := os.ReadFile("/proc/self/cgroup"); string(after) != string(before) {
		t.Errorf("the test's own cgroups changed:\n%s\nthen\n%s", before, after)
	}
	_ = started.Process.Kill()
	_ = started.Wait()

	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if err := cg.Delete(); err != nil {
		t.Fatal(err)
	}
	for _, h := range hierarchies {
		checkCgroupGone(t, filepath.Join(h, path))
	}
	if _, err := NewHost(nil).Load(ctx, path); !errdefs.IsNotFound(err) {
		t.Fatalf("load deleted: %v", err)
	}
}
