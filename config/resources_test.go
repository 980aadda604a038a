package config

import (
	"reflect"
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/vmshim/vmshim/topology"
)

func withCpuset(cpus, mems string) specOpt {
	return func(s *specs.Spec) {
		r := resources(s)
		if r.CPU == nil {
			r.CPU = &specs.LinuxCPU{}
		}
		r.CPU.Cpus, r.CPU.Mems = cpus, mems
	}
}

func withHugePages(size string, limit uint64) specOpt {
	return func(s *specs.Spec) {
		r := resources(s)
		r.HugepageLimits = append(r.HugepageLimits, specs.LinuxHugepageLimit{Pagesize: size, Limit: limit})
	}
}

func TestResolveResources(t *testing.T) {
	one16 := topology.Topology{Sockets: 1, Cores: 16, Threads: 1}
	tests := []struct {
		name    string
		cfg     func(*Config)
		spec    *specs.Spec
		mem     int // want guest RAM, MiB; 0 = 512
		want    Resources
		wantErr string
	}{
		{name: "defaults: no limits", spec: newSpec(),
			want: Resources{Topology: one16, MaxVCPUs: 16, MaxMemoryMiB: 512, MemoryFixedBy: "the container had no memory limit at create"}},
		{name: "memory limit: resizable to vmshim.io/max-memory", spec: newSpec(withMemory(512<<20), withCPU(200000, 100000), withAnn(AnnotationMaxMemory, "2Gi")),
			want: Resources{Topology: one16, MaxVCPUs: 16, MaxMemoryMiB: 2 << 10}},
		{name: "memory limit: resizable to default_max_memory", cfg: func(c *Config) { c.DefaultMaxMemory = "4Gi" }, spec: newSpec(withMemory(512 << 20)),
			want: Resources{Topology: one16, MaxVCPUs: 16, MaxMemoryMiB: 4 << 10}},
		{name: "memory limit: the annotation wins", cfg: func(c *Config) { c.DefaultMaxMemory = "4Gi" }, spec: newSpec(withMemory(512<<20), withAnn(AnnotationMaxMemory, "1Gi")),
			want: Resources{Topology: one16, MaxVCPUs: 16, MaxMemoryMiB: 1 << 10}},
		{name: "memory limit: no maximum", spec: newSpec(withMemory(512 << 20)),
			want: Resources{Topology: one16, MaxVCPUs: 16, MaxMemoryMiB: 512, MemoryFixedBy: "guest RAM can grow only up to vmshim.io/max-memory (or config default_max_memory), which is not set"}},
		{name: "memory limit above default_max_memory", cfg: func(c *Config) { c.DefaultMaxMemory = "256Mi" }, spec: newSpec(withMemory(512 << 20)),
			want: Resources{Topology: one16, MaxVCPUs: 16, MaxMemoryMiB: 512, MemoryFixedBy: "guest RAM is already config default_max_memory"}},
		{name: "memory annotation fixes RAM", spec: newSpec(withMemory(1<<30), withAnn(AnnotationMemory, "512Mi")),
			want: Resources{Topology: one16, MaxVCPUs: 16, MaxMemoryMiB: 512, MemoryFixedBy: "annotation vmshim.io/memory fixes guest RAM"}},
		{name: "vcpus annotation fixes the count", spec: newSpec(withAnn(AnnotationVCPUs, "2")),
			want: Resources{Topology: topology.Topology{Sockets: 1, Cores: 2, Threads: 1}, MaxVCPUs: 2, VCPUsFixed: true, MaxMemoryMiB: 512, MemoryFixedBy: "the container had no memory limit at create"}},
		{name: "topology", spec: newSpec(withAnn(AnnotationCPUTopology, "sockets=2,cores=2,threads=2"), withCPU(300000, 100000)),
			want: Resources{Topology: topology.Topology{Sockets: 2, Cores: 2, Threads: 2}, MaxVCPUs: 8, MaxMemoryMiB: 512, MemoryFixedBy: "the container had no memory limit at create"}},
		{name: "cpuset", spec: newSpec(withCpuset("0-1,3", "0")),
			want: Resources{Topology: one16, MaxVCPUs: 16, MaxMemoryMiB: 512, MemoryFixedBy: "the container had no memory limit at create",
				CPUs: topology.CPUSet{0, 1, 3}, Mems: topology.CPUSet{0}}},
		{name: "hugepages 2Mi", spec: newSpec(withMemory(256<<20), withHugePages("2MB", 1<<30), withHugePages("1GB", 0)), mem: 1024,
			want: Resources{Topology: one16, MaxVCPUs: 16, MaxMemoryMiB: 1024, MemoryFixedBy: "guest RAM is on huge pages", HugePageSize: 2 << 20}},
		{name: "hugepages matching the annotation", spec: newSpec(withHugePages("2MB", 768<<20), withAnn(AnnotationMemory, "768Mi")), mem: 768,
			want: Resources{Topology: one16, MaxVCPUs: 16, MaxMemoryMiB: 768, MemoryFixedBy: "guest RAM is on huge pages", HugePageSize: 2 << 20}},

		{name: "topology too big", spec: newSpec(withAnn(AnnotationCPUTopology, "sockets=4,cores=4,threads=2")),
			wantErr: "annotation vmshim.io/cpu-topology: sockets=4,cores=4,threads=2 holds 32 vcpus, want 1..16 (the vcpus the guest boots with..max_vcpus)"},
		{name: "topology smaller than the boot count", spec: newSpec(withAnn(AnnotationCPUTopology, "sockets=1,cores=2,threads=1"), withAnn(AnnotationVCPUs, "4")),
			wantErr: "annotation vmshim.io/cpu-topology: sockets=1,cores=2,threads=1 holds 2 vcpus, want 4..16 (the vcpus the guest boots with..max_vcpus)"},
		{name: "topology garbage", spec: newSpec(withAnn(AnnotationCPUTopology, "sockets=1,cores=x,threads=1")),
			wantErr: `annotation vmshim.io/cpu-topology: "sockets=1,cores=x,threads=1": cores: "x" is not a whole number`},
		{name: "max-memory below guest RAM", spec: newSpec(withMemory(512<<20), withAnn(AnnotationMaxMemory, "256Mi")),
			wantErr: "annotation vmshim.io/max-memory: 256 MiB is less than the 512 MiB of guest RAM at boot"},
		{name: "max-memory above max_memory", spec: newSpec(withMemory(512<<20), withAnn(AnnotationMaxMemory, "32Gi")),
			wantErr: `annotation vmshim.io/max-memory: "32Gi" is not in 64Mi..16Gi (max_memory)`},
		{name: "cpuset garbage", spec: newSpec(withCpuset("0-", "")), wantErr: "spec linux.resources.cpu.cpus: "},
		{name: "hugepages mismatch", spec: newSpec(withHugePages("2MB", 256<<20), withAnn(AnnotationMemory, "512Mi")),
			wantErr: "hugepages-2Mi limit 256 MiB does not match guest RAM 512 MiB (annotation vmshim.io/memory); guest RAM on huge pages is the hugepages limit"},
		{name: "hugepages of both sizes", spec: newSpec(withHugePages("2MB", 1<<30), withHugePages("1GB", 1<<30)),
			wantErr: "spec linux.resources.hugepageLimits: guest RAM takes huge pages of one size, not both 2Mi and 1Gi"},
		{name: "hugepages of another size", spec: newSpec(withHugePages("64KB", 1<<30)),
			wantErr: `spec linux.resources.hugepageLimits: page size "64KB" is not 2MB or 1GB`},
		{name: "hugepages not whole pages", spec: newSpec(withHugePages("1GB", 1536<<20)),
			wantErr: "hugepages-1Gi limit 1610612736 bytes is not a whole number of pages of at least 64Mi"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Default()
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			got, err := Resolve(cfg, "c1", tc.spec)
			if tc.wantErr != "" {
				if err == nil || !errdefs.IsInvalidArgument(err) || len(err.Error()) < len(tc.wantErr) || err.Error()[:len(tc.wantErr)] != tc.wantErr {
					t.Fatalf("Resolve() error = %v, want invalid argument %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			mem := tc.mem
			if mem == 0 {
				mem = 512
			}
			if got.MemoryMiB != mem || !reflect.DeepEqual(got.Resources, tc.want) {
				t.Fatalf("Resolve() memory %d MiB, resources\n%+v\nwant %d MiB,\n%+v", got.MemoryMiB, got.Resources, mem, tc.want)
			}
		})
	}
}

func TestOnHugePages(t *testing.T) {
	vm, err := Resolve(Default(), "c1", newSpec(withMemory(512<<20)))
	if err != nil {
		t.Fatal(err)
	}
	if err := vm.OnHugePages(1<<30, "a hugetlbfs volume"); err == nil || !errdefs.IsInvalidArgument(err) ||
		err.Error() != "a hugetlbfs volume: guest RAM of 512 MiB is not a whole number of 1024 MiB huge pages" {
		t.Errorf("1 GiB pages for 512 MiB: %v", err)
	}
	if err := vm.OnHugePages(2<<20, "a hugetlbfs volume"); err != nil {
		t.Fatal(err)
	}
	want := Resources{Topology: topology.Topology{Sockets: 1, Cores: 16, Threads: 1}, MaxVCPUs: 16, MaxMemoryMiB: 512,
		MemoryFixedBy: "guest RAM is on huge pages", HugePageSize: 2 << 20}
	if !reflect.DeepEqual(vm.Resources, want) {
		t.Errorf("resources %+v, want %+v", vm.Resources, want)
	}
	if vm.Balloon || vm.BalloonStatsInterval != 0 {
		t.Errorf("guest RAM on huge pages keeps its balloon (%v, statistics every %v)", vm.Balloon, vm.BalloonStatsInterval)
	}
	if err := vm.OnHugePages(2<<20, "another hugetlbfs volume"); err != nil {
		t.Errorf("a second volume of the same page size: %v", err)
	}
	if err := vm.OnHugePages(1<<30, "a hugetlbfs volume"); err == nil ||
		err.Error() != "a hugetlbfs volume has 1024 MiB pages, and guest RAM is already on 2 MiB pages" {
		t.Errorf("a volume of another page size: %v", err)
	}

	// A balloon the annotation asked for cannot have guest RAM on huge
	// pages.
	vm, err = Resolve(Default(), "c1", newSpec(withMemory(512<<20), withAnn(AnnotationBalloon, "on")))
	if err != nil {
		t.Fatal(err)
	}
	err = vm.OnHugePages(2<<20, "a hugetlbfs volume")
	if want := "annotation vmshim.io/balloon: on: guest RAM on huge pages (as a hugetlbfs volume asks) is preallocated and cannot be given back"; err == nil ||
		!errdefs.IsInvalidArgument(err) || err.Error() != want {
		t.Errorf("huge pages with the balloon asked for: %v, want %q", err, want)
	}
	if vm.Resources.HugePageSize != 0 {
		t.Errorf("the refused huge pages were taken: %+v", vm.Resources)
	}
}
