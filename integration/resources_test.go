package integration

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/pkg/namespaces"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

const (
	// podOverhead is the RuntimeClass's overhead.podFixed.memory
	// (deploy/runtimeclass.yaml): the kubelet adds it to the pod cgroup's
	// memory limit.
	podOverhead = 192 << 20
	// memoryOverhead is the shim's default memory_overhead: the VM's
	// cgroup allows guest RAM plus this.
	memoryOverhead = 128 << 20
)

// TestCRIResources runs a VM with limits cpu=2 and memory=512Mi in a pod
// cgroup limited as the kubelet would limit it: the guest has 2 CPUs and
// 512 MiB, QEMU runs in the container's cgroup, filling guest RAM does not
// OOM-kill it, stats report the VM, Pause stops its CPU use and Resume
// restarts it, and UpdateContainerResources applies CPU limits and refuses
// a memory change, since the VM has no vmshim.io/max-memory (TestCRIResize
// resizes).
func TestCRIResources(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*bootTimeout)
	defer cancel()
	const guestMiB = 512
	c := newCRI(t, env.daemon)
	p := c.runPodLimited(ctx, t, "resources", guestMiB<<20+podOverhead)
	vm := p.createVMWith(ctx, t, imageKernelAgent, func(cfg *runtimeapi.ContainerConfig) {
		cfg.Linux = &runtimeapi.LinuxContainerConfig{Resources: &runtimeapi.LinuxContainerResources{
			CpuPeriod: 100000, CpuQuota: 200000, MemoryLimitInBytes: guestMiB << 20,
		}}
	})
	if _, err := c.runtime.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: vm.id}); err != nil {
		t.Fatalf("StartContainer: %v", err)
	}
	vm.waitLog(ctx, t, markerAgent)
	vm.waitLog(ctx, t, markerBooted)

	// The guest's size.
	if n := strings.TrimSpace(vm.mustExec(ctx, t, "nproc")); n != "2" {
		t.Errorf("guest CPUs: %q, want 2", n)
	}
	memTotal := meminfo(t, vm.mustExec(ctx, t, "cat", "/proc/meminfo"), "MemTotal")
	if memTotal > guestMiB<<10 || memTotal < (guestMiB-64)<<10 {
		t.Errorf("guest MemTotal %d KiB, want about %d MiB", memTotal, guestMiB)
	}

	// QEMU in the container's cgroup, with its limits.
	qemuPid, err := pidOf("guest=" + vm.id)
	if err != nil {
		t.Fatal(err)
	}
	want := p.cgroup.path + "/" + vm.id
	for _, ctrl := range []string{"memory", "cpu", "cpuacct", "pids"} {
		if got := cgroupOf(t, qemuPid, ctrl); got != want {
			t.Errorf("qemu's %s cgroup is %s, want %s", ctrl, got, want)
		}
	}
	if got := p.cgroup.readInt(t, "cpu", vm.id, "cpu.cfs_quota_us"); got != 200000 {
		t.Errorf("cpu.cfs_quota_us %d, want 200000", got)
	}
	if got := p.cgroup.readInt(t, "memory", vm.id, "memory.limit_in_bytes"); got != guestMiB<<20+memoryOverhead {
		t.Errorf("memory.limit_in_bytes %d, want guest RAM + memory_overhead = %d", got, guestMiB<<20+memoryOverhead)
	}

	// Stats.
	cs, err := c.runtime.ContainerStats(ctx, &runtimeapi.ContainerStatsRequest{ContainerId: vm.id})
	if err != nil {
		t.Fatalf("ContainerStats: %v", err)
	}
	if cs.Stats.GetCpu().GetUsageCoreNanoSeconds().GetValue() == 0 || cs.Stats.GetMemory().GetWorkingSetBytes().GetValue() == 0 {
		t.Errorf("ContainerStats: %v", cs.Stats)
	}
	ps, err := c.runtime.PodSandboxStats(ctx, &runtimeapi.PodSandboxStatsRequest{PodSandboxId: p.id})
	if err != nil {
		t.Fatalf("PodSandboxStats: %v", err)
	}
	if ps.Stats.GetLinux().GetCpu().GetUsageCoreNanoSeconds().GetValue() == 0 || ps.Stats.GetLinux().GetMemory().GetWorkingSetBytes().GetValue() == 0 {
		t.Errorf("PodSandboxStats: %v", ps.Stats)
	}

	// Fill guest RAM: everything MemAvailable says, less a little, into a
	// tmpfs, whose pages the guest cannot give back.
	out := vm.mustExec(ctx, t, "sh", "-c",
		`mkdir -p /fill && mount -t tmpfs -o size=100% fill /fill && `+
			`kb=$(sed -n 's/^MemAvailable: *\([0-9]*\) kB/\1/p' /proc/meminfo) && `+
			`dd if=/dev/zero of=/fill/zero bs=1M count=$((kb / 1024 - 16)) 2>&1 && grep MemAvailable /proc/meminfo`)
	t.Logf("filled guest RAM: %s", strings.Join(strings.Fields(out), " "))
	m, err := processMemory(qemuPid, guestMiB)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("qemu rss %d MiB: guest RAM %d MiB, overhead %d MiB; cgroup peak %d MiB of %d MiB",
		m.rssKiB>>10, m.guestKiB>>10, m.overheadKiB()>>10,
		p.cgroup.readInt(t, "memory", vm.id, "memory.max_usage_in_bytes")>>20,
		p.cgroup.readInt(t, "memory", vm.id, "memory.limit_in_bytes")>>20)
	if m.guestKiB < (guestMiB-96)<<10 {
		t.Errorf("guest RAM resident in qemu: %d KiB; the fill did not reach the host", m.guestKiB)
	}
	if st := vm.status(ctx, t); st.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("after filling guest RAM the VM is %v (exit %d, %s)", st.State, st.ExitCode, st.Reason)
	}
	for _, sub := range []string{vm.id, ""} {
		if n := oomKills(t, p.cgroup.file("memory", sub, "memory.oom_control")); n != 0 {
			t.Errorf("cgroup %s/%s: %d OOM kills", p.cgroup.path, sub, n)
		}
	}

	// Pause and resume, measured by the cgroup's CPU time while the guest
	// spins.
	vm.mustExec(ctx, t, "sh", "-c", "while :; do :; done >/dev/null 2>&1 </dev/null &")
	usage := func() time.Duration {
		return time.Duration(p.cgroup.readInt(t, "cpuacct", vm.id, "cpuacct.usage"))
	}
	over := func() time.Duration {
		before := usage()
		time.Sleep(2 * time.Second)
		return usage() - before
	}
	running := over()
	cctx := namespaces.WithNamespace(ctx, criNamespace)
	ctr, err := env.client.LoadContainer(cctx, vm.id)
	if err != nil {
		t.Fatal(err)
	}
	task, err := ctr.Task(cctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := task.Pause(cctx); err != nil {
		t.Fatalf("pause: %v", err)
	}
	paused := over()
	if err := task.Resume(cctx); err != nil {
		t.Fatalf("resume: %v", err)
	}
	resumed := over()
	t.Logf("cpu time over 2 s: running %v, paused %v, resumed %v", running, paused, resumed)
	if paused*4 > running || resumed*4 < running {
		t.Errorf("cpu time over 2 s: running %v, paused %v, resumed %v: pause should stop it and resume restart it", running, paused, resumed)
	}

	// Updates.
	_, err = c.runtime.UpdateContainerResources(ctx, &runtimeapi.UpdateContainerResourcesRequest{ContainerId: vm.id,
		Linux: &runtimeapi.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: 100000, MemoryLimitInBytes: guestMiB << 20}})
	if err != nil {
		t.Errorf("update cpu: %v", err)
	} else if got := p.cgroup.readInt(t, "cpu", vm.id, "cpu.cfs_quota_us"); got != 100000 {
		t.Errorf("after update: cpu.cfs_quota_us %d, want 100000", got)
	}
	_, err = c.runtime.UpdateContainerResources(ctx, &runtimeapi.UpdateContainerResourcesRequest{ContainerId: vm.id,
		Linux: &runtimeapi.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: 100000, MemoryLimitInBytes: 1 << 30}})
	if err == nil || !strings.Contains(err.Error(), "memory limit cannot change on a running VM: guest RAM can grow only up to vmshim.io/max-memory") {
		t.Errorf("update memory: %v, want a refusal", err)
	}
	p.remove(t)
	assertNothingLeftCRI(t, vm.id)
}

// meminfo returns a /proc/meminfo field in KiB.
func meminfo(t *testing.T, text, field string) int {
	t.Helper()
	for _, line := range strings.Split(text, "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == field+":" {
			n, err := strconv.Atoi(f[1])
			if err == nil {
				return n
			}
		}
	}
	t.Fatalf("no %s in meminfo: %q", field, text)
	return 0
}

// oomKills reads the oom_kill count of a cgroup v1 memory.oom_control.
func oomKills(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, " "); ok && k == "oom_kill" {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	return 0
}
