package topology

import (
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

// FuzzPlan plans cpusets on fake hosts whose CPU k lies in node
// nodeOf[k]%4, and checks the layout it accepts: each vCPU pinned
// round-robin, guest nodes exactly when the pins span host nodes, every
// vCPU in the guest node of its CPU, and all memory shared out in 2 MiB
// granules with at least 2 MiB per node.
func FuzzPlan(f *testing.F) {
	f.Add("2-5", "", uint16(4), int64(4096), []byte{0, 0, 0, 0, 1, 1, 1, 1})
	f.Add("2-5", "0-1", uint16(8), int64(4096), []byte{0, 0, 0, 0, 1, 1, 1, 1})
	f.Add("0-3", "0", uint16(4), int64(1024), []byte{0, 0, 1, 1})
	f.Add("1-4", "", uint16(3), int64(1001), []byte{0, 0, 1, 1, 2, 2})
	f.Add("3-4", "", uint16(2), int64(3), []byte{0, 0, 0, 0, 1, 1})
	f.Add("0-9", "", uint16(1), int64(1), []byte{3})
	f.Fuzz(func(t *testing.T, cpuList, memList string, maxVCPUs uint16, memMiB int64, nodeOf []byte) {
		cpus, err := ParseCPUSet(cpuList)
		if err != nil {
			return
		}
		mems, err := ParseCPUSet(memList)
		if err != nil {
			return
		}
		hosts := make([]HostNode, 4)
		for n := range hosts {
			hosts[n].ID = n
		}
		for cpu, b := range nodeOf {
			n := int(b % 4)
			hosts[n].CPUs = append(hosts[n].CPUs, cpu)
		}
		node := func(cpu int) int { return int(nodeOf[cpu] % 4) }

		got, err := Plan(cpus, mems, int(maxVCPUs), int(memMiB), hosts)
		if err != nil {
			if !errdefs.IsInvalidArgument(err) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("Plan error %q: want one line, invalid argument", err)
			}
			return
		}
		if len(cpus) == 0 {
			if got.Pin != nil || got.Nodes != nil {
				t.Fatalf("Plan with no cpus = %+v", got)
			}
			return
		}
		if len(got.Pin) != int(maxVCPUs) {
			t.Fatalf("%d pins for %d vCPUs", len(got.Pin), maxVCPUs)
		}
		used := map[int]bool{}
		for i, c := range got.Pin {
			if c != cpus[i%len(cpus)] {
				t.Fatalf("vCPU %d pinned to %d, want %d", i, c, cpus[i%len(cpus)])
			}
			used[node(c)] = true
		}
		// mems binds guest RAM only through guest NUMA nodes; on one host
		// node the cgroup's cpuset.mems places it.
		for n := range used {
			if len(used) > 1 && len(mems) > 0 && !mems.Contains(n) {
				t.Fatalf("vCPUs on host node %d, which mems %s refuses", n, mems)
			}
		}
		if len(used) == 1 {
			if got.Nodes != nil {
				t.Fatalf("guest nodes %+v with one host node used", got.Nodes)
			}
			return
		}
		if len(got.Nodes) != len(used) {
			t.Fatalf("%d guest nodes for %d host nodes used", len(got.Nodes), len(used))
		}
		seen := make([]bool, maxVCPUs)
		mem := 0
		for k, g := range got.Nodes {
			if k > 0 && g.HostNode <= got.Nodes[k-1].HostNode {
				t.Fatalf("guest nodes out of host node order: %+v", got.Nodes)
			}
			if g.MemMiB < 2 || (k > 0 && g.MemMiB%2 != 0) {
				t.Fatalf("guest node %d has %d MiB", k, g.MemMiB)
			}
			mem += g.MemMiB
			for j, v := range g.VCPUs {
				if seen[v] || node(got.Pin[v]) != g.HostNode || (j > 0 && v <= g.VCPUs[j-1]) {
					t.Fatalf("guest node %d (host node %d) holds vCPUs %v", k, g.HostNode, g.VCPUs)
				}
				seen[v] = true
			}
		}
		for v, ok := range seen {
			if !ok {
				t.Fatalf("vCPU %d is in no guest node", v)
			}
		}
		if mem != int(memMiB) {
			t.Fatalf("guest nodes hold %d MiB of %d", mem, memMiB)
		}
	})
}
