package config

import (
	"encoding/base64"
	"encoding/binary"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// sshKey builds a syntactically valid public key line of the given type.
func sshKey(typ, comment string) string {
	var blob []byte
	for _, part := range [][]byte{[]byte(typ), make([]byte, 32)} {
		blob = binary.BigEndian.AppendUint32(blob, uint32(len(part)))
		blob = append(blob, part...)
	}
	line := typ + " " + base64.StdEncoding.EncodeToString(blob)
	if comment != "" {
		line += " " + comment
	}
	return line
}

func ptr[T any](v T) *T { return &v }

type specOpt func(*specs.Spec)

func withAnn(k, v string) specOpt {
	return func(s *specs.Spec) {
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		s.Annotations[k] = v
	}
}

func withCPU(quota int64, period uint64) specOpt {
	return func(s *specs.Spec) { resources(s).CPU = &specs.LinuxCPU{Quota: &quota, Period: &period} }
}

func withMemory(limit int64) specOpt {
	return func(s *specs.Spec) { resources(s).Memory = &specs.LinuxMemory{Limit: &limit} }
}

func resources(s *specs.Spec) *specs.LinuxResources {
	if s.Linux == nil {
		s.Linux = &specs.Linux{}
	}
	if s.Linux.Resources == nil {
		s.Linux.Resources = &specs.LinuxResources{}
	}
	return s.Linux.Resources
}

func newSpec(opts ...specOpt) *specs.Spec {
	s := &specs.Spec{Hostname: "vm1", Process: &specs.Process{Env: []string{"A=1"}}}
	for _, o := range opts {
		o(s)
	}
	return s
}

func baseVM() VM {
	return VM{
		ID: "c1", Hostname: "vm1", VCPUs: 1, MemoryMiB: 512, DiskDriver: "virtio-blk",
		KernelCmdline: "console=ttyS0 no_timer_check", Env: []string{"A=1"}, BootTimeout: 60 * time.Second,
		Mesh: MeshRefuse, Balloon: true, BalloonStatsInterval: 10 * time.Second,
	}
}

func TestResolve(t *testing.T) {
	k1, k2 := sshKey("ssh-ed25519", "alice@example"), sshKey("ecdsa-sha2-nistp256", "")
	tests := []struct {
		name    string
		cfg     func(*Config)
		spec    *specs.Spec
		want    func(*VM) // applied to baseVM()
		wantErr string    // exact message; "" = success
	}{
		{name: "defaults", spec: newSpec(), want: func(*VM) {}},
		{name: "config defaults", cfg: func(c *Config) {
			c.DefaultVCPUs, c.DefaultMemory, c.DiskDriver, c.BootTimeout = 2, "1Gi", "nvme", "5s"
		}, spec: newSpec(), want: func(v *VM) { v.VCPUs, v.MemoryMiB, v.DiskDriver, v.BootTimeout = 2, 1024, "nvme", 5*time.Second }},
		{name: "no process", spec: &specs.Spec{}, want: func(v *VM) { v.Hostname, v.Env = "", nil }},

		// The balloon
		{name: "balloon off", spec: newSpec(withAnn(AnnotationBalloon, "off")), want: func(v *VM) { v.Balloon, v.BalloonStatsInterval = false, 0 }},
		{name: "balloon off in the config", cfg: func(c *Config) { c.Balloon = false }, spec: newSpec(),
			want: func(v *VM) { v.Balloon, v.BalloonStatsInterval = false, 0 }},
		{name: "balloon on over the config", cfg: func(c *Config) { c.Balloon, c.BalloonStatsInterval = false, "0" },
			spec: newSpec(withAnn(AnnotationBalloon, "on")), want: func(v *VM) { v.BalloonAsked, v.BalloonStatsInterval = true, 0 }},
		{name: "balloon statistics every minute", cfg: func(c *Config) { c.BalloonStatsInterval = "1m" }, spec: newSpec(),
			want: func(v *VM) { v.BalloonStatsInterval = time.Minute }},
		{name: "balloon yes", spec: newSpec(withAnn(AnnotationBalloon, "yes")), wantErr: `annotation vmshim.io/balloon: "yes" is not one of on, off`},
		{name: "balloon on huge pages", spec: newSpec(withAnn(AnnotationBalloon, "on"), withMemory(512<<20), withHugePages("2MB", 512<<20)),
			wantErr: "annotation vmshim.io/balloon: on: guest RAM on huge pages (as the container's hugepages limit asks) is preallocated and cannot be given back"},

		// vCPUs
		{name: "vcpus annotation", spec: newSpec(withAnn(AnnotationVCPUs, "4")), want: func(v *VM) { v.VCPUs = 4 }},
		{name: "vcpus not a number", spec: newSpec(withAnn(AnnotationVCPUs, "abc")), wantErr: `annotation vmshim.io/vcpus: "abc" is not a whole number`},
		{name: "vcpus signed", spec: newSpec(withAnn(AnnotationVCPUs, "+2")), wantErr: `annotation vmshim.io/vcpus: "+2" is not a whole number`},
		{name: "vcpus zero", spec: newSpec(withAnn(AnnotationVCPUs, "0")), wantErr: `annotation vmshim.io/vcpus: 0 is not in 1..16 (max_vcpus)`},
		{name: "vcpus above max", spec: newSpec(withAnn(AnnotationVCPUs, "17")), wantErr: `annotation vmshim.io/vcpus: 17 is not in 1..16 (max_vcpus)`},
		{name: "vcpus overflow", spec: newSpec(withAnn(AnnotationVCPUs, "99999999999999999999")), wantErr: `annotation vmshim.io/vcpus: 99999999999999999999 is not in 1..16 (max_vcpus)`},
		{name: "cpu quota rounds up", spec: newSpec(withCPU(150000, 100000)), want: func(v *VM) { v.VCPUs = 2 }},
		{name: "cpu quota exact", spec: newSpec(withCPU(300000, 100000)), want: func(v *VM) { v.VCPUs = 3 }},
		{name: "cpu quota tiny", spec: newSpec(withCPU(1000, 100000)), want: func(v *VM) { v.VCPUs = 1 }},
		{name: "cpu quota unlimited", spec: newSpec(withCPU(-1, 100000)), want: func(*VM) {}},
		{name: "cpu period zero", spec: newSpec(withCPU(150000, 0)), want: func(*VM) {}},
		{name: "cpu shares only", spec: newSpec(func(s *specs.Spec) { resources(s).CPU = &specs.LinuxCPU{Shares: ptr(uint64(1024))} }), want: func(*VM) {}},
		{name: "cpu quota above max", spec: newSpec(withCPU(2000000, 100000)), wantErr: "spec linux.resources.cpu: quota 2000000 / period 100000 gives 20 vcpus, more than 16 (max_vcpus)"},
		{name: "cpu quota huge", spec: newSpec(withCPU(1<<62, 1)), wantErr: "spec linux.resources.cpu: quota 4611686018427387904 / period 1 gives 4611686018427387904 vcpus, more than 16 (max_vcpus)"},
		{name: "annotation beats cpu limit", spec: newSpec(withCPU(2000000, 100000), withAnn(AnnotationVCPUs, "3")), want: func(v *VM) { v.VCPUs = 3 }},

		// memory
		{name: "memory annotation", spec: newSpec(withAnn(AnnotationMemory, "2Gi")), want: func(v *VM) { v.MemoryMiB = 2048 }},
		{name: "memory annotation decimal rounds down", spec: newSpec(withAnn(AnnotationMemory, "100M")), want: func(v *VM) { v.MemoryMiB = 95 }},
		{name: "memory annotation bad", spec: newSpec(withAnn(AnnotationMemory, "2GB")), wantErr: `annotation vmshim.io/memory: "2GB" is not a quantity (e.g. 512Mi)`},
		{name: "memory annotation small", spec: newSpec(withAnn(AnnotationMemory, "63Mi")), wantErr: `annotation vmshim.io/memory: "63Mi" is not in 64Mi..16Gi (max_memory)`},
		{name: "memory annotation above max", spec: newSpec(withAnn(AnnotationMemory, "17Gi")), wantErr: `annotation vmshim.io/memory: "17Gi" is not in 64Mi..16Gi (max_memory)`},
		{name: "memory annotation negative", spec: newSpec(withAnn(AnnotationMemory, "-1Gi")), wantErr: `annotation vmshim.io/memory: "-1Gi" is negative`},
		{name: "memory limit", spec: newSpec(withMemory(1<<30 + 12345)), want: func(v *VM) { v.MemoryMiB = 1024 }},
		{name: "memory limit unlimited", spec: newSpec(withMemory(-1)), want: func(*VM) {}},
		{name: "memory limit small", spec: newSpec(withMemory(32 << 20)), wantErr: "spec linux.resources.memory.limit: 33554432 bytes is less than 64Mi"},
		{name: "memory limit above max", spec: newSpec(withMemory(32 << 30)), wantErr: "spec linux.resources.memory.limit: 34359738368 bytes is more than 16Gi (max_memory)"},
		{name: "annotation beats memory limit", spec: newSpec(withMemory(32<<30), withAnn(AnnotationMemory, "256Mi")), want: func(v *VM) { v.MemoryMiB = 256 }},
		{name: "annotation above memory limit", spec: newSpec(withMemory(256<<20), withAnn(AnnotationMemory, "512Mi")),
			wantErr: "annotation vmshim.io/memory: 536870912 bytes is more than the container's memory limit (268435456 bytes)"},
		{name: "spec limits beat config defaults", cfg: func(c *Config) { c.DefaultVCPUs, c.DefaultMemory = 4, "4Gi" },
			spec: newSpec(withCPU(100000, 100000), withMemory(128<<20)), want: func(v *VM) { v.VCPUs, v.MemoryMiB = 1, 128 }},

		// disk
		{name: "disk driver", spec: newSpec(withAnn(AnnotationDiskDriver, "virtio-scsi")), want: func(v *VM) { v.DiskDriver = "virtio-scsi" }},
		{name: "disk driver beats config", cfg: func(c *Config) { c.DiskDriver = "nvme" }, spec: newSpec(withAnn(AnnotationDiskDriver, "virtio-blk")), want: func(v *VM) { v.DiskDriver = "virtio-blk" }},
		{name: "disk driver bad", spec: newSpec(withAnn(AnnotationDiskDriver, "floppy")), wantErr: `annotation vmshim.io/disk-driver: "floppy" is not one of virtio-blk, virtio-scsi, nvme, sata, ide`},
		{name: "root disk size", spec: newSpec(withAnn(AnnotationRootDiskSize, "20Gi")), want: func(v *VM) { v.RootDiskSize = 20 << 30 }},
		{name: "root disk size bad", spec: newSpec(withAnn(AnnotationRootDiskSize, "big")), wantErr: `annotation vmshim.io/root-disk-size: "big" is not a quantity (e.g. 512Mi)`},
		{name: "root disk size zero", spec: newSpec(withAnn(AnnotationRootDiskSize, "0")), wantErr: `annotation vmshim.io/root-disk-size: "0" must be greater than zero`},
		{name: "root disk size above max", spec: newSpec(withAnn(AnnotationRootDiskSize, "1Ti")), wantErr: `annotation vmshim.io/root-disk-size: "1Ti" is more than 256Gi (max_disk_size)`},

		// cloud-init
		{name: "user data", spec: newSpec(withAnn(AnnotationUserData, "#cloud-config\n")), want: func(v *VM) { v.UserData = "#cloud-config\n" }},
		{name: "user data limit", spec: newSpec(withAnn(AnnotationUserData, "#!"+strings.Repeat("x", MaxUserData-2))), want: func(v *VM) { v.UserData = "#!" + strings.Repeat("x", MaxUserData-2) }},
		{name: "user data too big", spec: newSpec(withAnn(AnnotationUserData, "#!"+strings.Repeat("x", MaxUserData-1))), wantErr: "annotation vmshim.io/user-data: 65537 bytes, more than 65536"},
		{name: "user data not cloud-init", spec: newSpec(withAnn(AnnotationUserData, "hello")), wantErr: "annotation vmshim.io/user-data: user-data must start with #cloud-config or #!"},
		{name: "network config", spec: newSpec(withAnn(AnnotationNetworkConfig, "version: 2\n")), want: func(v *VM) { v.NetworkConfig = "version: 2\n" }},
		{name: "network config too big", spec: newSpec(withAnn(AnnotationNetworkConfig, "version: 2\n"+strings.Repeat("#", MaxNetworkConfig))), wantErr: "annotation vmshim.io/network-config: 65547 bytes, more than 65536"},
		{name: "ssh keys", spec: newSpec(withAnn(AnnotationSSHAuthorizedKeys, "\n"+k1+"\r\n\n  "+k2+"  \n")), want: func(v *VM) { v.SSHAuthorizedKeys = []string{k1, k2} }},
		{name: "ssh keys empty", spec: newSpec(withAnn(AnnotationSSHAuthorizedKeys, "\n\n")), want: func(*VM) {}},
		{name: "ssh key garbage", spec: newSpec(withAnn(AnnotationSSHAuthorizedKeys, k1+"\nhello world")), wantErr: `annotation vmshim.io/ssh-authorized-keys: line 2 is not an ssh public key ("type base64 [comment]")`},
		{name: "ssh key type only", spec: newSpec(withAnn(AnnotationSSHAuthorizedKeys, "ssh-rsa")), wantErr: `annotation vmshim.io/ssh-authorized-keys: line 1 is not an ssh public key ("type base64 [comment]")`},
		{name: "ssh key type mismatch", spec: newSpec(withAnn(AnnotationSSHAuthorizedKeys, "ssh-rsa"+strings.TrimPrefix(k1, "ssh-ed25519"))), wantErr: `annotation vmshim.io/ssh-authorized-keys: line 1 is not an ssh public key ("type base64 [comment]")`},
		{name: "ssh key with options", spec: newSpec(withAnn(AnnotationSSHAuthorizedKeys, `command="/bin/true" `+k1)), wantErr: `annotation vmshim.io/ssh-authorized-keys: line 1 is not an ssh public key ("type base64 [comment]")`},

		// kernel command line
		{name: "kernel cmdline", spec: newSpec(withAnn(AnnotationKernelCmdline, "  quiet loglevel=3 ")), want: func(v *VM) { v.KernelCmdline = "console=ttyS0 no_timer_check quiet loglevel=3" }},
		{name: "kernel cmdline empty config", cfg: func(c *Config) { c.KernelCmdline = "" }, spec: newSpec(withAnn(AnnotationKernelCmdline, "quiet")), want: func(v *VM) { v.KernelCmdline = "quiet" }},
		{name: "kernel cmdline newline", spec: newSpec(withAnn(AnnotationKernelCmdline, "quiet\ninit=/bin/sh")), wantErr: "annotation vmshim.io/kernel-cmdline: contains a newline or NUL"},
		{name: "kernel cmdline nul", spec: newSpec(withAnn(AnnotationKernelCmdline, "quiet\x00")), wantErr: "annotation vmshim.io/kernel-cmdline: contains a newline or NUL"},
		{name: "kernel cmdline long", spec: newSpec(withAnn(AnnotationKernelCmdline, strings.Repeat("a", 4097))), wantErr: "annotation vmshim.io/kernel-cmdline: 4097 bytes, more than 4096"},

		// other annotations
		{name: "unknown vmshim annotation", spec: newSpec(withAnn("vmshim.io/cpus", "2")), wantErr: "unknown annotation vmshim.io/cpus"},
		{name: "unknown vmshim annotations sorted", spec: newSpec(withAnn("vmshim.io/z", ""), withAnn("vmshim.io/a", "")), wantErr: "unknown annotation vmshim.io/a, vmshim.io/z"},
		{name: "foreign annotations ignored", spec: newSpec(withAnn("io.kubernetes.cri.sandbox-id", "x"), withAnn("example.com/vmshim.io/vcpus", "x")), want: func(*VM) {}},

		// mesh
		{name: "mesh bypass", spec: newSpec(withAnn(AnnotationMesh, "bypass")), want: func(vm *VM) { vm.Mesh = MeshBypass }},
		{name: "mesh from the config", cfg: func(c *Config) { c.Mesh = MeshBypass }, spec: newSpec(), want: func(vm *VM) { vm.Mesh = MeshBypass }},
		{name: "mesh refuse over the config", cfg: func(c *Config) { c.Mesh = MeshBypass }, spec: newSpec(withAnn(AnnotationMesh, "refuse")), want: func(*VM) {}},
		{name: "mesh bad", spec: newSpec(withAnn(AnnotationMesh, "istio")), wantErr: `annotation vmshim.io/mesh: "istio" is not one of refuse, bypass`},
		{name: "mesh bad config", cfg: func(c *Config) { c.Mesh = "" }, spec: newSpec(), wantErr: `config: mesh: "" is not one of refuse, bypass`},

		// bad inputs
		{name: "nil spec", spec: nil, wantErr: "container c1: no runtime spec"},
		{name: "invalid config", cfg: func(c *Config) { c.Accel = "x" }, spec: newSpec(), wantErr: `config: accel: "x" is not one of auto, kvm, tcg`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Default()
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			got, err := Resolve(cfg, "c1", tc.spec)
			if tc.wantErr != "" {
				if err == nil {
					t.Fatalf("Resolve() = %+v, want error %q", got, tc.wantErr)
				}
				if err.Error() != tc.wantErr {
					t.Fatalf("Resolve() error = %q, want %q", err, tc.wantErr)
				}
				if !errdefs.IsInvalidArgument(err) {
					t.Fatalf("Resolve() error %q is not ErrInvalidArgument", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Resolve() error = %v", err)
			}
			want := baseVM()
			tc.want(&want)
			want.Resources = got.Resources // TestResolveResources checks them
			if !reflect.DeepEqual(*got, want) {
				t.Fatalf("Resolve() =\n%+v\nwant\n%+v", *got, want)
			}
		})
	}
}

func TestResolveEmptyID(t *testing.T) {
	if _, err := Resolve(Default(), "", newSpec()); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("Resolve(\"\") error = %v, want invalid argument", err)
	}
}

func TestResolveCopiesEnv(t *testing.T) {
	s := newSpec()
	vm, err := Resolve(Default(), "c1", s)
	if err != nil {
		t.Fatal(err)
	}
	s.Process.Env[0] = "B=2"
	if vm.Env[0] != "A=1" {
		t.Fatalf("VM.Env shares the spec's slice: %v", vm.Env)
	}
}
