package launch

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/proto"

	"github.com/vmshim/vmshim/cgroup"
	"github.com/vmshim/vmshim/oom"
	"github.com/vmshim/vmshim/thread"
)

// cgroupLimits gives a task the stats and limits of its cgroup.
//
// A VM's cgroup allows guest RAM plus the overhead QEMU needs beyond it
// (config memory_overhead), so a guest that uses all its RAM cannot push
// QEMU over the limit: the memory limit sizes the guest, not the cgroup.
type cgroupLimits struct {
	cg       cgroup.Cgroup // nil when the spec names no cgroup
	guest    int64         // guest RAM in bytes; 0 for a pod sandbox
	overhead int64         // what QEMU may use beyond guest RAM
	memLimit int64         // the container's memory limit at create; 0 = none
}

// cgroupResources is what a task's cgroup enforces: the spec's limits,
// with the memory limit (and swap, kept equal) set to guest RAM plus
// overhead for a VM, and without device rules, which are meant for a
// container's processes, not for QEMU (its devices are opened by the shim
// or at start).
func (c *cgroupLimits) cgroupResources(r *specs.LinuxResources) *specs.LinuxResources {
	var out specs.LinuxResources
	if r != nil {
		out = *r
	}
	out.Devices = nil
	if c.guest > 0 {
		limit := c.guest + c.overhead
		mem := specs.LinuxMemory{}
		if out.Memory != nil {
			mem = *out.Memory
		}
		// Swap is kept equal, and always set: cgroup v1 refuses a memory
		// limit above memory.memsw.limit_in_bytes, so a VM that grows
		// must raise both, memsw first (v1Cgroup.Update sees to that).
		swap := limit
		mem.Limit, mem.Swap = &limit, &swap
		out.Memory = &mem
	}
	return &out
}

// Stats reports the cgroup's usage.
func (c *cgroupLimits) Stats(ctx context.Context) (proto.Message, error) {
	if c.cg == nil {
		return nil, fmt.Errorf("task has no cgroup to report on: %w", errdefs.ErrNotFound)
	}
	return c.cg.Stats()
}

// Update applies new limits. A VM's memory is fixed at boot, so a memory
// limit other than the one it was created with is refused; CPU limits,
// pids and the rest apply to the cgroup (the vCPU count stays).
func (c *cgroupLimits) Update(ctx context.Context, r *specs.LinuxResources) error {
	if r == nil {
		return fmt.Errorf("no resources given: %w", errdefs.ErrInvalidArgument)
	}
	if c.guest > 0 && r.Memory != nil && r.Memory.Limit != nil && *r.Memory.Limit > 0 && *r.Memory.Limit != c.memLimit {
		return fmt.Errorf("memory limit cannot change on a running VM: guest RAM is fixed at boot (%d MiB); recreate the pod to resize it: %w",
			c.guest>>20, errdefs.ErrNotImplemented)
	}
	if c.cg == nil {
		return fmt.Errorf("task has no cgroup to apply limits to: %w", errdefs.ErrFailedPrecondition)
	}
	return c.cg.Update(c.cgroupResources(r))
}

// create makes the cgroup the spec names (recording it first, so a
// delete after a crash removes it) with the limits of c; it does nothing
// when the spec names none.
func (c *cgroupLimits) create(ctx context.Context, spec *specs.Spec, rec *Record) error {
	if spec.Linux == nil || spec.Linux.CgroupsPath == "" {
		return nil
	}
	if err := rec.push(madeCgroup, func(r *Record) { r.Cgroup = spec.Linux.CgroupsPath }); err != nil {
		return err
	}
	cg, err := cgroupHost().Create(ctx, spec.Linux.CgroupsPath, c.cgroupResources(spec.Linux.Resources))
	if err != nil {
		return err
	}
	c.cg = cg
	return nil
}

// start starts the task's process inside its cgroup, forked from a thread
// the steps moved first (into the VM's network namespace, say).
func (c *cgroupLimits) start(cmd *exec.Cmd, steps ...thread.Step) error {
	if c.cg == nil {
		return thread.Fork(cmd, steps...)
	}
	if err := c.cg.Start(cmd, steps...); err != nil {
		return fmt.Errorf("start %s in cgroup %s: %w", filepath.Base(cmd.Path), c.cg.Path(), err)
	}
	return nil
}

// removeCgroup deletes the cgroup at path, if it is there.
func removeCgroup(ctx context.Context, path string) error {
	cg, err := cgroupHost().Load(ctx, path)
	if errdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	return cg.Delete()
}

// specMemoryLimit is the memory limit of spec, 0 when it has none.
func specMemoryLimit(spec *specs.Spec) int64 {
	if spec.Linux == nil || spec.Linux.Resources == nil || spec.Linux.Resources.Memory == nil ||
		spec.Linux.Resources.Memory.Limit == nil || *spec.Linux.Resources.Memory.Limit < 0 {
		return 0
	}
	return *spec.Linux.Resources.Memory.Limit
}

// cgroupHost is this machine's cgroups, whose systemd scopes are made
// around a pause process (see startPlaceholder).
func cgroupHost() cgroup.Host { return cgroup.NewHost(startPlaceholder) }

// has reports whether the task has a cgroup.
func (c *cgroupLimits) has() bool { return c.cg != nil }

// memoryDir is the cgroup's memory directory, "" for none yet.
func (c *cgroupLimits) memoryDir() string {
	if c.cg == nil {
		return ""
	}
	return c.cg.MemoryDir()
}

// apply sets the cgroup to r's limits, with guest RAM as it is now.
func (c *cgroupLimits) apply(r *specs.LinuxResources) error {
	if c.cg == nil {
		return fmt.Errorf("task has no cgroup to apply limits to: %w", errdefs.ErrFailedPrecondition)
	}
	return c.cg.Update(c.cgroupResources(r))
}

// growGuest sets guest RAM to bytes and the cgroup to r's limits with it;
// on failure guest RAM stays as it was.
func (c *cgroupLimits) growGuest(bytes int64, r *specs.LinuxResources) error {
	old := c.guest
	c.guest = bytes
	if err := c.apply(r); err != nil {
		c.guest = old
		return err
	}
	return nil
}

// setGuest records guest RAM, in bytes, once the guest has it; the next
// apply sizes the cgroup for it.
func (c *cgroupLimits) setGuest(bytes int64) { c.guest = bytes }

// guestBytes is guest RAM in bytes.
func (c *cgroupLimits) guestBytes() int64 { return c.guest }

// limitOf is the container's memory limit the VM now follows.
func (c *cgroupLimits) limitOf() int64 { return c.memLimit }

// followLimit records r's memory limit, if it sets one, as the one the
// VM follows.
func (c *cgroupLimits) followLimit(r *specs.LinuxResources) {
	if r.Memory != nil && r.Memory.Limit != nil && *r.Memory.Limit > 0 {
		c.memLimit = *r.Memory.Limit
	}
}

// setOOMScoreAdj gives the task's process the spec's oom_score_adj (the
// kubelet's per-QoS value); without one it keeps the shim's.
func setOOMScoreAdj(pid int, spec *specs.Spec) error {
	return oom.SetScoreAdj(pid, specOOMScoreAdj(spec))
}

// specOOMScoreAdj is the spec's process.oomScoreAdj, nil for none.
func specOOMScoreAdj(spec *specs.Spec) *int {
	if spec.Process == nil {
		return nil
	}
	return spec.Process.OOMScoreAdj
}

// undoCgroup removes the task's cgroup (madeCgroup).
func undoCgroup(ctx context.Context, r *Record) error { return removeCgroup(ctx, r.Cgroup) }
