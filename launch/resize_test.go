package launch

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/vmshim/vmshim/qemu"
	"github.com/vmshim/vmshim/topology"
)

// fakeSys writes a sysfs tree with the NUMA nodes given (node → cpulist)
// and returns its root.
func fakeSys(t *testing.T, nodes map[int]string) string {
	t.Helper()
	root := t.TempDir()
	for n, cpus := range nodes {
		dir := filepath.Join(root, "devices/system/node", "node"+string(rune('0'+n)))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "cpulist"), []byte(cpus+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func resources(quota int64, memMiB int64, cpus string) *specs.LinuxResources {
	period := uint64(100000)
	mem := memMiB << 20
	return &specs.LinuxResources{
		CPU:    &specs.LinuxCPU{Quota: &quota, Period: &period, Cpus: cpus},
		Memory: &specs.LinuxMemory{Limit: &mem},
	}
}

func testResizer() *resizer {
	return &resizer{
		limits: &cgroupLimits{guest: 512 << 20, memLimit: 512 << 20}, logger: log.L, timeout: resizeTimeout,
		topo: qemu.Topology{Sockets: 1, Cores: 4, Threads: 1}, vcpus: 1, plugged: 1, maxVCPUs: 4,
		bootMiB: 512, memMiB: 512, maxMemMiB: 2048,
	}
}

func TestResizerWants(t *testing.T) {
	sys := fakeSys(t, map[int]string{0: "0-3", 1: "4-7"})
	tests := []struct {
		name    string
		change  func(z *resizer)
		r       *specs.LinuxResources
		vcpus   int
		memMiB  int
		cpus    string
		numa    bool
		wantErr string
	}{
		{name: "same", r: resources(100000, 512, ""), vcpus: 1, memMiB: 512},
		{name: "grow both", r: resources(250000, 1024, ""), vcpus: 3, memMiB: 1024},
		{name: "memory in whole blocks", r: resources(100000, 1025, ""), vcpus: 1, memMiB: 1024},
		{name: "no cpu limit keeps the count", r: &specs.LinuxResources{}, vcpus: 1, memMiB: 512},
		{name: "vcpus fixed", change: func(z *resizer) { z.vcpusFixed = true }, r: resources(300000, 512, ""), vcpus: 1, memMiB: 512},
		{name: "cpuset on one node", r: resources(200000, 512, "2-3"), vcpus: 2, memMiB: 512, cpus: "2-3"},
		{name: "cpuset across nodes, booted so", change: func(z *resizer) { z.numa = []int{0, 1} }, r: resources(200000, 512, "3-4"), vcpus: 2, memMiB: 512, cpus: "3-4", numa: true},

		{name: "too many vcpus", r: resources(500000, 512, ""), wantErr: "cpu limit of 5 vcpus is more than the 4 the guest can have"},
		{name: "below boot RAM", r: resources(100000, 256, ""), wantErr: "memory limit of 256 MiB is below the 512 MiB the guest booted with"},
		{name: "above max", r: resources(100000, 4096, ""), wantErr: "memory limit of 4096 MiB is more than the 2048 MiB guest RAM can grow to"},
		{name: "memory fixed", change: func(z *resizer) { z.memFixedBy = "guest RAM is on huge pages" }, r: resources(100000, 1024, ""),
			wantErr: "memory limit cannot change on a running VM: guest RAM is on huge pages (512 MiB); recreate the pod to resize it"},
		{name: "cpuset across nodes, booted without", r: resources(200000, 512, "3-4"),
			wantErr: "cpuset cpus 3-4 span host nodes [0 1], and the guest booted without NUMA nodes; recreate the pod"},
		{name: "cpuset on one node, booted across", change: func(z *resizer) { z.numa = []int{0, 1} }, r: resources(200000, 512, "0-1"),
			wantErr: "cpuset cpus 0-1 lie in one host node, and the guest booted with NUMA nodes on host nodes [0 1]"},
		{name: "cpuset garbage", r: resources(100000, 512, "0-x"), wantErr: "linux.resources.cpu.cpus: "},
		{name: "cpuset off the host", r: resources(100000, 512, "9"), wantErr: "cpu 9 is in no host node"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			z := testResizer()
			z.sysfs = sys
			if tt.change != nil {
				tt.change(z)
			}
			vcpus, err := z.wantVCPUs(tt.r)
			var memMiB int
			if err == nil {
				memMiB, err = z.wantMemory(tt.r)
			}
			var cpus topology.CPUSet
			var layout topology.Layout
			if err == nil {
				cpus, _, layout, err = z.wantCpuset(tt.r)
			}
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || strings.Contains(err.Error(), "\n") {
					t.Fatalf("err %v, want %q", err, tt.wantErr)
				}
				if !errdefs.IsInvalidArgument(err) && !errdefs.IsNotImplemented(err) {
					t.Errorf("err %v is neither invalid argument nor not implemented", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if vcpus != tt.vcpus || memMiB != tt.memMiB || cpus.String() != tt.cpus || (len(layout.Nodes) > 0) != tt.numa {
				t.Errorf("want %d vcpus, %d MiB, cpuset %q, numa %v; got %d, %d, %q, %v", tt.vcpus, tt.memMiB, tt.cpus, tt.numa, vcpus, memMiB, cpus, layout.Nodes)
			}
			if len(cpus) > 0 && len(layout.Pin) != z.topo.CPUs() {
				t.Errorf("pins %v for %d possible vcpus", layout.Pin, z.topo.CPUs())
			}
		})
	}
}
