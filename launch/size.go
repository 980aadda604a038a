package launch

import (
	"context"
	"runtime"
	"strconv"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/vmshim/vmshim/config"
	"github.com/vmshim/vmshim/qemu"
	"github.com/vmshim/vmshim/topology"
)

// Kernel arguments a VM with a virtio-mem device boots a kernel with:
// memoryOnlineArg onlines hot-plugged memory at once, and movable, so
// that virtio-mem can unplug it again; noBounceArg keeps the kernel from
// setting 64 MiB of guest RAM aside as a DMA bounce buffer because the
// device's memory lies above 4 GiB (virtio devices need none).
const (
	memoryOnlineArg = "memhp_default_state=online_movable"
	noBounceArg     = "swiotlb=noforce"
)

// resources sizes the VM (step "resources"): the vCPUs it boots with and
// can grow to, in their topology; guest RAM, on huge pages or with a
// virtio-mem device to resize it, and the balloon that gives back what
// the guest frees; and, with a cpuset, where each vCPU runs and the
// guest NUMA nodes that follow from it.
func (c *build) resources(context.Context) error {
	r := c.desc.Resources
	c.qs.CPUs, c.qs.MemoryMiB = c.desc.VCPUs, c.desc.MemoryMiB
	c.qs.Topology = qemu.Topology(r.Topology)
	c.qs.MaxCPUs = r.MaxVCPUs
	c.qs.HugePageSize = r.HugePageSize
	c.qs.Unmergeable = !c.cfg.MemMerge
	if err := c.balloon(); err != nil {
		return err
	}
	if grow := r.MaxMemoryMiB - c.desc.MemoryMiB; grow > 0 {
		c.qs.ResizeMiB = grow - grow%qemu.VirtioMemBlockMiB
	}
	if c.qs.ResizeMiB > 0 && c.qs.Kernel != "" {
		for _, arg := range []string{memoryOnlineArg, noBounceArg} {
			if key, _, _ := strings.Cut(arg, "="); !strings.Contains(c.qs.Append, key+"=") {
				c.qs.Append = strings.TrimSpace(c.qs.Append + " " + arg)
			}
		}
	}
	// QEMU 7.2's TCG aborts when a vCPU is hot-plugged once its
	// translation cache has filled (an initial region for the new
	// vCPU's thread), which a booted guest soon does. Under TCG a VM
	// whose vCPUs follow a CPU limit has at boot the vCPUs a resize may
	// reach, up to the host's CPU count, and those beyond VCPUs stay
	// offline in the guest: maxcpus= keeps a kernel boot from bringing
	// them up, and the resizer takes them offline through the guest
	// agent otherwise.
	_, cpuLimit := config.VCPUsForCPU(cpuResources(c.spec))
	if c.qs.Accel != qemu.AccelKVM && cpuLimit && !r.VCPUsFixed && r.MaxVCPUs > c.desc.VCPUs {
		c.qs.PluggedCPUs = max(c.desc.VCPUs, min(r.MaxVCPUs, runtime.NumCPU()))
		if c.qs.PluggedCPUs > c.desc.VCPUs && c.qs.Kernel != "" {
			c.qs.Append = strings.TrimSpace(c.qs.Append + " maxcpus=" + strconv.Itoa(c.desc.VCPUs))
		}
	}
	if len(r.CPUs) == 0 {
		return nil
	}
	hosts, err := topology.ReadHostNodes(c.sysfs())
	if err != nil {
		return err
	}
	c.layout, err = topology.Plan(r.CPUs, r.Mems, r.MaxVCPUs, c.desc.MemoryMiB, hosts)
	if err != nil {
		return err
	}
	for _, n := range c.layout.Nodes {
		c.qs.NUMA = append(c.qs.NUMA, qemu.NUMANode{HostNode: n.HostNode, VCPUs: n.VCPUs, MemMiB: n.MemMiB})
	}
	return nil
}

// newResizer returns what resizes the VM once it runs, and pins its
// vCPUs to the container's cpuset, if it has one (step "pin vcpus").
func (c *build) newResizer(ctx context.Context) error {
	r := c.desc.Resources
	z := &resizer{
		sysfs: c.sysfs(), timeout: resizeTimeout,
		limits: c.limits, proc: c.vm.proc, accel: c.qs.Accel, logger: c.logger, applied: linuxResources(c.spec),
		topo: c.qs.Topology, vcpus: c.desc.VCPUs, plugged: max(c.desc.VCPUs, c.qs.PluggedCPUs), maxVCPUs: r.MaxVCPUs, vcpusFixed: r.VCPUsFixed,
		bootMiB: c.desc.MemoryMiB, memMiB: c.desc.MemoryMiB, maxMemMiB: c.desc.MemoryMiB + c.qs.ResizeMiB, memFixedBy: r.MemoryFixedBy,
		cpus: r.CPUs, mems: r.Mems,
	}
	if c.qs.ResizeMiB == 0 && z.memFixedBy == "" {
		z.memFixedBy = "guest RAM is already at vmshim.io/max-memory"
	}
	for _, n := range c.layout.Nodes {
		z.numa = append(z.numa, n.HostNode)
	}
	c.vm.resize = z
	if z.plugged > z.vcpus && c.qs.Kernel == "" {
		go z.settle(c.vm.proc.Done())
	}
	return z.pin(ctx, c.layout)
}

// cpuResources is spec's linux.resources.cpu, or nil.
func cpuResources(spec *specs.Spec) *specs.LinuxCPU {
	if r := linuxResources(spec); r != nil {
		return r.CPU
	}
	return nil
}

// linuxResources is spec's linux.resources, or nil.
func linuxResources(spec *specs.Spec) *specs.LinuxResources {
	if spec.Linux == nil {
		return nil
	}
	return spec.Linux.Resources
}
