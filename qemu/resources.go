package qemu

import (
	"fmt"
	"strconv"
)

// Guest CPUs and memory: how many vCPUs the guest boots with and how many
// it can have, their topology and NUMA nodes, and what backs guest RAM.

// Topology is the guest's CPU topology: MaxCPUs() possible vCPUs as
// sockets of cores of threads.
type Topology struct {
	Sockets, Cores, Threads int
}

// CPUs is the number of vCPUs the topology holds.
func (t Topology) CPUs() int { return t.Sockets * t.Cores * t.Threads }

// IDs places vCPU i (0-based) in the topology, in QEMU's x86 order.
func (t Topology) IDs(i int) (socket, core, thread int) {
	return i / (t.Threads * t.Cores), (i / t.Threads) % t.Cores, i % t.Threads
}

// NUMANode is one guest NUMA node: its vCPUs (indexes into the topology)
// and its share of guest RAM, bound to a host NUMA node.
type NUMANode struct {
	HostNode int
	VCPUs    []int
	MemMiB   int
}

// VirtioMemBlockMiB is the granularity of memory resize: virtio-mem's
// block on x86, the size of a transparent huge page.
const VirtioMemBlockMiB = 2

// Virtio-mem's device and backend ids; the device is at
// /machine/peripheral/VirtioMemDevice.
const (
	VirtioMemDevice  = "vmem0"
	virtioMemBackend = "vmem-ram0"
	ramBackend       = "ram0"
)

// CPUDeviceID is the qdev id of the vCPU with index i > 0, which boots
// (or is hot-plugged) as a device so it can be unplugged.
func CPUDeviceID(i int) string { return "vcpu" + strconv.Itoa(i) }

// cpuType is the QOM type of a vCPU under accel: the -cpu model's.
func cpuType(accel Accel) string {
	if accel == AccelKVM {
		return "host-x86_64-cpu"
	}
	return "max-x86_64-cpu"
}

// topology returns the spec's topology: its own, or one socket of
// MaxCPUs (or CPUs) cores.
func (s Spec) topology() Topology {
	if s.Topology != (Topology{}) {
		return s.Topology
	}
	n := max(s.MaxCPUs, s.CPUs)
	return Topology{Sockets: 1, Cores: n, Threads: 1}
}

// hotplug reports whether vCPUs can be added to or removed from the
// running guest.
func (s Spec) hotplug() bool { return s.topology().CPUs() > s.CPUs }

// validateResources checks the topology, NUMA nodes and memory backing.
func (s Spec) validateResources() error {
	t := s.topology()
	if t.Sockets < 1 || t.Cores < 1 || t.Threads < 1 {
		return invalid("topology", "sockets=%d,cores=%d,threads=%d has a zero", t.Sockets, t.Cores, t.Threads)
	}
	if t.CPUs() > MaxCPUs {
		return invalid("topology", "%d vcpus is more than %d", t.CPUs(), MaxCPUs)
	}
	if s.MaxCPUs != 0 && s.MaxCPUs != t.CPUs() {
		return invalid("max cpus", "%d is not the topology's %d vcpus", s.MaxCPUs, t.CPUs())
	}
	if s.CPUs > t.CPUs() {
		return invalid("cpus", "%d is more than the topology's %d", s.CPUs, t.CPUs())
	}
	if s.PluggedCPUs != 0 && (s.PluggedCPUs < s.CPUs || s.PluggedCPUs > t.CPUs()) {
		return invalid("plugged cpus", "%d is not in %d..%d (cpus..the topology's)", s.PluggedCPUs, s.CPUs, t.CPUs())
	}
	if s.ResizeMiB < 0 || s.ResizeMiB%VirtioMemBlockMiB != 0 || s.MemoryMiB+s.ResizeMiB > MaxMemoryMiB {
		return invalid("resize memory", "%d MiB is not a multiple of %d MiB within %d MiB of guest RAM", s.ResizeMiB, VirtioMemBlockMiB, MaxMemoryMiB)
	}
	switch s.HugePageSize {
	case 0:
	case 2 << 20, 1 << 30:
		if int64(s.MemoryMiB)<<20%s.HugePageSize != 0 {
			return invalid("memory", "%d MiB is not a whole number of %d MiB huge pages", s.MemoryMiB, s.HugePageSize>>20)
		}
		if s.ResizeMiB != 0 {
			return invalid("resize memory", "guest RAM on huge pages cannot be resized")
		}
	default:
		return invalid("huge page size", "%d bytes is not 2 MiB or 1 GiB", s.HugePageSize)
	}
	if len(s.NUMA) == 0 {
		return nil
	}
	placed := make([]bool, t.CPUs())
	total := 0
	for i, n := range s.NUMA {
		if n.HostNode < 0 || n.MemMiB < 1 {
			return invalid("numa", "node %d: host node %d with %d MiB", i, n.HostNode, n.MemMiB)
		}
		if s.HugePageSize != 0 && int64(n.MemMiB)<<20%s.HugePageSize != 0 {
			return invalid("numa", "node %d: %d MiB is not a whole number of huge pages", i, n.MemMiB)
		}
		total += n.MemMiB
		for _, c := range n.VCPUs {
			if c < 0 || c >= len(placed) || placed[c] {
				return invalid("numa", "node %d: vcpu %d is outside the topology or in two nodes", i, c)
			}
			placed[c] = true
		}
	}
	for c, ok := range placed {
		if !ok {
			return invalid("numa", "vcpu %d is in no node", c)
		}
	}
	if total != s.MemoryMiB {
		return invalid("numa", "the nodes hold %d MiB, guest RAM is %d MiB", total, s.MemoryMiB)
	}
	return nil
}

// smpArgs renders the vCPUs. A guest that can grow or shrink boots with
// one vCPU from -smp and the rest as CPU devices, which, unlike -smp's,
// can be unplugged.
func (s Spec) smpArgs() []string {
	t := s.topology()
	shape := fmt.Sprintf("sockets=%d,cores=%d,threads=%d", t.Sockets, t.Cores, t.Threads)
	if !s.hotplug() {
		if s.Topology == (Topology{}) {
			return []string{"-smp", strconv.Itoa(s.CPUs)}
		}
		return []string{"-smp", fmt.Sprintf("%d,%s", s.CPUs, shape)}
	}
	args := []string{"-smp", fmt.Sprintf("1,maxcpus=%d,%s", t.CPUs(), shape)}
	for i := 1; i < max(s.CPUs, s.PluggedCPUs); i++ {
		args = append(args, "-device", cpuDevice(s.Accel, t, i))
	}
	return args
}

// cpuDevice renders the -device options of vCPU i.
func cpuDevice(accel Accel, t Topology, i int) string {
	socket, core, thread := t.IDs(i)
	return fmt.Sprintf("%s,id=%s,socket-id=%d,core-id=%d,thread-id=%d", cpuType(accel), CPUDeviceID(i), socket, core, thread)
}

// memoryArgs renders guest RAM: -m, the backends of huge pages or NUMA
// nodes, and the NUMA nodes with their vCPUs. The virtio-mem device that
// resizes it comes last among the devices (virtioMemArgs).
func (s Spec) memoryArgs() []string {
	m := strconv.Itoa(s.MemoryMiB) + "M"
	if s.ResizeMiB > 0 {
		m += ",maxmem=" + strconv.Itoa(s.MemoryMiB+s.ResizeMiB) + "M"
	}
	args := []string{"-m", m}
	if len(s.NUMA) == 0 {
		if s.HugePageSize != 0 {
			args = append(args, "-object", s.ramBackend(ramBackend, s.MemoryMiB, -1))
		}
		return args
	}
	t := s.topology()
	for i, n := range s.NUMA {
		id := "ram-node" + strconv.Itoa(i)
		args = append(args, "-object", s.ramBackend(id, n.MemMiB, n.HostNode),
			"-numa", fmt.Sprintf("node,nodeid=%d,memdev=%s", i, id))
	}
	for i, n := range s.NUMA {
		for _, c := range n.VCPUs {
			socket, core, thread := t.IDs(c)
			args = append(args, "-numa", fmt.Sprintf("cpu,node-id=%d,socket-id=%d,core-id=%d,thread-id=%d", i, socket, core, thread))
		}
	}
	return args
}

// machineMemory is the -machine option that names guest RAM's one
// backend, when it has one outside NUMA nodes.
func (s Spec) machineMemory() string {
	if s.HugePageSize != 0 && len(s.NUMA) == 0 {
		return ",memory-backend=" + ramBackend
	}
	return ""
}

// ramBackend renders a backend of guest RAM: preallocated huge pages
// from a memfd, or ordinary memory; bound to hostNode unless it is -1.
func (s Spec) ramBackend(id string, mib, hostNode int) string {
	o := "memory-backend-ram,id=" + id + ",size=" + strconv.Itoa(mib) + "M"
	if s.HugePageSize != 0 {
		o = "memory-backend-memfd,id=" + id + ",size=" + strconv.Itoa(mib) + "M,hugetlb=on,hugetlbsize=" +
			strconv.FormatInt(s.HugePageSize, 10) + ",prealloc=on"
	}
	if hostNode >= 0 {
		o += ",host-nodes=" + strconv.Itoa(hostNode) + ",policy=bind"
	}
	return o
}

// virtioMemArgs renders the virtio-mem device that grows guest RAM by up
// to ResizeMiB, plugged empty. Its backend is address space until the
// guest plugs blocks and touches them, and QEMU discards the blocks the
// guest unplugs. (reserve=off would keep the region out of the kernel's
// commit accounting, but QEMU then reads /proc/sys, which its jail does
// not show; Kubernetes nodes run with vm.overcommit_memory=1 anyway.)
func (s Spec) virtioMemArgs() []string {
	if s.ResizeMiB == 0 {
		return nil
	}
	return []string{
		"-object", fmt.Sprintf("memory-backend-ram,id=%s,size=%dM", virtioMemBackend, s.ResizeMiB),
		"-device", fmt.Sprintf("virtio-mem-pci,id=%s,memdev=%s,block-size=%dM,requested-size=0", VirtioMemDevice, virtioMemBackend, VirtioMemBlockMiB),
	}
}
