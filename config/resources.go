package config

import (
	"fmt"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/vmshim/vmshim/topology"
)

// AnnotationCPUTopology shapes the vCPUs the guest can have:
// "sockets=S,cores=C,threads=T", S×C×T of them at most (the ceiling of a
// CPU resize). Without it the guest has one socket of max_vcpus cores.
const AnnotationCPUTopology = AnnotationPrefix + "cpu-topology"

// AnnotationMaxMemory is the guest RAM a memory resize can grow the VM
// to (a quantity, up to max_memory): the VM gets a virtio-mem device with
// that much room above its RAM at boot.
const AnnotationMaxMemory = AnnotationPrefix + "max-memory"

// Resources is how the VM's vCPUs and memory follow the container's
// resources: the most each can grow to, what backs guest RAM, and the
// cpuset the vCPUs are pinned to.
type Resources struct {
	// Topology shapes MaxVCPUs possible vCPUs.
	Topology topology.Topology
	// MaxVCPUs is the vCPU count a CPU resize can reach; VCPUs when
	// vmshim.io/vcpus fixes the count (then a resize changes only the
	// CPU quota).
	MaxVCPUs   int
	VCPUsFixed bool
	// MaxMemoryMiB is the guest RAM a memory resize can reach
	// (vmshim.io/max-memory or config default_max_memory); MemoryMiB when
	// guest RAM does not follow the memory limit (vmshim.io/memory, huge
	// pages, no limit, or no maximum set).
	MaxMemoryMiB int
	// MemoryFixedBy names what fixes guest RAM, for errors; "" when it
	// follows the memory limit.
	MemoryFixedBy string
	// HugePageSize backs guest RAM with huge pages of this size (the
	// container's hugepages limit, or a hugetlbfs volume it mounts); 0
	// for none.
	HugePageSize int64
	// CPUs and Mems are the container's cpuset; CPUs empty for none.
	CPUs, Mems topology.CPUSet
}

// resolveResources fills vm.Resources from the annotations and the
// container's resources. It runs once vm.VCPUs and vm.MemoryMiB are set.
func resolveResources(cfg Config, ann annotations, in map[string]string, spec *specs.Spec, vm *VM) error {
	r := &vm.Resources
	r.Topology = topology.DefaultTopology(cfg.MaxVCPUs)
	if v, ok := in[AnnotationCPUTopology]; ok {
		t, err := topology.ParseTopology(v)
		if err != nil {
			return annotationErr(AnnotationCPUTopology, "%v", err)
		}
		if t.CPUs() > cfg.MaxVCPUs || t.CPUs() < vm.VCPUs {
			return annotationErr(AnnotationCPUTopology, "%s holds %d vcpus, want %d..%d (the vcpus the guest boots with..max_vcpus)", v, t.CPUs(), vm.VCPUs, cfg.MaxVCPUs)
		}
		r.Topology = t
	}
	r.MaxVCPUs = r.Topology.CPUs()
	if ann.vcpus > 0 {
		r.VCPUsFixed = true
		if _, ok := in[AnnotationCPUTopology]; !ok {
			r.Topology, r.MaxVCPUs = topology.DefaultTopology(vm.VCPUs), vm.VCPUs
		}
	}
	res := specResources(spec)
	if res != nil && res.CPU != nil {
		var err error
		if r.CPUs, err = topology.ParseCPUSet(res.CPU.Cpus); err != nil {
			return invalidf("spec linux.resources.cpu.cpus: %v", err)
		}
		if r.Mems, err = topology.ParseCPUSet(res.CPU.Mems); err != nil {
			return invalidf("spec linux.resources.cpu.mems: %v", err)
		}
		if len(r.CPUs) == 0 {
			r.CPUs = nil
		}
		if len(r.Mems) == 0 {
			r.Mems = nil
		}
	}
	if err := resolveHugePages(ann, res, vm); err != nil {
		return err
	}
	if r.HugePageSize != 0 {
		return nil
	}
	r.MaxMemoryMiB = vm.MemoryMiB
	maxMem := ann.maxMemoryBytes
	if maxMem == 0 && cfg.DefaultMaxMemory != "" {
		maxMem = mustBytes(cfg.DefaultMaxMemory)
	}
	switch {
	case ann.memoryBytes > 0:
		r.MemoryFixedBy = "annotation " + AnnotationMemory + " fixes guest RAM"
	case specMemoryLimit(res) <= 0:
		r.MemoryFixedBy = "the container had no memory limit at create"
	case maxMem == 0:
		r.MemoryFixedBy = "guest RAM can grow only up to " + AnnotationMaxMemory + " (or config default_max_memory), which is not set"
	case maxMem < int64(vm.MemoryMiB)<<20 && ann.maxMemoryBytes > 0:
		return annotationErr(AnnotationMaxMemory, "%d MiB is less than the %d MiB of guest RAM at boot", maxMem>>20, vm.MemoryMiB)
	case maxMem <= int64(vm.MemoryMiB)<<20:
		r.MemoryFixedBy = "guest RAM is already config default_max_memory"
	default:
		r.MaxMemoryMiB = int(maxMem >> 20)
	}
	return nil
}

// resolveHugePages backs guest RAM with huge pages when the container has
// a hugepages limit: guest RAM is then that limit, and vmshim.io/memory,
// if given, must equal it.
func resolveHugePages(ann annotations, res *specs.LinuxResources, vm *VM) error {
	if res == nil {
		return nil
	}
	var size int64
	var limit uint64
	for _, h := range res.HugepageLimits {
		if h.Limit == 0 {
			continue
		}
		s, ok := hugePageSizes[h.Pagesize]
		if !ok {
			return invalidf("spec linux.resources.hugepageLimits: page size %s is not 2MB or 1GB", quoteValue(h.Pagesize))
		}
		if size != 0 {
			return invalidf("spec linux.resources.hugepageLimits: guest RAM takes huge pages of one size, not both 2Mi and 1Gi")
		}
		size, limit = s, h.Limit
	}
	if size == 0 {
		return nil
	}
	name := fmt.Sprintf("hugepages-%s", map[int64]string{2 << 20: "2Mi", 1 << 30: "1Gi"}[size])
	if limit%uint64(size) != 0 || limit < MinMemory {
		return invalidf("%s limit %d bytes is not a whole number of pages of at least 64Mi", name, limit)
	}
	if ann.memoryBytes > 0 && uint64(ann.memoryBytes) != limit {
		return invalidf("%s limit %d MiB does not match guest RAM %d MiB (annotation %s); guest RAM on huge pages is the hugepages limit",
			name, limit>>20, ann.memoryBytes>>20, AnnotationMemory)
	}
	vm.MemoryMiB = int(limit >> 20)
	return vm.OnHugePages(size, name+" limit")
}

// OnHugePages puts guest RAM on huge pages of size bytes, as what names
// (the container's hugepages limit, or a hugetlbfs volume it mounts)
// asks. Guest RAM must be a whole number of pages, and cannot be resized
// or given back (no balloon).
func (vm *VM) OnHugePages(size int64, what string) error {
	r := &vm.Resources
	if r.HugePageSize != 0 && r.HugePageSize != size {
		return invalidf("%s has %d MiB pages, and guest RAM is already on %d MiB pages", what, size>>20, r.HugePageSize>>20)
	}
	if int64(vm.MemoryMiB)<<20%size != 0 {
		return invalidf("%s: guest RAM of %d MiB is not a whole number of %d MiB huge pages", what, vm.MemoryMiB, size>>20)
	}
	if vm.BalloonAsked {
		return balloonOnHugePages(what)
	}
	r.HugePageSize, r.MaxMemoryMiB, r.MemoryFixedBy = size, vm.MemoryMiB, "guest RAM is on huge pages"
	vm.Balloon, vm.BalloonStatsInterval = false, 0
	return nil
}

// hugePageSizes are the page sizes the runtime spec names (as runc's
// hugetlb files do) that can back guest RAM.
var hugePageSizes = map[string]int64{"2MB": 2 << 20, "1GB": 1 << 30}

// specResources is spec's linux.resources, or nil.
func specResources(spec *specs.Spec) *specs.LinuxResources {
	if spec == nil || spec.Linux == nil {
		return nil
	}
	return spec.Linux.Resources
}

// specMemoryLimit is the memory limit of r in bytes; 0 or less for none.
func specMemoryLimit(r *specs.LinuxResources) int64 {
	if r == nil || r.Memory == nil || r.Memory.Limit == nil {
		return 0
	}
	return *r.Memory.Limit
}
