package integration

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"sigs.k8s.io/yaml"

	"github.com/vmshim/vmshim/config"
)

// The overhead part of the memory section: what a VM pod holds beyond its
// guest RAM once the guest has filled all of it, by guest size and vCPU
// count, against what the shim's memory_overhead and the RuntimeClass's
// overhead allow (docs/kubernetes.md, "The RuntimeClass and its
// overhead").
var (
	overheadGuestMiB = []int{256, 1024, 4096}
	overheadVCPUs    = []int{1, 2}
)

// overheadMargin is how far the allowances must stand above the highest
// peak measured: QEMU's own memory differs with the guest's work, and
// under KVM (not measured here) it has no translation cache but more
// per-vCPU state.
const overheadMargin = 1.25

// overheadRun is one VM pod whose guest filled its RAM.
type overheadRun struct {
	GuestMiB int `json:"guest_mib"`
	VCPUs    int `json:"vcpus"`
	// GuestKiB is the guest RAM resident in QEMU once filled.
	GuestKiB int `json:"qemu_guest_ram_kib"`
	// QEMUPeakKiB and PodPeakKiB are the peaks (max_usage_in_bytes) of
	// the container's cgroup, which holds QEMU alone, and of the pod's,
	// which holds QEMU, the pause process and the shim.
	QEMUPeakKiB int `json:"qemu_cgroup_peak_kib"`
	PodPeakKiB  int `json:"pod_cgroup_peak_kib"`
	// QEMU and Shim are the processes' memory once the guest had filled
	// its RAM and execs had moved 5 MB through the shim.
	QEMU rollup `json:"qemu"`
	Shim rollup `json:"shim"`
	// OOMKills are the kernel's OOM kills in the pod's cgroups.
	OOMKills int `json:"oom_kills"`
}

// qemuBeyondKiB is what memory_overhead must hold: the container cgroup's
// peak beyond the guest RAM resident, or QEMU's RSS beyond it where that
// is more (a node's first QEMU is charged for the binary's and the
// libraries' pages; the others share them).
func (o overheadRun) qemuBeyondKiB() int { return max(o.QEMUPeakKiB, o.QEMU.RSSKiB) - o.GuestKiB }

// podBeyondKiB is what the RuntimeClass overhead must hold: the pod
// cgroup's peak beyond the guest RAM resident, or QEMU's and the shim's
// RSS beyond it where that is more.
func (o overheadRun) podBeyondKiB() int {
	return max(o.PodPeakKiB, o.QEMU.RSSKiB+o.Shim.RSSKiB) - o.GuestKiB
}

// overheadSection is the overhead part's runs and the allowances they
// were measured against.
type overheadSection struct {
	Runs []overheadRun `json:"runs"`
	// MemoryOverheadKiB is the config's default memory_overhead;
	// RuntimeClassKiB deploy/runtimeclass.yaml's overhead.podFixed.memory.
	MemoryOverheadKiB int `json:"memory_overhead_kib"`
	RuntimeClassKiB   int `json:"runtimeclass_overhead_kib"`
}

// benchOverhead boots the agent guest at each size and vCPU count, has it
// fill its RAM and move output through the shim, and reads the peaks.
func benchOverhead(ctx context.Context, t *testing.T, c *cri) *overheadSection {
	rc, err := runtimeClassOverhead()
	if err != nil {
		t.Fatal(err)
	}
	if rc != podOverhead {
		t.Errorf("deploy/runtimeclass.yaml's overhead is %d MiB, the suite's podOverhead %d MiB", rc>>20, podOverhead>>20)
	}
	if mo := config.Default().MemoryOverheadBytes(); mo != memoryOverhead {
		t.Errorf("the default memory_overhead is %d MiB, the suite's memoryOverhead %d MiB", mo>>20, memoryOverhead>>20)
	}
	out := &overheadSection{MemoryOverheadKiB: memoryOverhead >> 10, RuntimeClassKiB: int(rc >> 10)}
	for _, mib := range overheadGuestMiB {
		for _, vcpus := range overheadVCPUs {
			t.Run(fmt.Sprintf("%s-overhead-%dMiB-%dcpu", sectionMemory, mib, vcpus), func(t *testing.T) {
				o := overheadRun{GuestMiB: mib, VCPUs: vcpus}
				overheadOne(ctx, t, c, &o)
				out.Runs = append(out.Runs, o)
			})
		}
	}
	return out
}

// overheadOne measures one VM pod of o.GuestMiB and o.VCPUs.
func overheadOne(ctx context.Context, t *testing.T, c *cri, o *overheadRun) {
	p := c.runPodLimited(ctx, t, fmt.Sprintf("bench-overhead-%d-%d", o.GuestMiB, o.VCPUs), int64(o.GuestMiB)<<20+podOverhead)
	defer p.remove(t)
	vm := p.createVMWith(ctx, t, imageKernelAgent, func(cfg *runtimeapi.ContainerConfig) {
		cfg.Linux = &runtimeapi.LinuxContainerConfig{Resources: &runtimeapi.LinuxContainerResources{
			CpuPeriod: 100000, CpuQuota: int64(o.VCPUs) * 100000, MemoryLimitInBytes: int64(o.GuestMiB) << 20,
		}}
	})
	if _, err := c.runtime.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: vm.id}); err != nil {
		t.Fatalf("StartContainer: %v", err)
	}
	vm.waitLog(ctx, t, markerAgent)
	vm.waitLog(ctx, t, markerBooted)
	qemuPid, err := pidOf("guest=" + vm.id)
	if err != nil {
		t.Fatal(err)
	}
	// All the guest's RAM MemAvailable says, less a little, into a tmpfs,
	// as TestCRIResources does; then 5 MB of exec output through the
	// shim, as TestCRIShimChargedToPod does.
	vm.mustExec(ctx, t, fillGuestRAM...)
	for range 5 {
		execMegabyte(ctx, t, vm)
	}
	q, err := processMemory(qemuPid, o.GuestMiB)
	if err != nil {
		t.Fatal(err)
	}
	o.GuestKiB = q.guestKiB
	if o.QEMU, err = smapsRollup(qemuPid); err != nil {
		t.Fatal(err)
	}
	if o.Shim, err = smapsRollup(shimPidOf(t, p.id)); err != nil {
		t.Fatal(err)
	}
	o.QEMUPeakKiB = int(p.cgroup.readInt(t, "memory", vm.id, "memory.max_usage_in_bytes") >> 10)
	o.PodPeakKiB = int(p.cgroup.readInt(t, "memory", "", "memory.max_usage_in_bytes") >> 10)
	for _, sub := range []string{vm.id, ""} {
		o.OOMKills += oomKills(t, p.cgroup.file("memory", sub, "memory.oom_control"))
	}
	if st := vm.status(ctx, t); st.State != runtimeapi.ContainerState_CONTAINER_RUNNING || o.OOMKills != 0 {
		t.Errorf("after filling its RAM the VM is %v (exit %d, %s), %d OOM kills", st.State, st.ExitCode, st.Reason, o.OOMKills)
	}
	if o.GuestKiB < o.GuestMiB<<10*9/10 {
		t.Errorf("guest RAM resident in qemu: %d KiB of %d MiB; the fill did not reach the host", o.GuestKiB, o.GuestMiB)
	}
	t.Logf("%d MiB, %d vCPU: guest RAM resident %d MiB; beyond it: QEMU's cgroup peak %d MiB, the pod's %d MiB, QEMU RSS %d MiB, PSS %d MiB; shim RSS %d MiB, PSS %d MiB",
		o.GuestMiB, o.VCPUs, o.GuestKiB>>10, (o.QEMUPeakKiB-o.GuestKiB)>>10, (o.PodPeakKiB-o.GuestKiB)>>10,
		(o.QEMU.RSSKiB-o.GuestKiB)>>10, (o.QEMU.PSSKiB-o.GuestKiB)>>10, o.Shim.RSSKiB>>10, o.Shim.PSSKiB>>10)
	p.remove(t)
	assertNothingLeftCRI(t, vm.id, p.id)
}

// runtimeClassOverhead reads overhead.podFixed.memory from
// deploy/runtimeclass.yaml, in bytes.
func runtimeClassOverhead() (int64, error) {
	path := filepath.Join("..", "deploy", "runtimeclass.yaml")
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	var rc nodev1.RuntimeClass
	if err := yaml.UnmarshalStrict(data, &rc); err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	if rc.Overhead == nil {
		return 0, fmt.Errorf("%s: no overhead", path)
	}
	q, ok := rc.Overhead.PodFixed[corev1.ResourceMemory]
	if !ok {
		return 0, fmt.Errorf("%s: no overhead.podFixed.memory", path)
	}
	return q.Value(), nil
}

// overheadRows adds the overhead part's figures: each run's, then the
// highest against the allowances.
func (r *benchReport) overheadRows(tab *summary) {
	m := r.Memory
	if m == nil || m.Overhead == nil {
		return
	}
	o := m.Overhead
	qemuMax, podMax := math.NaN(), math.NaN()
	for _, run := range o.Runs {
		p := fmt.Sprintf("memory, guest RAM filled, %d MiB and %d vCPU: ", run.GuestMiB, run.VCPUs)
		qemu, pod := float64(run.qemuBeyondKiB())/1024, float64(run.podBeyondKiB())/1024
		tab.add(p+"QEMU's cgroup peak beyond guest RAM", float64(run.QEMUPeakKiB-run.GuestKiB)/1024, "MiB", "", "")
		tab.add(p+"the pod's cgroup peak beyond guest RAM", float64(run.PodPeakKiB-run.GuestKiB)/1024, "MiB", "", "")
		tab.add(p+"QEMU RSS beyond guest RAM", float64(run.QEMU.RSSKiB-run.GuestKiB)/1024, "MiB", "", "")
		tab.add(p+"QEMU PSS beyond guest RAM", float64(run.QEMU.PSSKiB-run.GuestKiB)/1024, "MiB", "", "")
		tab.add(p+"shim RSS", float64(run.Shim.RSSKiB)/1024, "MiB", "", "")
		qemuMax, podMax = nanMax(qemuMax, qemu), nanMax(podMax, pod)
	}
	mo, rc := float64(o.MemoryOverheadKiB)/1024, float64(o.RuntimeClassKiB)/1024
	tab.add("memory, guest RAM filled: QEMU beyond guest RAM, highest (cgroup peak or RSS)", qemuMax, "MiB",
		fmt.Sprintf("≤ memory_overhead %.0f MiB / %.2f", mo, overheadMargin), gapBelow(qemuMax, mo/overheadMargin, "MiB"))
	tab.add("memory, guest RAM filled: the pod beyond guest RAM, highest (cgroup peak or QEMU's and the shim's RSS)", podMax, "MiB",
		fmt.Sprintf("≤ RuntimeClass overhead %.0f MiB / %.2f", rc, overheadMargin), gapBelow(podMax, rc/overheadMargin, "MiB"))
}

// nanMax is the larger of a and b, b where a is NaN.
func nanMax(a, b float64) float64 {
	if math.IsNaN(a) {
		return b
	}
	return math.Max(a, b)
}
