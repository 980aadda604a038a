package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// resizeSeen bounds how long the guest may take to show a resize.
const resizeSeen = 10 * time.Second

// vcpuThreads maps QEMU's vCPU threads ("CPU n/TCG" or "CPU n/KVM") by
// vCPU index to their Cpus_allowed_list.
func vcpuThreads(t *testing.T, pid int) map[int]string {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/task", pid)
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]string{}
	for _, e := range entries {
		comm, err := os.ReadFile(filepath.Join(dir, e.Name(), "comm"))
		if err != nil {
			continue
		}
		var n int
		var accel string
		if _, err := fmt.Sscanf(strings.TrimSpace(string(comm)), "CPU %d/%s", &n, &accel); err != nil {
			continue
		}
		status, err := os.ReadFile(filepath.Join(dir, e.Name(), "status"))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(status), "\n") {
			if v, ok := strings.CutPrefix(line, "Cpus_allowed_list:"); ok {
				out[n] = strings.TrimSpace(v)
			}
		}
	}
	return out
}

// update sends UpdateContainerResources with cpus CPUs of quota, a memory
// limit and a cpuset ("" for none), and logs how long it took.
func (c *criContainer) update(ctx context.Context, t *testing.T, cpus int64, mem int64, cpuset string) error {
	t.Helper()
	start := time.Now()
	_, err := c.p.c.runtime.UpdateContainerResources(ctx, &runtimeapi.UpdateContainerResourcesRequest{ContainerId: c.id,
		Linux: &runtimeapi.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: cpus * 100000, MemoryLimitInBytes: mem, CpusetCpus: cpuset}})
	t.Logf("update to %d cpus, %d MiB, cpuset %q: %v in %v", cpus, mem>>20, cpuset, err == nil, time.Since(start).Round(time.Millisecond))
	return err
}

// waitGuest runs cmd in the guest until its output, trimmed, is want.
func (c *criContainer) waitGuest(ctx context.Context, t *testing.T, want string, cmd ...string) {
	t.Helper()
	deadline := time.Now().Add(resizeSeen)
	var got string
	for time.Now().Before(deadline) {
		if got = strings.TrimSpace(c.mustExec(ctx, t, cmd...)); got == want {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Errorf("guest %v: %q after %v, want %q", cmd, got, resizeSeen, want)
}

// TestCRIResize resizes a running VM through UpdateContainerResources, as
// the kubelet does for kubectl's resize subresource: its vCPU threads
// follow the cpuset, one per CPU; vCPUs are hot-plugged and unplugged and
// the guest sees them; guest RAM grows and shrinks through virtio-mem,
// the cgroup growing before the guest and shrinking after; requests the
// guest cannot meet are refused and leave the VM as it was.
func TestCRIResize(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*bootTimeout)
	defer cancel()
	const bootMiB = 512
	c := newCRI(t, env.daemon)
	p := c.runPodLimited(ctx, t, "resize", 2<<30+podOverhead)
	vm := p.createVMWith(ctx, t, imageKernelAgent, func(cfg *runtimeapi.ContainerConfig) {
		cfg.Annotations = map[string]string{"vmshim.io/max-memory": "2Gi"}
		cfg.Linux = &runtimeapi.LinuxContainerConfig{Resources: &runtimeapi.LinuxContainerResources{
			CpuPeriod: 100000, CpuQuota: 100000, MemoryLimitInBytes: bootMiB << 20, CpusetCpus: "0",
		}}
	})
	if _, err := c.runtime.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: vm.id}); err != nil {
		t.Fatalf("StartContainer: %v", err)
	}
	vm.waitLog(ctx, t, markerAgent)
	vm.waitLog(ctx, t, markerBooted)
	pid, err := pidOf("guest=" + vm.id)
	if err != nil {
		t.Fatal(err)
	}
	memLimit := func() int64 { return p.cgroup.readInt(t, "memory", vm.id, "memory.limit_in_bytes") }
	memTotal := func() int { return meminfo(t, vm.mustExec(ctx, t, "cat", "/proc/meminfo"), "MemTotal") }
	// waitMemTotal returns the guest's MemTotal once it is want, or as it
	// is after resizeSeen.
	waitMemTotal := func(want int) int {
		got := memTotal()
		for deadline := time.Now().Add(resizeSeen); got != want && time.Now().Before(deadline); got = memTotal() {
			time.Sleep(200 * time.Millisecond)
		}
		return got
	}
	// Each vCPU thread is pinned to one CPU of the cpuset, vCPU i to its
	// i-th (round robin). Under TCG the VM has from boot the vCPUs a
	// resize can reach (see docs/kubernetes.md): their threads are pinned
	// too.
	assertThreads := func(what string, cpus ...string) {
		t.Helper()
		got := vcpuThreads(t, pid)
		want := map[int]string{}
		for i := range got {
			want[i] = cpus[i%len(cpus)]
		}
		if _, ok := got[0]; !ok || fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: vcpu threads' Cpus_allowed_list %v, want %v", what, got, want)
		}
	}

	// Pinning.
	assertThreads("cpuset 0", "0")
	if err := vm.update(ctx, t, 1, bootMiB<<20, "1"); err != nil {
		t.Fatalf("update cpuset 1: %v", err)
	}
	assertThreads("cpuset 1", "1")

	// vCPUs.
	vm.waitGuest(ctx, t, "0", "cat", "/sys/devices/system/cpu/online")
	if err := vm.update(ctx, t, 2, bootMiB<<20, "0-1"); err != nil {
		t.Fatalf("update to 2 cpus: %v", err)
	}
	vm.waitGuest(ctx, t, "0-1", "cat", "/sys/devices/system/cpu/online")
	assertThreads("2 cpus on cpuset 0-1", "0", "1")
	if n := len(vcpuThreads(t, pid)); n < 2 {
		t.Errorf("%d vcpu threads with 2 cpus", n)
	}
	if got := p.cgroup.readInt(t, "cpu", vm.id, "cpu.cfs_quota_us"); got != 200000 {
		t.Errorf("2 cpus: cpu.cfs_quota_us %d, want 200000", got)
	}
	if err := vm.update(ctx, t, 1, bootMiB<<20, "0-1"); err != nil {
		t.Fatalf("update back to 1 cpu: %v", err)
	}
	vm.waitGuest(ctx, t, "0", "cat", "/sys/devices/system/cpu/online")
	assertThreads("1 cpu on cpuset 0-1", "0", "1")
	if err := vm.update(ctx, t, 2, bootMiB<<20, "0-1"); err != nil {
		t.Fatalf("update to 2 cpus again: %v", err)
	}
	vm.waitGuest(ctx, t, "0-1", "cat", "/sys/devices/system/cpu/online")
	if err := vm.update(ctx, t, 1, bootMiB<<20, "0-1"); err != nil {
		t.Fatalf("update back to 1 cpu again: %v", err)
	}
	vm.waitGuest(ctx, t, "0", "cat", "/sys/devices/system/cpu/online")

	// Memory.
	before := memTotal()
	if got := memLimit(); got != bootMiB<<20+memoryOverhead {
		t.Errorf("cgroup memory limit %d, want %d", got, bootMiB<<20+memoryOverhead)
	}
	if err := vm.update(ctx, t, 1, 1<<30, "0-1"); err != nil {
		t.Fatalf("update memory to 1Gi: %v", err)
	}
	// QEMU counts a block as plugged when the guest's driver has taken
	// it; the guest adds its pages to MemTotal a moment later.
	grown := waitMemTotal(before + 512<<10)
	t.Logf("MemTotal %d KiB at boot, %d KiB at 1Gi", before, grown)
	if grown-before != 512<<10 {
		t.Errorf("MemTotal grew by %d KiB, want %d", grown-before, 512<<10)
	}
	if got := memLimit(); got != 1<<30+memoryOverhead {
		t.Errorf("cgroup memory limit %d at 1Gi, want %d", got, 1<<30+memoryOverhead)
	}
	st := vm.status(ctx, t)
	if r := st.GetResources().GetLinux(); r.GetMemoryLimitInBytes() != 1<<30 || r.GetCpuQuota() != 100000 {
		t.Errorf("ContainerStatus resources %v, want a 1Gi memory limit and 1 cpu", r)
	}
	if err := vm.update(ctx, t, 1, bootMiB<<20, "0-1"); err != nil {
		t.Fatalf("update memory back to 512Mi: %v", err)
	}
	if after := waitMemTotal(before); after != before {
		t.Errorf("MemTotal %d KiB back at 512Mi, want %d", after, before)
	}
	if got := memLimit(); got != bootMiB<<20+memoryOverhead {
		t.Errorf("cgroup memory limit %d back at 512Mi, want %d", got, bootMiB<<20+memoryOverhead)
	}

	// Refusals leave the VM as it was.
	for _, bad := range []struct {
		cpus, mem int64
		want      string
	}{
		{1, 256 << 20, "memory limit of 256 MiB is below the 512 MiB the guest booted with"},
		{1, 3 << 30, "memory limit of 3072 MiB is more than the 2048 MiB guest RAM can grow to (vmshim.io/max-memory)"},
		{17, bootMiB << 20, "cpu limit of 17 vcpus is more than the 16 the guest can have"},
	} {
		err := vm.update(ctx, t, bad.cpus, bad.mem, "0-1")
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("update to %d cpus, %d MiB: %v, want %q", bad.cpus, bad.mem>>20, err, bad.want)
		}
	}
	if after := waitMemTotal(before); after != before {
		t.Errorf("MemTotal %d KiB after the refusals, want %d", after, before)
	}
	vm.waitGuest(ctx, t, "0", "cat", "/sys/devices/system/cpu/online")
	st = vm.status(ctx, t)
	if r := st.GetResources().GetLinux(); r.GetMemoryLimitInBytes() != bootMiB<<20 {
		t.Errorf("ContainerStatus resources %v after the refusals, want the 512Mi limit", r)
	}
	p.remove(t)
	assertNothingLeftCRI(t, vm.id)
}

// TestCRIHugePages boots a VM whose container mounts a hugetlbfs volume,
// as a Kubernetes pod with a hugepages-2Mi request and an emptyDir of
// medium HugePages does: guest RAM is taken from the host's 2 MiB pages
// up front, and given back when the pod goes. (With containerd's default
// disable_hugetlb_controller the spec carries no hugepages limit: the
// volume is what tells the shim.)
func TestCRIHugePages(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*bootTimeout)
	defer cancel()
	const guestMiB = 384
	reserve(t, guestMiB/2+16)
	free := func() int { return meminfo(t, readFile(t, "/proc/meminfo"), "HugePages_Free") }
	freeBefore := free()
	vol := t.TempDir()
	if err := unix.Mount("vmshim-test", vol, "hugetlbfs", 0, "pagesize=2M"); err != nil {
		t.Fatalf("mount hugetlbfs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(vol, unix.MNT_DETACH) })

	c := newCRI(t, env.daemon)
	p := c.runPodLimited(ctx, t, "hugepages", guestMiB<<20+podOverhead)
	vm := p.createVMWith(ctx, t, imageKernelAgent, func(cfg *runtimeapi.ContainerConfig) {
		cfg.Linux = &runtimeapi.LinuxContainerConfig{Resources: &runtimeapi.LinuxContainerResources{
			MemoryLimitInBytes: guestMiB << 20,
			HugepageLimits:     []*runtimeapi.HugepageLimit{{PageSize: "2MB", Limit: guestMiB << 20}},
		}}
		cfg.Mounts = append(cfg.Mounts, &runtimeapi.Mount{ContainerPath: "/hugepages-2Mi", HostPath: vol})
	})
	if _, err := c.runtime.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: vm.id}); err != nil {
		t.Fatalf("StartContainer: %v", err)
	}
	vm.waitLog(ctx, t, markerAgent)
	if used := freeBefore - free(); used != guestMiB/2 {
		t.Errorf("the VM took %d huge pages, want %d (all its RAM, preallocated)", used, guestMiB/2)
	}
	memTotal := meminfo(t, vm.mustExec(ctx, t, "cat", "/proc/meminfo"), "MemTotal")
	if memTotal > guestMiB<<10 || memTotal < (guestMiB-64)<<10 {
		t.Errorf("guest MemTotal %d KiB, want about %d MiB", memTotal, guestMiB)
	}
	if qemuHasBalloon(t, vm.id) {
		t.Errorf("guest RAM on huge pages, and qemu has %s", balloonArg)
	}
	p.remove(t)
	assertNothingLeftCRI(t, vm.id)
	if after := free(); after != freeBefore {
		t.Errorf("%d huge pages free after the pod, want %d", after, freeBefore)
	}

	// Guest RAM that is not a whole number of pages is refused in one
	// line, and takes none.
	p = c.runPodLimited(ctx, t, "hugepages-bad", 512<<20+podOverhead)
	created, err := c.runtime.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: p.id, SandboxConfig: p.config,
		Config: &runtimeapi.ContainerConfig{
			Metadata:    &runtimeapi.ContainerMetadata{Name: "vm"},
			Image:       &runtimeapi.ImageSpec{Image: imageKernelAgent},
			Annotations: map[string]string{"vmshim.io/memory": "385Mi"},
			Linux:       &runtimeapi.LinuxContainerConfig{Resources: &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: 512 << 20}},
			Mounts:      []*runtimeapi.Mount{{ContainerPath: "/hugepages-2Mi", HostPath: vol}},
		}})
	if err == nil {
		// containerd's CRI creates the task, and so the VM, at start.
		_, err = c.runtime.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: created.ContainerId})
	}
	if err == nil {
		t.Fatal("385 MiB of guest RAM on 2 MiB pages was accepted")
	}
	if !strings.Contains(err.Error(), "a hugetlbfs volume: guest RAM of 385 MiB is not a whole number of 2 MiB huge pages") {
		t.Errorf("refusal %q", err)
	}
	p.remove(t)
	if after := free(); after != freeBefore {
		t.Errorf("%d huge pages free after the refused pod, want %d", after, freeBefore)
	}

	// A balloon asked for cannot give back guest RAM on huge pages: the
	// VM is refused in one line.
	p = c.runPodLimited(ctx, t, "hugepages-balloon", guestMiB<<20+podOverhead)
	created, err = c.runtime.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: p.id, SandboxConfig: p.config,
		Config: &runtimeapi.ContainerConfig{
			Metadata:    &runtimeapi.ContainerMetadata{Name: "vm"},
			Image:       &runtimeapi.ImageSpec{Image: imageKernelAgent},
			Annotations: map[string]string{"vmshim.io/balloon": "on"},
			Linux:       &runtimeapi.LinuxContainerConfig{Resources: &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: guestMiB << 20}},
			Mounts:      []*runtimeapi.Mount{{ContainerPath: "/hugepages-2Mi", HostPath: vol}},
		}})
	if err == nil {
		_, err = c.runtime.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: created.ContainerId})
	}
	if err == nil || !strings.Contains(err.Error(), "annotation vmshim.io/balloon: on: guest RAM on huge pages (as a hugetlbfs volume asks) is preallocated and cannot be given back") {
		t.Errorf("a balloon asked for on huge pages: %v, want a refusal", err)
	}
	p.remove(t)
	if after := free(); after != freeBefore {
		t.Errorf("%d huge pages free after the refused pod, want %d", after, freeBefore)
	}
}

// reserve has the kernel keep n 2 MiB huge pages more for the test, and
// gives them back at its end.
func reserve(t *testing.T, n int) {
	t.Helper()
	const knob = "/proc/sys/vm/nr_hugepages"
	old, err := strconv.Atoi(strings.TrimSpace(readFile(t, knob)))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(knob, []byte(strconv.Itoa(old+n)), 0); err != nil {
		t.Skipf("this kernel does not let the test reserve huge pages: %v", err)
	}
	t.Cleanup(func() { _ = os.WriteFile(knob, []byte(strconv.Itoa(old)), 0) })
	if got, _ := strconv.Atoi(strings.TrimSpace(readFile(t, knob))); got < old+n {
		t.Skipf("the kernel reserved %d of %d huge pages (memory too fragmented)", got-old, n)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
