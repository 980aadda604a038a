package qemu

import (
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

// argsBetween returns the part of argv from the first from to the first
// to after it (exclusive), or to the end.
func argsBetween(argv []string, from, to string) []string {
	for i, a := range argv {
		if a != from {
			continue
		}
		for j := i + 1; j < len(argv); j++ {
			if argv[j] == to {
				return argv[i:j]
			}
		}
		return argv[i:]
	}
	return nil
}

func TestBuildArgsResources(t *testing.T) {
	tests := []struct {
		name   string
		change func(*Spec)
		want   string // the args from -smp to -chardev, space-separated
		tail   string // the last args, space-separated; "" = pvpanic's
	}{
		{"fixed vcpus", func(s *Spec) { s.CPUs = 2 }, "-smp 2 -m 512M", ""},
		{"fixed vcpus with a topology", func(s *Spec) { s.CPUs, s.Topology = 4, Topology{2, 1, 2} },
			"-smp 4,sockets=2,cores=1,threads=2 -m 512M", ""},
		{"hot-pluggable vcpus", func(s *Spec) { s.CPUs, s.MaxCPUs = 3, 8 },
			"-smp 1,maxcpus=8,sockets=1,cores=8,threads=1 " +
				"-device max-x86_64-cpu,id=vcpu1,socket-id=0,core-id=1,thread-id=0 " +
				"-device max-x86_64-cpu,id=vcpu2,socket-id=0,core-id=2,thread-id=0 -m 512M", ""},
		{"hot-pluggable vcpus in a topology, kvm", func(s *Spec) { s.Accel, s.CPUs, s.Topology = AccelKVM, 3, Topology{2, 2, 1} },
			"-smp 1,maxcpus=4,sockets=2,cores=2,threads=1 " +
				"-device host-x86_64-cpu,id=vcpu1,socket-id=0,core-id=1,thread-id=0 " +
				"-device host-x86_64-cpu,id=vcpu2,socket-id=1,core-id=0,thread-id=0 -m 512M", ""},
		{"vcpus plugged beyond those online", func(s *Spec) { s.CPUs, s.PluggedCPUs, s.MaxCPUs = 1, 2, 16 },
			"-smp 1,maxcpus=16,sockets=1,cores=16,threads=1 -device max-x86_64-cpu,id=vcpu1,socket-id=0,core-id=1,thread-id=0 -m 512M", ""},
		{"virtio-mem", func(s *Spec) { s.ResizeMiB = 1536 }, "-smp 1 -m 512M,maxmem=2048M",
			"-object memory-backend-ram,id=vmem-ram0,size=1536M -device virtio-mem-pci,id=vmem0,memdev=vmem-ram0,block-size=2M,requested-size=0"},
		{"huge pages", func(s *Spec) { s.HugePageSize = 2 << 20 },
			"-smp 1 -m 512M -object memory-backend-memfd,id=ram0,size=512M,hugetlb=on,hugetlbsize=2097152,prealloc=on", ""},
		{"numa", func(s *Spec) {
			s.CPUs, s.MaxCPUs = 2, 4
			s.NUMA = []NUMANode{{HostNode: 0, VCPUs: []int{0, 2}, MemMiB: 256}, {HostNode: 1, VCPUs: []int{1, 3}, MemMiB: 256}}
		}, "-smp 1,maxcpus=4,sockets=1,cores=4,threads=1 -device max-x86_64-cpu,id=vcpu1,socket-id=0,core-id=1,thread-id=0 -m 512M " +
			"-object memory-backend-ram,id=ram-node0,size=256M,host-nodes=0,policy=bind -numa node,nodeid=0,memdev=ram-node0 " +
			"-object memory-backend-ram,id=ram-node1,size=256M,host-nodes=1,policy=bind -numa node,nodeid=1,memdev=ram-node1 " +
			"-numa cpu,node-id=0,socket-id=0,core-id=0,thread-id=0 -numa cpu,node-id=0,socket-id=0,core-id=2,thread-id=0 " +
			"-numa cpu,node-id=1,socket-id=0,core-id=1,thread-id=0 -numa cpu,node-id=1,socket-id=0,core-id=3,thread-id=0", ""},
		{"numa on 1 GiB pages", func(s *Spec) {
			s.MemoryMiB, s.HugePageSize = 2048, 1<<30
			s.NUMA = []NUMANode{{HostNode: 2, VCPUs: []int{0}, MemMiB: 2048}}
		}, "-smp 1 -m 2048M -object memory-backend-memfd,id=ram-node0,size=2048M,hugetlb=on,hugetlbsize=1073741824,prealloc=on,host-nodes=2,policy=bind " +
			"-numa node,nodeid=0,memdev=ram-node0 -numa cpu,node-id=0,socket-id=0,core-id=0,thread-id=0", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := baseSpec()
			tt.change(&s)
			argv, err := BuildArgs(s)
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(argsBetween(argv, "-smp", "-chardev"), " "); got != tt.want {
				t.Errorf("args\n got: %s\nwant: %s", got, tt.want)
			}
			tail := tt.tail
			if tail == "" {
				tail = "-device pvpanic -action panic=exit-failure"
			}
			if got := strings.Join(argv, " "); !strings.HasSuffix(got, tail) {
				t.Errorf("argv %s\ndoes not end with %s", got, tail)
			}
			machine := strings.Join(argsBetween(argv, "-machine", "-accel"), " ")
			if wantBackend := s.HugePageSize != 0 && len(s.NUMA) == 0; strings.Contains(machine, "memory-backend=ram0") != wantBackend {
				t.Errorf("-machine %q: memory-backend=ram0 wanted %v", machine, wantBackend)
			}
		})
	}
}

func TestValidateResources(t *testing.T) {
	tests := []struct {
		name   string
		change func(*Spec)
		want   string
	}{
		{"topology with a zero", func(s *Spec) { s.Topology = Topology{1, 0, 2} }, "invalid topology: sockets=1,cores=0,threads=2 has a zero"},
		{"topology too big", func(s *Spec) { s.Topology = Topology{4, 64, 1} }, "invalid topology: 256 vcpus is more than 255"},
		{"max cpus off the topology", func(s *Spec) { s.MaxCPUs, s.Topology = 6, Topology{1, 4, 1} }, "invalid max cpus: 6 is not the topology's 4 vcpus"},
		{"more cpus than the topology", func(s *Spec) { s.CPUs, s.Topology = 6, Topology{1, 4, 1} }, "invalid cpus: 6 is more than the topology's 4"},
		{"plugged fewer than online", func(s *Spec) { s.CPUs, s.PluggedCPUs, s.MaxCPUs = 2, 1, 4 }, "invalid plugged cpus: 1 is not in 2..4"},
		{"resize not whole blocks", func(s *Spec) { s.ResizeMiB = 3 }, "invalid resize memory: 3 MiB is not a multiple of 2 MiB"},
		{"huge pages of 4 MiB", func(s *Spec) { s.HugePageSize = 4 << 20 }, "invalid huge page size: 4194304 bytes is not 2 MiB or 1 GiB"},
		{"RAM not whole huge pages", func(s *Spec) { s.HugePageSize = 1 << 30 }, "invalid memory: 512 MiB is not a whole number of 1024 MiB huge pages"},
		{"huge pages resized", func(s *Spec) { s.HugePageSize, s.ResizeMiB = 2<<20, 512 }, "invalid resize memory: guest RAM on huge pages cannot be resized"},
		{"numa vcpu twice", func(s *Spec) {
			s.CPUs, s.MaxCPUs = 2, 2
			s.NUMA = []NUMANode{{VCPUs: []int{0, 1}, MemMiB: 256}, {HostNode: 1, VCPUs: []int{1}, MemMiB: 256}}
		}, "invalid numa: node 1: vcpu 1 is outside the topology or in two nodes"},
		{"numa vcpu in no node", func(s *Spec) {
			s.CPUs, s.MaxCPUs = 1, 2
			s.NUMA = []NUMANode{{VCPUs: []int{0}, MemMiB: 512}}
		}, "invalid numa: vcpu 1 is in no node"},
		{"numa memory off", func(s *Spec) { s.NUMA = []NUMANode{{VCPUs: []int{0}, MemMiB: 500}} }, "invalid numa: the nodes hold 500 MiB, guest RAM is 512 MiB"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := baseSpec()
			tt.change(&s)
			err := s.Validate()
			if err == nil || !errdefs.IsInvalidArgument(err) || !strings.HasPrefix(err.Error(), tt.want) {
				t.Fatalf("Validate() = %v, want invalid argument %q", err, tt.want)
			}
		})
	}
}
