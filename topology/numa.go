package topology

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
)

// HostNode is one host NUMA node and the CPUs in it.
type HostNode struct {
	ID   int
	CPUs CPUSet
}

// ReadHostNodes reads the host's NUMA nodes from
// <sysRoot>/devices/system/node/node<N>/cpulist, sorted by ID; sysRoot is
// "/sys" outside tests. A host without that directory, or with no node in
// it, has one node 0 holding the CPUs of <sysRoot>/devices/system/cpu/online.
// A node with no CPUs (memory only) has an empty CPUs.
func ReadHostNodes(sysRoot string) ([]HostNode, error) {
	dir := filepath.Join(sysRoot, "devices", "system", "node")
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("read host numa nodes: %w", err)
	}
	var nodes []HostNode
	var cpus CPUSet
	for _, e := range entries {
		id, ok := nodeID(e.Name())
		if !ok {
			continue
		}
		if cpus, err = readCPUList(filepath.Join(dir, e.Name(), "cpulist")); err != nil {
			return nil, err
		}
		nodes = append(nodes, HostNode{ID: id, CPUs: cpus})
	}
	if len(nodes) == 0 {
		if cpus, err = readCPUList(filepath.Join(sysRoot, "devices", "system", "cpu", "online")); err != nil {
			return nil, err
		}
		return []HostNode{{ID: 0, CPUs: cpus}}, nil
	}
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].ID < nodes[j].ID })
	return nodes, nil
}

// nodeID returns N for a directory named "node<N>", N canonical decimal
// no greater than MaxCPUID.
func nodeID(name string) (int, bool) {
	digits, ok := strings.CutPrefix(name, "node")
	if !ok {
		return 0, false
	}
	id, ok := parseID(digits)
	if !ok || id > MaxCPUID || strconv.Itoa(id) != digits {
		return 0, false
	}
	return id, true
}

// readCPUList reads a sysfs cpu list file. A malformed file is the host's
// fault, not the caller's, so it is errdefs.ErrFailedPrecondition.
func readCPUList(path string) (CPUSet, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read host cpus: %w", err)
	}
	cpus, err := ParseCPUSet(string(b))
	if err != nil {
		return nil, errdefs.ErrFailedPrecondition.WithMessage(fmt.Sprintf("%s: %v", path, err))
	}
	return cpus, nil
}

// GuestNode is one guest NUMA node, bound to host node HostNode, holding
// the vCPU indexes VCPUs (sorted) and MemMiB of guest RAM.
type GuestNode struct {
	HostNode int
	VCPUs    []int
	MemMiB   int
}

// Layout is where a VM's vCPUs and memory go on the host.
type Layout struct {
	// Pin[i] is the host CPU vCPU i is pinned to; nil means no pinning.
	Pin []int
	// Nodes are the guest's NUMA nodes, in host node order; nil when the
	// pinned CPUs all lie in one host node and the guest needs no NUMA.
	Nodes []GuestNode
}

// nodeAlignMiB is the granule of a guest node's memory: one huge page.
const nodeAlignMiB = 2

// Plan lays maxVCPUs vCPUs and memMiB of guest RAM out on the host CPUs
// cpus of a container's cpuset, whose cpuset.mems is mems (empty: any
// node), on a host with nodes hosts. vCPU i is pinned to cpus[i%len(cpus)];
// an empty cpus means no pinning and an empty Layout. When the pinned CPUs
// span host nodes, the guest gets one NUMA node per host node used, holding
// the vCPUs pinned there and a share of memory in proportion to them, each
// share a multiple of 2 MiB but the first, which takes the remainder.
// Errors that the container's cpuset or size cause wrap
// errdefs.ErrInvalidArgument.
func Plan(cpus, mems CPUSet, maxVCPUs, memMiB int, hosts []HostNode) (Layout, error) {
	if len(cpus) == 0 {
		return Layout{}, nil
	}
	if maxVCPUs < 1 || maxVCPUs > MaxVCPUs {
		return Layout{}, invalidf("%d vCPUs: not in 1-%d", maxVCPUs, MaxVCPUs)
	}
	if memMiB < 0 {
		return Layout{}, invalidf("%d MiB of memory: negative", memMiB)
	}
	nodeOf := make(map[int]int) // host CPU -> host node
	seen := make(map[int]bool)  // host node ids
	for _, h := range hosts {
		if seen[h.ID] {
			return Layout{}, fmt.Errorf("host node %d listed twice", h.ID)
		}
		seen[h.ID] = true
		for _, c := range h.CPUs {
			if n, ok := nodeOf[c]; ok {
				return Layout{}, fmt.Errorf("host cpu %d is in host nodes %d and %d", c, n, h.ID)
			}
			nodeOf[c] = h.ID
		}
	}
	for _, c := range cpus {
		if _, ok := nodeOf[c]; !ok {
			return Layout{}, invalidf("cpuset cpus %s: cpu %d is in no host node", cpus, c)
		}
	}

	pin := make([]int, maxVCPUs)
	vcpus := make(map[int][]int) // host node -> vCPUs pinned to it
	for i := range pin {
		pin[i] = cpus[i%len(cpus)]
		n := nodeOf[pin[i]]
		vcpus[n] = append(vcpus[n], i)
	}
	used := make([]int, 0, len(vcpus))
	for n := range vcpus {
		used = append(used, n)
	}
	sort.Ints(used)
	// Guest RAM is bound to host nodes only when the guest has NUMA
	// nodes; otherwise the cgroup's cpuset.mems places it, as it places
	// any container's memory.
	if len(mems) > 0 && len(used) > 1 {
		for _, n := range used {
			if !mems.Contains(n) {
				return Layout{}, invalidf("cpuset cpus %s use host node %d, which cpuset mems %s does not allow", cpus, n, mems)
			}
		}
	}
	if len(used) == 1 {
		return Layout{Pin: pin}, nil
	}

	nodes := make([]GuestNode, len(used))
	left := memMiB
	for k, n := range used {
		share := shareOf(memMiB, len(vcpus[n]), maxVCPUs)
		share -= share % nodeAlignMiB
		nodes[k] = GuestNode{HostNode: n, VCPUs: vcpus[n], MemMiB: share}
		left -= share
	}
	nodes[0].MemMiB += left
	for _, g := range nodes {
		if g.MemMiB < nodeAlignMiB {
			return Layout{}, invalidf("%d MiB of memory is too little for %d guest numa nodes: the one on host node %d would get %d MiB, less than %d",
				memMiB, len(nodes), g.HostNode, g.MemMiB, nodeAlignMiB)
		}
	}
	return Layout{Pin: pin, Nodes: nodes}, nil
}

// shareOf returns floor(total*part/whole) without overflowing for any
// total, given 0 <= part <= whole <= MaxVCPUs.
func shareOf(total, part, whole int) int {
	return total/whole*part + total%whole*part/whole
}
