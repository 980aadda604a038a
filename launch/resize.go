package launch

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/vmshim/vmshim/config"
	"github.com/vmshim/vmshim/qemu"
	"github.com/vmshim/vmshim/topology"
)

// resizeTimeout bounds how long a resize waits for the guest: to bring
// hot-plugged vCPUs online, to release one, or to plug or unplug memory.
const resizeTimeout = 20 * time.Second

// onlinePoll is how often the guest is asked to online new vCPUs.
const onlinePoll = 200 * time.Millisecond

// resizer changes a running VM's vCPUs, guest RAM and pinning when its
// container's resources change (UpdateContainerResources, kubectl's
// resize subresource): vCPUs are hot-plugged and unplugged within the
// topology the guest booted with, guest RAM grows and shrinks through
// virtio-mem within max_memory, and the vCPU threads follow the cpuset.
// The cgroup grows before the guest and shrinks after it. A change the
// guest cannot make fails and leaves the VM as it was.
type resizer struct {
	mu      sync.Mutex // one resize at a time; guards the fields below
	limits  *cgroupLimits
	proc    *qemu.VM
	accel   qemu.Accel
	logger  *log.Entry
	sysfs   string                // where the host's NUMA nodes are read from
	timeout time.Duration         // resizeTimeout, or shorter in tests
	applied *specs.LinuxResources // the resources in force

	topo       qemu.Topology
	vcpus      int // vCPUs the guest has online now, 0..vcpus-1
	plugged    int // vCPUs QEMU has, ≥ vcpus (under TCG the rest are offline)
	maxVCPUs   int
	vcpusFixed bool

	bootMiB    int // guest RAM outside virtio-mem
	memMiB     int // guest RAM now
	maxMemMiB  int // bootMiB + the virtio-mem region
	memFixedBy string

	cpus, mems topology.CPUSet // the cpuset the vCPUs are pinned to; nil for none
	numa       []int           // host nodes of the guest's NUMA nodes; nil for none
}

// Update applies new resources to the VM.
func (z *resizer) Update(ctx context.Context, r *specs.LinuxResources) error {
	if r == nil {
		return fmt.Errorf("no resources given: %w", errdefs.ErrInvalidArgument)
	}
	z.mu.Lock()
	defer z.mu.Unlock()
	if !z.limits.has() {
		return fmt.Errorf("task has no cgroup to apply limits to: %w", errdefs.ErrFailedPrecondition)
	}
	vcpus, err := z.wantVCPUs(r)
	if err != nil {
		return err
	}
	memMiB, err := z.wantMemory(r)
	if err != nil {
		return err
	}
	cpus, mems, layout, err := z.wantCpuset(r)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, z.timeout)
	defer cancel()

	// Memory first, so that a guest that cannot meet it leaves nothing
	// else changed.
	oldMem := z.memMiB
	if err := z.resizeMemory(ctx, r, memMiB); err != nil {
		return err
	}
	undoMemory := func() {
		if memMiB != oldMem {
			uctx, ucancel := context.WithTimeout(context.WithoutCancel(ctx), z.timeout)
			defer ucancel()
			if uerr := z.resizeMemory(uctx, z.applied, oldMem); uerr != nil {
				z.logger.WithError(uerr).Warn("resize: could not give the guest back its memory")
			}
		}
	}
	if err := z.limits.apply(r); err != nil {
		undoMemory()
		return err
	}
	if err := z.resizeVCPUs(ctx, vcpus); err != nil {
		if uerr := z.limits.apply(z.applied); uerr != nil {
			z.logger.WithError(uerr).Warn("resize: could not set the cgroup back")
		}
		undoMemory()
		return err
	}
	// Writing cpuset.cpus resets every thread's affinity to the new set:
	// pin again after every cgroup update. The new resources are in
	// force by now, so a failure to pin leaves the vCPUs free within the
	// cgroup's cpuset, and is logged.
	z.cpus, z.mems = cpus, mems
	if err := z.pin(ctx, layout); err != nil {
		z.logger.WithError(err).Warn("resize: vcpus left unpinned within the cpuset")
	}
	z.applied = r
	z.limits.followLimit(r)
	z.logger.WithFields(log.Fields{"vcpus": z.vcpus, "memory_mib": z.memMiB, "cpuset": z.cpus.String()}).Info("resources updated")
	return nil
}

// wantVCPUs is the vCPU count r's CPU limit gives, or the count now when
// it sets none or vmshim.io/vcpus fixed it.
func (z *resizer) wantVCPUs(r *specs.LinuxResources) (int, error) {
	n, ok := config.VCPUsForCPU(r.CPU)
	if !ok || z.vcpusFixed {
		return z.vcpus, nil
	}
	if n > uint64(z.maxVCPUs) {
		return 0, fmt.Errorf("cpu limit of %d vcpus is more than the %d the guest can have (max_vcpus or %s): %w",
			n, z.maxVCPUs, config.AnnotationCPUTopology, errdefs.ErrInvalidArgument)
	}
	return int(n), nil
}

// wantMemory is the guest RAM r's memory limit gives, in MiB: a whole
// number of virtio-mem blocks above the RAM the guest booted with.
func (z *resizer) wantMemory(r *specs.LinuxResources) (int, error) {
	if r.Memory == nil || r.Memory.Limit == nil || *r.Memory.Limit <= 0 || *r.Memory.Limit == z.limits.limitOf() {
		return z.memMiB, nil
	}
	limit := *r.Memory.Limit
	if z.memFixedBy != "" {
		return 0, fmt.Errorf("memory limit cannot change on a running VM: %s (%d MiB); recreate the pod to resize it: %w",
			z.memFixedBy, z.memMiB, errdefs.ErrNotImplemented)
	}
	mib := int(limit >> 20)
	mib -= (mib - z.bootMiB) % qemu.VirtioMemBlockMiB
	switch {
	case limit>>20 < int64(z.bootMiB):
		return 0, fmt.Errorf("memory limit of %d MiB is below the %d MiB the guest booted with, which cannot be unplugged; recreate the pod to shrink it further: %w",
			limit>>20, z.bootMiB, errdefs.ErrInvalidArgument)
	case mib > z.maxMemMiB:
		return 0, fmt.Errorf("memory limit of %d MiB is more than the %d MiB guest RAM can grow to (vmshim.io/max-memory): %w",
			limit>>20, z.maxMemMiB, errdefs.ErrInvalidArgument)
	}
	return mib, nil
}

// wantCpuset parses r's cpuset and plans the vCPUs on it. The guest's
// NUMA nodes are fixed at boot, so a cpuset that would need others is
// refused.
func (z *resizer) wantCpuset(r *specs.LinuxResources) (cpus, mems topology.CPUSet, layout topology.Layout, err error) {
	if r.CPU == nil || r.CPU.Cpus == "" {
		return nil, nil, topology.Layout{}, nil
	}
	if cpus, err = topology.ParseCPUSet(r.CPU.Cpus); err != nil {
		return nil, nil, layout, fmt.Errorf("linux.resources.cpu.cpus: %w", err)
	}
	if mems, err = topology.ParseCPUSet(r.CPU.Mems); err != nil {
		return nil, nil, layout, fmt.Errorf("linux.resources.cpu.mems: %w", err)
	}
	hosts, err := topology.ReadHostNodes(z.sysfs)
	if err != nil {
		return nil, nil, layout, err
	}
	if layout, err = topology.Plan(cpus, mems, z.topo.CPUs(), max(z.memMiB, 2*len(hosts)), hosts); err != nil {
		return nil, nil, layout, err
	}
	var numa []int
	for _, n := range layout.Nodes {
		numa = append(numa, n.HostNode)
	}
	if fmt.Sprint(numa) != fmt.Sprint(z.numa) {
		what := fmt.Sprintf("span host nodes %v", numa)
		if len(numa) == 0 {
			what = "lie in one host node"
		}
		booted := fmt.Sprintf("with NUMA nodes on host nodes %v", z.numa)
		if len(z.numa) == 0 {
			booted = "without NUMA nodes"
		}
		return nil, nil, layout, fmt.Errorf("cpuset cpus %s %s, and the guest booted %s; recreate the pod to change its NUMA nodes: %w",
			cpus, what, booted, errdefs.ErrInvalidArgument)
	}
	return cpus, mems, layout, nil
}

// resizeMemory gives the guest mib of RAM: for more, the cgroup grows
// first (r's limits with the new guest RAM), then the guest; for less,
// the guest gives memory back first, and the cgroup shrinks with the
// update that follows.
func (z *resizer) resizeMemory(ctx context.Context, r *specs.LinuxResources, mib int) error {
	if mib == z.memMiB {
		return nil
	}
	old := z.limits.guestBytes()
	if mib > z.memMiB {
		if err := z.limits.growGuest(int64(mib)<<20, r); err != nil {
			return err
		}
	}
	if err := z.proc.QMP().ResizeVirtioMem(ctx, int64(mib-z.bootMiB)<<20); err != nil {
		z.limits.setGuest(old)
		if mib > z.memMiB {
			if uerr := z.limits.apply(z.applied); uerr != nil {
				z.logger.WithError(uerr).Warn("resize: could not set the cgroup back")
			}
		}
		return fmt.Errorf("resize guest RAM from %d to %d MiB: %w", z.memMiB, mib, err)
	}
	z.limits.setGuest(int64(mib) << 20)
	z.memMiB = mib
	return nil
}

// resizeVCPUs gives the guest n vCPUs. Under KVM, missing ones are
// hot-plugged, the next index first, and brought online through the
// guest agent when the guest has one; those beyond n are unplugged, the
// last first. Under TCG the VM has its vCPUs from boot (see
// launch.resources), and the guest agent brings them online or takes
// them offline.
func (z *resizer) resizeVCPUs(ctx context.Context, n int) error {
	if n == z.vcpus {
		return nil
	}
	qmp, agent := z.proc.QMP(), z.proc.Agent()
	if z.accel != qemu.AccelKVM {
		if n > z.plugged {
			return fmt.Errorf("cpu limit of %d vcpus is more than the %d this VM has under TCG (max_vcpus, at most the host's cpus): %w",
				n, z.plugged, errdefs.ErrInvalidArgument)
		}
		if err := z.setOnline(ctx, agent, n); err != nil {
			if rerr := z.setOnline(context.WithoutCancel(ctx), agent, z.vcpus); rerr != nil {
				z.logger.WithError(rerr).Warn("resize: could not bring the guest's vcpus back")
			}
			return fmt.Errorf("have the guest run %d vcpus (under TCG its agent does it): %w", n, err)
		}
		z.vcpus = n
		return nil
	}
	for z.plugged < n {
		if err := qmp.AddCPU(ctx, z.accel, z.topo, z.plugged); err != nil {
			return fmt.Errorf("hot-plug vcpu %d: %w", z.plugged, err)
		}
		z.plugged++
	}
	for z.plugged > n {
		if err := qmp.DeleteCPU(ctx, z.plugged-1); err != nil {
			return fmt.Errorf("unplug vcpu %d (does the guest kernel support CPU hot-unplug?): %w", z.plugged-1, err)
		}
		z.plugged--
	}
	z.vcpus = n
	z.onlineVCPUs(ctx, agent, n)
	return nil
}

// setOnline has the guest's agent keep n vCPUs online, and waits until
// the guest has.
func (z *resizer) setOnline(ctx context.Context, agent *qemu.Agent, n int) error {
	online := -1
	err := wait.PollUntilContextTimeout(ctx, onlinePoll, z.timeout, true, func(ctx context.Context) (bool, error) {
		var err error
		online, err = agent.SetOnlineVCPUs(ctx, n)
		if err != nil && !errors.Is(err, errdefs.ErrFailedPrecondition) {
			return false, err
		}
		return err == nil && online == n, nil
	})
	if err != nil && ctx.Err() == nil && wait.Interrupted(err) {
		return fmt.Errorf("the guest has %d vcpus online: %w", online, context.DeadlineExceeded)
	}
	return err
}

// settlePoll is how often settle asks the guest agent.
const settlePoll = time.Second

// settle takes the vCPUs a TCG guest booted with beyond those it is to
// run offline, once its agent answers (a kernel boot keeps them offline
// with maxcpus= instead). It gives up when the VM stops.
func (z *resizer) settle(done <-chan struct{}) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-done:
			cancel()
		case <-ctx.Done():
		}
	}()
	_ = wait.PollUntilContextCancel(ctx, settlePoll, false, func(ctx context.Context) (bool, error) {
		z.mu.Lock()
		defer z.mu.Unlock()
		actx, acancel := context.WithTimeout(ctx, settlePoll)
		defer acancel()
		online, err := z.proc.Agent().SetOnlineVCPUs(actx, z.vcpus)
		if err == nil && online == z.vcpus {
			z.logger.WithField("vcpus", online).Debug("resize: the guest runs its vcpus")
			return true, nil
		}
		return false, nil
	})
}

// onlineVCPUs asks the guest agent to have n vCPUs online, as a guest's
// udev rule would bring hot-plugged ones online, until the guest lists
// them. A guest without an agent is left to do it itself.
func (z *resizer) onlineVCPUs(ctx context.Context, agent *qemu.Agent, n int) {
	online := -1
	err := wait.PollUntilContextCancel(ctx, onlinePoll, true, func(ctx context.Context) (bool, error) {
		var err error
		online, err = agent.SetOnlineVCPUs(ctx, n)
		if err != nil && ctx.Err() == nil && !errors.Is(err, errdefs.ErrFailedPrecondition) {
			return false, err
		}
		return err == nil && online == n, nil
	})
	switch {
	case err == nil:
	case ctx.Err() == nil:
		z.logger.WithError(err).Info("resize: the guest is left to bring its vcpus online itself")
	default:
		z.logger.WithField("online", online).WithField("want", n).Warn("resize: the guest has not brought its vcpus online")
	}
}

// pin pins each vCPU thread to its CPU of the layout, and QEMU's other
// threads to the whole cpuset; without a cpuset it does nothing.
func (z *resizer) pin(ctx context.Context, layout topology.Layout) error {
	if len(z.cpus) == 0 {
		return nil
	}
	cpus, err := z.proc.QMP().QueryCPUs(ctx)
	if err != nil {
		return err
	}
	tids := make(map[int]int, len(cpus))
	for _, c := range cpus {
		tids[c.Index] = c.ThreadID
	}
	if err := topology.PinThreads(z.proc.Pid(), tids, layout.Pin, z.cpus); err != nil {
		return fmt.Errorf("pin vcpus to cpuset %s: %w", z.cpus, err)
	}
	return nil
}
