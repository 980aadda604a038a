package node

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmshim/vmshim/integration/node/nodeapi"
)

// The limits the tasks are given, and what the shim makes of them
// (shim/resources.go cgroupResources): guest RAM is the memory limit in
// whole MiB, QEMU's cgroup allows guest RAM plus memory_overhead (128Mi by
// default, 0 in oomConfig), and the CPU limit goes to the cgroup as it is.
const (
	memLimit       = 256 << 20
	memoryOverhead = 128 << 20
	cpuQuota       = 50000
	cpuPeriod      = 100000
)

// driver is one way a cgroupsPath names QEMU's cgroup.
type driver struct {
	name string
	path func(id string) string // the OCI cgroupsPath
	dir  func(id string) string // the cgroup's directory below /sys/fs/cgroup
	unit func(id string) string // its systemd scope, "" for cgroupfs
}

// systemd reports whether the driver makes systemd scopes.
func (d driver) systemd() bool { return d.unit("x") != "" }

// drivers are the kubelet's two: systemd (containerd's CRI turns a parent
// ending in .slice into slice:cri-containerd:ID) and cgroupfs.
var drivers = []driver{
	{
		name: "systemd",
		path: func(id string) string { return "system.slice:vmshim:" + id },
		dir:  func(id string) string { return "/system.slice/vmshim-" + id + ".scope" },
		unit: func(id string) string { return "vmshim-" + id + ".scope" },
	},
	{
		name: "cgroupfs",
		path: func(id string) string { return "/vmshim/" + id },
		dir:  func(id string) string { return "/vmshim/" + id },
		unit: func(string) string { return "" },
	},
}

// nodectl runs vmshim-nodectl in the node and decodes its JSON into out.
func (n *node) nodectl(ctx context.Context, t *testing.T, out any, args ...string) {
	t.Helper()
	begin := time.Now()
	stdout := n.sh(ctx, t, nodeCtl+" "+strings.Join(args, " "))
	if err := json.Unmarshal([]byte(stdout), out); err != nil {
		t.Fatalf("vmshim-nodectl %s: %v: %q", args[0], err, stdout)
	}
	t.Logf("vmshim-nodectl %s: %.1f s", strings.Join(args, " "), time.Since(begin).Seconds())
}

// remover returns a func that deletes task id and its container; should
// the test end before it is called, a cleanup deletes them.
func (n *node) remover(ctx context.Context, t *testing.T, id string) func() {
	done := false
	t.Cleanup(func() {
		if !done {
			_, _ = n.run(ctx, nodeCtl+" delete -id "+id, nil)
		}
	})
	return func() {
		t.Helper()
		var out map[string]string
		n.nodectl(ctx, t, &out, "delete", "-id", id)
		done = true
	}
}

// read returns the trimmed content of a file in the node.
func (n *node) read(ctx context.Context, t *testing.T, path string) string {
	t.Helper()
	return strings.TrimSpace(n.sh(ctx, t, "cat "+path))
}

// checkLimits creates a paused VM task in the driver's cgroup with memory
// and CPU limits and checks that QEMU, all its threads, runs there and in
// nothing else, with the limits the shim derives; that a systemd daemon
// reload leaves them; and that deleting the task removes the cgroup. It
// returns a summary line.
func (n *node) checkLimits(ctx context.Context, t *testing.T, d driver) string {
	t.Helper()
	id := "limits-" + d.name
	dir := d.dir(id)
	cgdir := "/sys/fs/cgroup" + dir
	var c nodeapi.Created
	n.nodectl(ctx, t, &c, "create", "-id", id, "-cgroup", d.path(id),
		"-memory", fmt.Sprint(memLimit), "-cpu-quota", fmt.Sprint(cpuQuota), "-cpu-period", fmt.Sprint(cpuPeriod))
	remove := n.remover(ctx, t, id)
	t.Logf("%s: cgroupsPath %s, limits memory %d (%d MiB), cpu quota %d period %d",
		d.name, d.path(id), memLimit, memLimit>>20, cpuQuota, cpuPeriod)

	cmdline := n.sh(ctx, t, fmt.Sprintf("tr '\\0' ' ' </proc/%d/cmdline", c.QEMUPid))
	if !strings.Contains(cmdline, "qemu-system-x86_64") || !strings.Contains(cmdline, "guest="+id) || !strings.Contains(cmdline, " -S ") {
		t.Errorf("%s: pid %d is not the paused QEMU of %s: %.300s", d.name, c.QEMUPid, id, cmdline)
	}
	procCgroup := n.read(ctx, t, fmt.Sprintf("/proc/%d/cgroup", c.QEMUPid))
	t.Logf("%s: QEMU pid %d, /proc/%d/cgroup: %s", d.name, c.QEMUPid, c.QEMUPid, procCgroup)
	if procCgroup != "0::"+dir {
		t.Errorf("%s: QEMU's /proc/%d/cgroup is %q, want %q", d.name, c.QEMUPid, procCgroup, "0::"+dir)
	}
	threads := strings.Fields(n.sh(ctx, t, fmt.Sprintf("ls /proc/%d/task", c.QEMUPid)))
	threadCgroups := strings.Split(strings.TrimSpace(n.sh(ctx, t, fmt.Sprintf("cat /proc/%d/task/*/cgroup | sort | uniq -c", c.QEMUPid))), "\n")
	t.Logf("%s: QEMU's %d threads are in: %s", d.name, len(threads), strings.Join(threadCgroups, "; "))
	if len(threadCgroups) != 1 || !strings.HasSuffix(threadCgroups[0], " 0::"+dir) {
		t.Errorf("%s: QEMU's threads are not all in %s: %v", d.name, dir, threadCgroups)
	}
	n.checkProcs(ctx, t, d, cgdir, c.QEMUPid)
	n.checkShimCgroup(ctx, t, d, c, threads)

	wantMax := int64(memLimit>>20<<20 + memoryOverhead)
	wantCPU := fmt.Sprintf("%d %d", cpuQuota, cpuPeriod)
	memMax, cpuMax := n.limits(ctx, t, d, cgdir, wantMax, wantCPU, "")
	t.Logf("%s: memory.current %s, memory.swap.max %s, QEMU %s, oom_score_adj %s", d.name,
		n.read(ctx, t, cgdir+"/memory.current"), n.read(ctx, t, cgdir+"/memory.swap.max"),
		strings.Join(strings.Fields(n.sh(ctx, t, fmt.Sprintf("grep -E '^(VmRSS|RssAnon|RssFile):' /proc/%d/status", c.QEMUPid))), " "),
		n.read(ctx, t, fmt.Sprintf("/proc/%d/oom_score_adj", c.QEMUPid)))
	if unit := d.unit(id); unit != "" {
		show := n.sh(ctx, t, "systemctl show -p ActiveState -p ControlGroup -p Slice -p Delegate -p MemoryMax -p CPUQuotaPerSecUSec "+unit)
		t.Logf("%s: systemctl show %s:\n%s", d.name, unit, strings.TrimRight(show, "\n"))
		for _, want := range []string{"ActiveState=active", "ControlGroup=" + dir, "Slice=system.slice", "Delegate=yes"} {
			if !strings.Contains(show, want+"\n") {
				t.Errorf("%s: scope %s: want %s", d.name, unit, want)
			}
		}
		r, _ := n.run(ctx, "systemctl status --no-pager "+unit, nil)
		t.Logf("%s: systemctl status %s (exit %d):\n%s", d.name, unit, r.code, strings.TrimRight(r.stdout, "\n"))
	}
	// Package upgrades and node agents reload systemd; the limits must
	// survive that.
	n.sh(ctx, t, "systemctl daemon-reload")
	reloadMem, reloadCPU := n.limits(ctx, t, d, cgdir, wantMax, wantCPU, " after systemctl daemon-reload")

	remove()
	n.checkGone(ctx, t, d, id, c.QEMUPid)
	return fmt.Sprintf("%-8s limits  cgroupsPath %-32s -> %s  memory.max %s (want %d)  cpu.max %s (want %s)  after daemon-reload: %s, %s",
		d.name, d.path(id), dir, memMax, wantMax, cpuMax, wantCPU, reloadMem, reloadCPU)
}

// checkProcs checks that QEMU is the only process in cgdir, kernel
// threads apart (KVM attaches its per-VM worker threads to the VM
// creator's cgroup), and, under the systemd driver, the placeholder the
// shim made the scope around, which keeps the scope until the task is
// deleted.
func (n *node) checkProcs(ctx context.Context, t *testing.T, d driver, cgdir string, qemuPid int) {
	t.Helper()
	ps := strings.TrimRight(n.sh(ctx, t, "ps -o pid=,ppid=,user=,args= -p \"$(echo $(cat "+cgdir+"/cgroup.procs) | tr ' ' ,)\""), "\n")
	t.Logf("%s: processes in %s/cgroup.procs:\n%s", d.name, cgdir, ps)
	found, placeholders := false, 0
	for _, line := range strings.Split(ps, "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) < 4:
			t.Errorf("%s: ps line %q", d.name, line)
		case f[0] == strconv.Itoa(qemuPid):
			found = true
		case d.systemd() && f[2] == "nobody" && strings.Join(f[3:], " ") == "vmshim-pause scope-placeholder":
			placeholders++
			// Never the OOM killer's pick: killed with QEMU, it would let
			// systemd remove the scope before the shim read its count.
			if adj := n.read(ctx, t, "/proc/"+f[0]+"/oom_score_adj"); adj != "-1000" {
				t.Errorf("%s: the scope placeholder %s has oom_score_adj %s, want -1000", d.name, f[0], adj)
			}
		case f[1] != "2":
			t.Errorf("%s: %s holds a process other than QEMU: %s", d.name, cgdir, line)
		}
	}
	if !found {
		t.Errorf("%s: QEMU (%d) is not in %s/cgroup.procs", d.name, qemuPid, cgdir)
	}
	if d.systemd() && placeholders != 1 {
		t.Errorf("%s: %d scope placeholders in %s, want 1", d.name, placeholders, cgdir)
	}
}

// limits checks memory.max and cpu.max of cgdir and returns them.
func (n *node) limits(ctx context.Context, t *testing.T, d driver, cgdir string, wantMax int64, wantCPU, when string) (string, string) {
	t.Helper()
	memMax := n.read(ctx, t, cgdir+"/memory.max")
	cpuMax := n.read(ctx, t, cgdir+"/cpu.max")
	t.Logf("%s: %s/memory.max %s (want %d = guest RAM %d MiB + memory_overhead %d MiB), cpu.max %q (want %q)%s",
		d.name, cgdir, memMax, wantMax, memLimit>>20, (wantMax-memLimit>>20<<20)>>20, cpuMax, wantCPU, when)
	if memMax != strconv.FormatInt(wantMax, 10) {
		t.Errorf("%s: memory.max %s, want %d%s", d.name, memMax, wantMax, when)
	}
	if cpuMax != wantCPU {
		t.Errorf("%s: cpu.max %q, want %q%s", d.name, cpuMax, wantCPU, when)
	}
	return memMax, cpuMax
}

// checkShimCgroup checks that nothing of QEMU is in the shim's cgroup:
// none of its threads.
func (n *node) checkShimCgroup(ctx context.Context, t *testing.T, d driver, c nodeapi.Created, qemuThreads []string) {
	t.Helper()
	shimCgroup := n.read(ctx, t, fmt.Sprintf("/proc/%d/cgroup", c.ShimPid))
	shimDir, ok := strings.CutPrefix(shimCgroup, "0::")
	if !ok {
		t.Errorf("%s: shim %d's cgroup %q is not on the unified hierarchy", d.name, c.ShimPid, shimCgroup)
		return
	}
	shimThreads := strings.Fields(n.read(ctx, t, "/sys/fs/cgroup"+shimDir+"/cgroup.threads"))
	var left []string
	for _, tid := range qemuThreads {
		if slices.Contains(shimThreads, tid) {
			left = append(left, tid)
		}
	}
	t.Logf("%s: shim pid %d in %s (%d threads there), QEMU threads there: %d", d.name, c.ShimPid, shimDir, len(shimThreads), len(left))
	if len(left) > 0 {
		t.Errorf("%s: QEMU threads %v are in the shim's cgroup %s", d.name, left, shimDir)
	}
}

// checkGone checks that task id's QEMU and cgroup are gone.
func (n *node) checkGone(ctx context.Context, t *testing.T, d driver, id string, qemuPid int) {
	t.Helper()
	dir := d.dir(id)
	r, err := n.run(ctx, fmt.Sprintf("test ! -e /sys/fs/cgroup%s && test ! -e /proc/%d", dir, qemuPid), nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.code != 0 {
		t.Errorf("%s: after delete, /sys/fs/cgroup%s or QEMU (pid %d) is still there", d.name, dir, qemuPid)
	} else {
		t.Logf("%s: after delete: /sys/fs/cgroup%s is gone, QEMU pid %d is gone", d.name, dir, qemuPid)
	}
	if unit := d.unit(id); unit != "" {
		r, err := n.run(ctx, "systemctl status --no-pager "+unit, nil)
		if err != nil {
			t.Fatal(err)
		}
		msg := strings.TrimSpace(r.stdout + r.stderr)
		t.Logf("%s: after delete: systemctl status %s: exit %d: %s", d.name, unit, r.code, msg)
		// 4: no such unit.
		if r.code != 4 {
			t.Errorf("%s: scope %s is still known to systemd after delete (exit %d)", d.name, unit, r.code)
		}
	}
}

// checkOOM creates a paused VM task in the driver's cgroup whose shim
// config leaves QEMU no memory beyond guest RAM, fills guest RAM from
// outside (vmshim-nodectl oom), and checks that the kernel OOM-killed
// QEMU in that cgroup and that containerd's event stream carried
// /tasks/oom for the container before /tasks/exit. It returns a summary
// line.
func (n *node) checkOOM(ctx context.Context, t *testing.T, d driver, run int) string {
	t.Helper()
	id := fmt.Sprintf("oom-%s-%d", d.name, run)
	dir := d.dir(id)
	cgdir := "/sys/fs/cgroup" + dir
	var r nodeapi.OOMReport
	n.nodectl(ctx, t, &r, "oom", "-id", id, "-cgroup", d.path(id), "-cgroup-dir", cgdir,
		"-memory", fmt.Sprint(memLimit), "-config", oomConfig)
	remove := n.remover(ctx, t, id)
	t.Logf("%s: OOM task: QEMU pid %d, cgroup %s, memory.max %s (want %d = guest RAM %d MiB + memory_overhead 0)",
		d.name, r.QEMUPid, dir, r.MemoryMax, memLimit>>20<<20, memLimit>>20)
	if r.MemoryMax != strconv.Itoa(memLimit>>20<<20) {
		t.Errorf("%s: memory.max of the OOM task's cgroup %q, want %d", d.name, r.MemoryMax, memLimit>>20<<20)
	}
	t.Logf("%s: wrote %d MiB of guest RAM (%s) through /proc/%d/mem; error that stopped the writes: %s",
		d.name, r.Filled>>20, strings.Join(strings.Fields(r.GuestRAM), " "), r.QEMUPid, orNone(r.FillError))
	if r.MemoryEvents == "" {
		// The count the shim reads before it publishes the exit lives
		// there: the cgroup must outlive QEMU until the task's delete.
		t.Errorf("%s: %s/memory.events: the cgroup was gone at the exit, before the task's delete", d.name, cgdir)
	} else {
		t.Logf("%s: %s/memory.events at the exit: %s", d.name, cgdir, strings.Join(strings.Fields(r.MemoryEvents), " "))
	}
	kernel := strings.TrimSpace(n.sh(ctx, t, fmt.Sprintf("dmesg | grep -F -e 'oom_memcg=%s,' -e 'Killed process %d ' || true", dir, r.QEMUPid)))
	t.Logf("%s: kernel log:\n%s", d.name, kernel)
	if unit := d.unit(id); unit != "" {
		t.Logf("%s: journal of %s:\n%s", d.name, unit,
			strings.TrimRight(n.sh(ctx, t, "journalctl --no-pager -o cat -u "+unit), "\n"))
	}
	var topics []string
	for _, e := range r.Events {
		s := e.Topic
		if e.ExitStatus != nil {
			s += fmt.Sprintf(" (exit status %d)", *e.ExitStatus)
		}
		topics = append(topics, s+" at "+e.At.Format("15:04:05.000"))
	}
	t.Logf("%s: containerd's task events for %s: %s; waiting ended with: %s", d.name, id, strings.Join(topics, ", "), r.Waited)
	t.Logf("%s: the shim's log lines about OOM for %s:\n%s", d.name, id, orNone(strings.TrimSpace(
		n.sh(ctx, t, "journalctl -u containerd --no-pager -o cat | grep -F 'id="+id+"' | grep -i oom || true"))))

	killed := strings.Contains(kernel, "oom_memcg="+dir+",") && strings.Contains(kernel, fmt.Sprintf("Killed process %d ", r.QEMUPid))
	// QEMU alone: a scope whose placeholder the killer took as well is
	// empty, and systemd removes it, count and all, before the exit.
	for _, line := range strings.Split(kernel, "\n") {
		if strings.Contains(line, "oom_memcg="+dir+",") && !strings.Contains(line, fmt.Sprintf(",pid=%d,", r.QEMUPid)) {
			t.Errorf("%s: the OOM killer took a process other than QEMU (%d) in %s: %s", d.name, r.QEMUPid, dir, line)
		}
	}
	if !killed {
		t.Errorf("%s: the kernel log shows no OOM kill of QEMU (pid %d) in %s: QEMU never exceeded memory.max", d.name, r.QEMUPid, dir)
	}
	if r.MemoryEvents != "" && counter(r.MemoryEvents, "oom_kill") < 1 {
		t.Errorf("%s: memory.events of %s counts no oom_kill", d.name, dir)
	}
	oomAt, exitAt := -1, -1
	for i, e := range r.Events {
		switch {
		case e.Topic == "/tasks/oom" && oomAt < 0:
			oomAt = i
		case e.Topic == "/tasks/exit" && exitAt < 0:
			exitAt = i
			if e.ExitStatus == nil || *e.ExitStatus != 137 {
				t.Errorf("%s: /tasks/exit of the OOM-killed QEMU has exit status %v, want 137 (SIGKILL)", d.name, e.ExitStatus)
			}
		}
	}
	verdict := "/tasks/oom before /tasks/exit"
	switch {
	case exitAt < 0:
		verdict = "no /tasks/exit"
		t.Errorf("%s: no /tasks/exit for %s: %s", d.name, id, r.Waited)
	case oomAt < 0 && killed:
		verdict = "kernel OOM-killed QEMU, but no /tasks/oom before /tasks/exit"
		gone := ""
		if r.MemoryEvents == "" {
			gone = " (the cgroup was already gone when the exit was published)"
		}
		t.Errorf("%s: the kernel OOM-killed QEMU in %s, but containerd's event stream carried no /tasks/oom for %s before its /tasks/exit: the shim published no TaskOOM%s",
			d.name, dir, id, gone)
	case oomAt < 0:
		verdict = "no /tasks/oom"
		t.Errorf("%s: no /tasks/oom for %s", d.name, id)
	case oomAt > exitAt:
		verdict = "/tasks/oom after /tasks/exit"
		t.Errorf("%s: /tasks/oom came after /tasks/exit", d.name)
	}
	remove()
	n.checkGone(ctx, t, d, id, r.QEMUPid)
	return fmt.Sprintf("%-8s oom     cgroupsPath %-32s -> %s  memory.max %s  %s",
		d.name, d.path(id), dir, r.MemoryMax, verdict)
}

// counter returns the value of key in a flat-keyed cgroup file, or -1.
func counter(content, key string) int {
	for _, line := range strings.Split(content, "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && f[0] == key {
			v, err := strconv.Atoi(f[1])
			if err == nil {
				return v
			}
		}
	}
	return -1
}

// orNone is s, or "none" when it is empty.
func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// oomWatchRuns is how many times the oom package's real cgroup v2 race
// test runs in the node: each forces an OOM kill and the cgroup's removal
// into one inotify batch.
const oomWatchRuns = 200

// checkOOMWatch runs the oom package's TestV2RealKillAndRemovalInOneBatch
// in the node (a cgroup v2 host), oomWatchRuns times, and returns a
// summary line.
func (n *node) checkOOMWatch(ctx context.Context, t *testing.T) string {
	t.Helper()
	r, err := n.run(ctx, fmt.Sprintf("cd /tmp && %s -test.run '^TestV2RealKillAndRemovalInOneBatch$' -test.count %d -test.v 2>&1", nodeOOMTest, oomWatchRuns), nil)
	if err != nil {
		t.Fatal(err)
	}
	out := r.stdout + r.stderr
	passed, skipped := strings.Count(out, "--- PASS: TestV2RealKillAndRemovalInOneBatch"), strings.Count(out, "--- SKIP:")
	t.Logf("oom.test in the node: exit %d, %d of %d runs passed", r.code, passed, oomWatchRuns)
	if r.code != 0 || passed != oomWatchRuns || skipped != 0 {
		t.Errorf("the oom package's cgroup v2 race test in the node: exit %d, %d of %d passed, %d skipped:\n%s", r.code, passed, oomWatchRuns, skipped, out)
	}
	return fmt.Sprintf("%-8s oom     the kill and the removal in one inotify batch: %d of %d runs counted the kill", "kernel", passed, oomWatchRuns)
}
