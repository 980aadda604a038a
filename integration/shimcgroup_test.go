package integration

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestCRIShimChargedToPod repeats the attack of a guest that makes its
// shim allocate (the shim lived in containerd's cgroup, with an OOM score
// of -998, so the node's OOM killer took every pod before it): a CRI pod's
// shim runs in a cgroup of its own inside the pod's cgroup_parent, where
// its memory is charged to the pod; its oom_score_adj is raised to its
// VM's; and once the pod is removed, the shim's cgroup is gone.
func TestCRIShimChargedToPod(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*bootTimeout)
	defer cancel()
	p := newCRI(t, env.daemon).runPod(ctx, t, "shimcg")
	pid := shimPidOf(t, p.id)
	sub := "vmshim-shim-" + p.id
	want := p.cgroup.path + "/" + sub
	for _, c := range []string{"memory", "pids", "cpu"} {
		if got := cgroupOf(t, pid, c); got != want {
			t.Errorf("the shim's %s cgroup is %s, want %s (inside the pod's %s)", c, got, want, p.cgroup.path)
		}
	}
	shimUse := p.cgroup.readInt(t, "memory", sub, "memory.usage_in_bytes")
	podUse := p.cgroup.readInt(t, "memory", "", "memory.usage_in_bytes")
	if shimUse <= 0 || podUse < shimUse {
		t.Errorf("memory charged to the shim's cgroup %d, to the pod's %d: the shim's is not counted in the pod's", shimUse, podUse)
	}

	// A VM container with a higher OOM score than the pod sandbox's
	// (-998): the shim is raised to it.
	const adj = 500
	vm := p.createVMWith(ctx, t, imageKernelAgent, func(cfg *runtimeapi.ContainerConfig) {
		cfg.Linux = &runtimeapi.LinuxContainerConfig{Resources: &runtimeapi.LinuxContainerResources{OomScoreAdj: adj}}
	})
	if _, err := p.c.runtime.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: vm.id}); err != nil {
		t.Fatalf("StartContainer: %v", err)
	}
	if got := oomScoreAdjOf(t, pid); got < adj {
		t.Errorf("shim oom_score_adj %d, below its VM's %d", got, adj)
	}
	qemu := processesMentioning("guest=" + vm.id)
	if len(qemu) != 1 {
		t.Fatalf("qemu processes of %s: %v", vm.id, qemu)
	}
	qpid, _ := strconv.Atoi(strings.SplitN(qemu[0], ":", 2)[0])
	if got := oomScoreAdjOf(t, qpid); got != adj {
		t.Errorf("qemu oom_score_adj %d, want %d", got, adj)
	}
	if shims := shimsOf(p.id); len(shims) != 1 {
		t.Errorf("shims of the pod after the VM's create: %v", shims)
	}

	// What the pod is charged for its shim, the figure the RuntimeClass
	// overhead covers (docs/kubernetes.md): idle once booted, and after
	// execs that move a few MiB through the shim.
	vm.waitLog(ctx, t, markerAgent)
	vm.waitLog(ctx, t, markerBooted)
	logShimMemory(t, p, pid, "idle VM pod")
	for i := 0; i < 5; i++ {
		execMegabyte(ctx, t, vm)
		vm.mustExec(ctx, t, "cat", "/proc/cpuinfo")
	}
	logShimMemory(t, p, pid, "after 5 execs of 1 MB and 5 small ones")

	// Removed as the kubelet removes it: the shim's cgroup goes before
	// the kubelet would remove the pod's.
	rctx, rcancel := context.WithTimeout(ctx, time.Minute)
	defer rcancel()
	if _, err := p.c.runtime.StopPodSandbox(rctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: p.id}); err != nil {
		t.Fatalf("StopPodSandbox: %v", err)
	}
	if _, err := p.c.runtime.RemovePodSandbox(rctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: p.id}); err != nil {
		t.Fatalf("RemovePodSandbox: %v", err)
	}
	p.removed = true
	waitGone(ctx, t, "shim of "+p.id, func() bool { return len(shimsOf(p.id)) == 0 })
	for _, c := range []string{"memory", "pids", "cpu", "systemd"} {
		if _, err := os.Stat(filepath.Join(cgroupRoot, c, want)); err == nil {
			t.Errorf("the shim's %s cgroup %s is left after the pod's removal", c, want)
		}
	}
	p.cgroup.remove(t)
	assertNothingLeftCRI(t, vm.id, p.id)
}

// execMegabyte moves 1 MB of exec output from the guest through the shim.
func execMegabyte(ctx context.Context, t *testing.T, vm *criContainer) {
	t.Helper()
	const line = "0123456789012345678901234567890123456789012345678"
	out := vm.mustExec(ctx, t, "sh", "-c", "i=0; while [ $i -lt 20000 ]; do echo "+line+"; i=$((i+1)); done")
	if len(out) != 20000*(len(line)+1) {
		t.Fatalf("exec output %d bytes", len(out))
	}
}

// shimPidOf returns the pid of the one shim serving pod sandbox id.
func shimPidOf(t *testing.T, id string) int {
	t.Helper()
	shims := shimsOf(id)
	if len(shims) != 1 {
		t.Fatalf("shims of %s: %v", id, shims)
	}
	pid, err := strconv.Atoi(strings.SplitN(shims[0], ":", 2)[0])
	if err != nil {
		t.Fatalf("shim %q: %v", shims[0], err)
	}
	return pid
}

// oomScoreAdjOf reads a process's oom_score_adj.
func oomScoreAdjOf(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/oom_score_adj")
	if err != nil {
		t.Fatalf("oom_score_adj of %d: %v", pid, err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("oom_score_adj of %d: %q", pid, b)
	}
	return n
}

// logShimMemory logs the shim's RSS and PSS and what its cgroup is
// charged, now and at its peak.
func logShimMemory(t *testing.T, p *pod, pid int, when string) {
	t.Helper()
	r, err := smapsRollup(pid)
	if err != nil {
		t.Fatalf("shim smaps: %v", err)
	}
	sub := "vmshim-shim-" + p.id
	use := p.cgroup.readInt(t, "memory", sub, "memory.usage_in_bytes")
	peak := p.cgroup.readInt(t, "memory", sub, "memory.max_usage_in_bytes")
	t.Logf("shim, %s: RSS %.1f MiB, PSS %.1f MiB; its cgroup charged %.1f MiB, peak %.1f MiB",
		when, float64(r.RSSKiB)/1024, float64(r.PSSKiB)/1024, float64(use)/(1<<20), float64(peak)/(1<<20))
}

// TestCRIShimOOMKilled repeats a guest growing its shim past what its pod
// allows: the shim's cgroup is given a memory limit just above what it
// uses, and execs move output through the shim until the kernel's OOM
// killer ends it there. The pod ends cleanly: QEMU is gone, nothing of the
// pod is left, and the VM's status says OOMKilled.
func TestCRIShimOOMKilled(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*bootTimeout)
	defer cancel()
	p, vm := runAgentVM(ctx, t, "shimoom")
	pid := shimPidOf(t, p.id)
	sub := "vmshim-shim-" + p.id
	use := p.cgroup.readInt(t, "memory", sub, "memory.usage_in_bytes")
	limit := use + 1<<20
	if err := os.WriteFile(p.cgroup.file("memory", sub, "memory.limit_in_bytes"), []byte(strconv.FormatInt(limit, 10)), 0); err != nil {
		t.Fatalf("limit the shim's cgroup: %v", err)
	}
	t.Logf("shim pid %d: its cgroup charged %.1f MiB, limited to %.1f MiB", pid, float64(use)/(1<<20), float64(limit)/(1<<20))
	alive := func() bool { _, err := os.Stat("/proc/" + strconv.Itoa(pid)); return err == nil }
	const line = "0123456789012345678901234567890123456789012345678"
	for i := 0; i < 20 && alive(); i++ {
		// Errors are expected once the shim is gone.
		_, _ = vm.execSync(ctx, t, 60, "sh", "-c", "i=0; while [ $i -lt 20000 ]; do echo "+line+"; i=$((i+1)); done")
	}
	waitGone(ctx, t, "shim "+strconv.Itoa(pid), func() bool { return !alive() })
	st := vm.waitExited(ctx, t)
	for st.Reason != "OOMKilled" {
		select {
		case <-ctx.Done():
			t.Fatalf("the VM exited %d with reason %q, want OOMKilled\ncontainerd log:\n%s", st.ExitCode, st.Reason, p.c.d.logTail())
		case <-time.After(200 * time.Millisecond):
		}
		st = vm.status(ctx, t)
	}
	// containerd's CRI gives a task whose shim died the exit code 255
	// (its Wait fails before the delete action's status arrives).
	if st.ExitCode == 0 {
		t.Errorf("the VM exited 0 with its shim OOM-killed")
	}
	t.Logf("the VM: exit %d, reason %s", st.ExitCode, st.Reason)
	waitGone(ctx, t, "qemu of "+vm.id, func() bool { return len(processesMentioning("guest="+vm.id)) == 0 })
	p.remove(t)
	assertNothingLeftCRI(t, vm.id, p.id)
}
