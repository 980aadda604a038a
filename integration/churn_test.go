package integration

import (
	"context"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/pkg/namespaces"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// envChurn sets how many cycles TestChurn runs; `make test-reliability
// VMSHIM_CHURN=200` runs the full size.
const envChurn = "VMSHIM_CHURN"

// defaultChurn is TestChurn's cycle count when envChurn is unset.
const defaultChurn = 20

// churnSettle bounds the wait for counts to come back down after the
// last cycle: snapshot garbage collection and closing connections lag
// behind the calls that cause them.
const churnSettle = 15 * time.Second

// TestChurn runs VM pods through create, start, stop and remove many
// times, through the CRI (the CNI's netns) and now and then through the
// containerd client (the shim's own netns), with graceful and forced
// stops. Afterwards nothing may have grown: processes, links and qdiscs,
// network namespaces, mounts, files under containerd's state, root, the
// bundles, /run/vmshim and the CNI IPAM store, cgroups, containerd's
// records and its open fds.
func TestChurn(t *testing.T) {
	cycles := churnCycles(t)
	w := &churnWatch{d: env.daemon, cri: newCRI(t, env.daemon), exits: map[string]map[int32]int{}, busy: map[bool]churnCounts{}}

	// Warm up both paths first: what is made once and kept (the CNI
	// bridge, containerd's caches and connections) must exist before the
	// baseline is taken.
	w.cycle(t, 0, churnKind{})
	w.cycle(t, 0, churnKind{ctr: true, forced: true})
	before := w.stable(t)
	w.checkCounting(t, before)

	var total, lo, hi time.Duration
	for i := 1; i <= cycles; i++ {
		k := churnKindOf(i)
		d := w.cycle(t, i, k)
		t.Logf("cycle %d/%d (%s): %v", i, cycles, k, d.Round(time.Millisecond))
		total += d
		if lo == 0 || d < lo {
			lo = d
		}
		hi = max(hi, d)
	}
	after := w.settle(t, before)

	t.Logf("%d cycles in %v: per cycle min %v, mean %v, max %v", cycles, total.Round(time.Second),
		lo.Round(time.Millisecond), (total / time.Duration(cycles)).Round(time.Millisecond), hi.Round(time.Millisecond))
	t.Logf("exit codes by cycle kind: %v", w.exits)
	t.Logf("while a VM ran (cri): %v", w.busy[false])
	t.Logf("while a VM ran (ctr): %v", w.busy[true])
	t.Logf("before: %v", before)
	t.Logf("after:  %v", after)
	if grown := before.grown(after); len(grown) > 0 {
		t.Errorf("grew over %d cycles: %s\ncontainerd log:\n%s", cycles, strings.Join(grown, ", "), env.daemon.logTail())
	}
	assertNoCNIErrors(t, env.daemon)
}

// churnRaised lists, for the CRI (false) and the ctr (true) path, the
// counts a running VM raises.
var churnRaised = map[bool][]string{
	false: {"procs.qemu", "procs.shim", "procs.pause", "links", "qdiscs", "netns", "mounts", "state", "bundles",
		"root", "ipam", "cgroups", "run.vmshim", "containers.k8s.io", "cri.sandboxes", "cri.containers"},
	true: {"procs.qemu", "procs.shim", "netns", "mounts", "state", "bundles", "root", "cgroups", "run.vmshim",
		"containers.vmshim-test"},
}

// checkCounting fails when a count that a running VM raises did not rise
// over idle while the warm-up VMs ran: it would miss what it watches.
func (w *churnWatch) checkCounting(t *testing.T, idle churnCounts) {
	t.Helper()
	for ctr, keys := range churnRaised {
		for _, k := range keys {
			if busy := w.busy[ctr][k]; busy <= idle[k] {
				t.Errorf("%s was %d while a VM ran (ctr %v) and is %d idle: it does not see what it counts", k, busy, ctr, idle[k])
			}
		}
	}
}

// churnCycles reads the cycle count from envChurn.
func churnCycles(t *testing.T) int {
	t.Helper()
	s := os.Getenv(envChurn)
	if s == "" {
		return defaultChurn
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive number of cycles", envChurn, s)
	}
	return n
}

// churnKind says how one cycle runs its VM.
type churnKind struct {
	ctr    bool // through the containerd client, in a netns the shim makes; else through the CRI
	forced bool // SIGKILL (CRI stop timeout 0); else the ACPI power button
}

// churnKindOf alternates forced and graceful stops and makes every fifth
// cycle a ctr task, so both paths churn both ways.
func churnKindOf(i int) churnKind {
	return churnKind{ctr: i%5 == 0, forced: i%2 == 0}
}

// String names the kind as path/stop, e.g. cri/acpi.
func (k churnKind) String() string {
	path, stop := "cri", "acpi"
	if k.ctr {
		path = "ctr"
	}
	if k.forced {
		stop = "forced"
	}
	return path + "/" + stop
}

// churnWatch runs TestChurn's cycles and counts what they may leave.
// Other test runs share the host (their VMs, /run/netns, /run/vmshim and
// the cgroup trees), so host-wide resources are counted only when they
// belong to this daemon or to the ids the cycles used.
type churnWatch struct {
	d      *daemon
	cri    *cri
	ids    []string                 // task ids and pod uids the cycles used
	hashes []string                 // the shim's hash names of those (runtime dirs, netns)
	exits  map[string]map[int32]int // cycle kind → exit code → count
	busy   map[bool]churnCounts     // ctr or not → counts while the first such VM ran
}

// booted takes the first count of a path while its VM runs.
func (w *churnWatch) booted(t *testing.T, ctr bool) {
	t.Helper()
	if _, ok := w.busy[ctr]; !ok {
		w.busy[ctr] = w.count(t)
	}
}

// own records task id of containerd namespace ns as the test's.
func (w *churnWatch) own(ns string, ids ...string) {
	for _, id := range ids {
		w.ids = append(w.ids, id)
		w.hashes = append(w.hashes, shimHash(ns, id))
	}
}

// cycle runs one VM from creation to removal and returns how long it took.
func (w *churnWatch) cycle(t *testing.T, i int, k churnKind) time.Duration {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*bootTimeout)
	defer cancel()
	start := time.Now()
	var code int32
	if k.ctr {
		code = w.ctrCycle(ctx, t, k.forced)
	} else {
		code = w.criCycle(ctx, t, i, k.forced)
	}
	if w.exits[k.String()] == nil {
		w.exits[k.String()] = map[int32]int{}
	}
	w.exits[k.String()][code]++
	// A graceful CRI stop may legitimately end in SIGKILL when the guest
	// takes longer than the timeout; the other outcomes are fixed.
	if want := int32(137); k.forced && code != want {
		t.Errorf("cycle %d (%s): exit %d, want %d", i, k, code, want)
	} else if k.ctr && !k.forced && code != 0 {
		t.Errorf("cycle %d (%s): exit %d, want 0", i, k, code)
	}
	return time.Since(start)
}

// criCycle runs a pod with a VM through the calls the kubelet makes and
// returns the VM's exit code.
func (w *churnWatch) criCycle(ctx context.Context, t *testing.T, i int, forced bool) int32 {
	t.Helper()
	p := w.cri.runPod(ctx, t, fmt.Sprintf("churn-%d", i))
	w.own(criNamespace, p.id, p.config.GetMetadata().GetUid())
	vm := p.startVM(ctx, t, imageKernelWait, nil)
	w.own(criNamespace, vm.id)
	vm.waitLog(ctx, t, markerBooted)
	w.booted(t, false)
	timeout := int64(10)
	if forced {
		timeout = 0
	}
	vm.stop(ctx, t, timeout)
	code := vm.status(ctx, t).GetExitCode()
	p.remove(t)
	return code
}

// ctrCycle runs a VM task through the containerd client, as ctr does, and
// returns its exit code.
func (w *churnWatch) ctrCycle(ctx context.Context, t *testing.T, forced bool) int32 {
	t.Helper()
	id := uniqueID(t)
	w.own(testNamespace, id)
	v, err := createVM(ctx, t, id, imageKernelWait, nil)
	if err != nil {
		t.Fatalf("create task: %v\ncontainerd log:\n%s", err, env.daemon.logTail())
	}
	v.start(ctx, t)
	v.console.waitFor(ctx, t, markerBooted)
	w.booted(t, true)
	sig := syscall.SIGTERM
	if forced {
		sig = syscall.SIGKILL
	}
	if err := v.task.Kill(ctx, sig); err != nil {
		t.Fatalf("kill task %s: %v", id, err)
	}
	code := v.waitExit(ctx, t)
	v.remove(t)
	return int32(code)
}

// stable counts until two counts a second apart agree, so that the
// baseline holds nothing of the warm-up that is still going away.
func (w *churnWatch) stable(t *testing.T) churnCounts {
	t.Helper()
	prev := w.count(t)
	for deadline := time.Now().Add(churnSettle); time.Now().Before(deadline); {
		time.Sleep(time.Second)
		cur := w.count(t)
		if len(prev.grown(cur)) == 0 && len(cur.grown(prev)) == 0 {
			return cur
		}
		prev = cur
	}
	return prev
}

// settle counts until nothing has grown over before, or churnSettle
// passes, and returns the last count.
func (w *churnWatch) settle(t *testing.T, before churnCounts) churnCounts {
	t.Helper()
	cur := w.count(t)
	for deadline := time.Now().Add(churnSettle); len(before.grown(cur)) > 0 && time.Now().Before(deadline); {
		time.Sleep(500 * time.Millisecond)
		cur = w.count(t)
	}
	return cur
}

// churnCounts are what TestChurn compares, by resource.
type churnCounts map[string]int

// String lists the counts as name=n, sorted by name.
func (c churnCounts) String() string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(c)) {
		fmt.Fprintf(&b, "%s=%d ", k, c[k])
	}
	return strings.TrimSpace(b.String())
}

// grown lists the resources after holds more of than c, as "name a→b".
func (c churnCounts) grown(after churnCounts) []string {
	var out []string
	for k, n := range after {
		if n > c[k] {
			out = append(out, fmt.Sprintf("%s %d→%d", k, c[k], n))
		}
	}
	slices.Sort(out)
	return out
}

// count takes stock of everything a VM's life creates.
func (w *churnWatch) count(t *testing.T) churnCounts {
	t.Helper()
	d := w.d
	state := filepath.Join(d.dir, "state")
	n := churnCounts{
		"links":   commandLines(t, "ip", "-n", d.netns, "-o", "link", "show"),
		"qdiscs":  commandLines(t, "tc", "-n", d.netns, "qdisc", "show"),
		"mounts":  w.mounts(t),
		"state":   treeSize(state, ""),
		"bundles": treeSize(filepath.Join(state, "io.containerd.runtime.v2.task"), ""),
		"root":    treeSize(filepath.Join(d.dir, "root"), "io.containerd.content.v1.content"),
		"ipam":    treeSize(filepath.Join(d.dir, "ipam"), ""),
		"cgroups": w.cgroups(),
	}
	for _, kind := range []string{"qemu", "shim", "pause"} {
		n["procs."+kind] = 0
	}
	for _, kind := range w.processes() {
		n["procs."+kind]++
	}
	// The CRI's pod netns are pinned under its state dir; the shim pins
	// those it makes for ctr tasks in /run/netns.
	criNetns, _ := filepath.Glob(filepath.Join(state, "*", "netns", "*"))
	n["netns"] = len(criNetns)
	for _, h := range w.hashes {
		if _, err := os.Lstat(filepath.Join("/run/netns", "vmshim-"+h)); err == nil {
			n["netns"]++
		}
		n["run.vmshim"] += treeSize(filepath.Join("/run/vmshim", h), "")
	}
	for kind, c := range fdKinds(t, d.cmd.Process.Pid) {
		n["fds."+kind] = c
	}
	w.countRecords(t, n)
	return n
}

// countRecords adds containerd's records: containers and leases in both
// namespaces, and the CRI's sandboxes and containers.
func (w *churnWatch) countRecords(t *testing.T, n churnCounts) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, ns := range []string{testNamespace, criNamespace} {
		nctx := namespaces.WithNamespace(ctx, ns)
		cs, err := env.client.Containers(nctx)
		if err != nil {
			t.Fatalf("list containers in %s: %v", ns, err)
		}
		ls, err := env.client.LeasesService().List(nctx)
		if err != nil {
			t.Fatalf("list leases in %s: %v", ns, err)
		}
		n["containers."+ns], n["leases."+ns] = len(cs), len(ls)
	}
	pods, err := w.cri.runtime.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		t.Fatalf("ListPodSandbox: %v", err)
	}
	ctrs, err := w.cri.runtime.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	if err != nil {
		t.Fatalf("ListContainers: %v", err)
	}
	n["cri.sandboxes"], n["cri.containers"] = len(pods.GetItems()), len(ctrs.GetContainers())
}

// mine reports whether s names the daemon's directory or one of the
// cycles' ids or hash names.
func (w *churnWatch) mine(s string) bool {
	if strings.Contains(s, w.d.dir) {
		return true
	}
	for _, id := range w.ids {
		if strings.Contains(s, id) {
			return true
		}
	}
	for _, h := range w.hashes {
		if strings.Contains(s, "/run/vmshim/"+h) || strings.Contains(s, "/run/netns/vmshim-"+h) {
			return true
		}
	}
	return false
}

// processes returns the kind (qemu, shim, pause) of each QEMU, shim and
// pause process that belongs to the daemon or to the cycles.
func (w *churnWatch) processes() []string {
	var out []string
	for _, p := range vmProcesses() {
		if w.mine(p.args) {
			out = append(out, p.kind)
		}
	}
	return out
}

// vmProcess is a running QEMU, VM shim or pause process.
type vmProcess struct {
	pid  string
	kind string // qemu, shim or pause
	args string // its command line, arguments joined by spaces
}

// vmProcesses lists the running QEMUs, VM shims and pause processes.
func vmProcesses() []vmProcess {
	entries, _ := os.ReadDir("/proc")
	var out []vmProcess
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		data, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(data) == 0 {
			continue
		}
		argv0, _, _ := strings.Cut(string(data), "\x00")
		var kind string
		switch name := filepath.Base(argv0); {
		case strings.HasPrefix(name, "qemu-system-"):
			kind = "qemu"
		case name == "containerd-shim-vm-v2":
			kind = "shim"
		case name == "vmshim-pause":
			kind = "pause"
		default:
			continue
		}
		args := strings.ReplaceAll(strings.TrimRight(string(data), "\x00"), "\x00", " ")
		out = append(out, vmProcess{pid: e.Name(), kind: kind, args: args})
	}
	return out
}

// mounts counts the mount table's entries that belong to the daemon or to
// the cycles.
func (w *churnWatch) mounts(t *testing.T) int {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(string(data), "\n") {
		if line != "" && w.mine(line) {
			n++
		}
	}
	return n
}

// cgroups counts the cgroups, in every v1 hierarchy and the unified one,
// below the pod cgroups' base and the containerd namespaces' parents that
// are named after the cycles' pods and tasks.
func (w *churnWatch) cgroups() int {
	hierarchies, _ := os.ReadDir(cgroupRoot)
	n := 0
	for _, h := range hierarchies {
		if !h.IsDir() { // cpu → cpu,cpuacct and the like
			continue
		}
		for _, base := range []string{podCgroupBase, "/" + criNamespace, "/" + testNamespace} {
			root := filepath.Join(cgroupRoot, h.Name(), base)
			_ = filepath.WalkDir(root, func(path string, e fs.DirEntry, err error) error {
				if err == nil && e.IsDir() && path != root && w.mine(path) {
					n++
				}
				return nil
			})
		}
	}
	return n
}

// treeSize counts the entries below dir, skipping directories named skip.
// Entries that vanish during the walk are not counted.
func treeSize(dir, skip string) int {
	n := 0
	_ = filepath.WalkDir(dir, func(path string, e fs.DirEntry, err error) error {
		switch {
		case err != nil || path == dir:
			return nil
		case skip != "" && e.IsDir() && e.Name() == skip:
			return fs.SkipDir
		}
		n++
		return nil
	})
	return n
}

// fdKinds counts pid's open fds by what they refer to: socket, pipe,
// anon_inode, file, or the kind of namespace.
func fdKinds(t *testing.T, pid int) map[string]int {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("fds of containerd: %v", err)
	}
	out := map[string]int{"socket": 0, "pipe": 0, "anon_inode": 0, "file": 0}
	for _, e := range entries {
		target, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err != nil {
			continue // closed meanwhile
		}
		kind, _, found := strings.Cut(target, ":")
		if !found || strings.HasPrefix(target, "/") {
			kind = "file"
		}
		out[kind]++
	}
	return out
}

// commandLines runs a command and counts the lines it prints.
func commandLines(t *testing.T, name string, args ...string) int {
	t.Helper()
	out, err := exec.Command(name, args...).Output()
	if err != nil {
		t.Fatalf("%s %v: %v", name, args, err)
	}
	return strings.Count(string(out), "\n")
}
