package config

import (
	"encoding/json"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/vmshim/vmshim/cloudinit"
)

// slow is how long one fuzz input may take: every parser here answers in
// microseconds, and the fuzzer itself does not notice an input that hangs.
const slow = 10 * time.Second

// specSeeds are FuzzResolveSpec inputs: runtime specs as containerd's CRI
// plugin writes them, and some it never would.
func specSeeds() [][]byte {
	key := sshKey("ssh-ed25519", "bob")
	specJSON := func(v any) []byte {
		b, err := json.Marshal(v)
		if err != nil {
			panic(err)
		}
		return b
	}
	full := newSpec(withCPU(150000, 100000), withMemory(1<<30), withAnn(AnnotationSSHAuthorizedKeys, key),
		withAnn(AnnotationUserData, "#cloud-config\nwrite_files:\n- path: /etc/motd\n  content: hi\n"),
		withAnn("io.kubernetes.cri.sandbox-id", "abc"))
	full.Mounts = []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc"},
		{Destination: "/etc/hosts", Type: "bind", Source: "/etc/hosts", Options: []string{"rbind", "ro"}},
		{Destination: "/data", Type: "bind", Source: "/", Options: []string{"rbind", "rw"}},
		{Destination: ServiceAccountDir, Source: "/", Options: []string{"bind"}},
		{Destination: "/tmp/x", Type: "tmpfs", Source: "tmpfs"},
	}
	return [][]byte{
		[]byte(`{}`),
		[]byte(`null`),
		specJSON(newSpec()),
		specJSON(full),
		[]byte(`{"ociVersion":"1.2.0","process":{"env":["PATH=/bin","A=b\nc"]},"hostname":"a\nb","annotations":{"vmshim.io/vcpus":"4","vmshim.io/memory":"2Gi"},"linux":{"resources":{"memory":{"limit":1073741824},"cpu":{"quota":-1,"period":100000}}}}`),
		[]byte(`{"linux":{"resources":{"cpu":{"quota":9223372036854775807,"period":1}}}}`),
		[]byte(`{"linux":{"resources":{"cpu":{"quota":1,"period":18446744073709551615}}}}`),
		[]byte(`{"linux":{"resources":{"memory":{"limit":67108863}}}}`),
		[]byte(`{"annotations":{"vmshim.io/memory":"1Gi"},"linux":{"resources":{"memory":{"limit":536870912}}}}`),
		[]byte(`{"mounts":[{"destination":"/a b","type":"bind","source":"/"},{"destination":"/\u00e9t\u00e9","options":["bind","ro","rw"],"source":"/"},{"destination":"/x\ufffd","type":"bind","source":"/"},{"destination":"rel","type":"bind","source":"/"},{"destination":"/","type":"bind","source":"/"},{"destination":"/f","type":"bind","source":"/etc/hostname"}]}`),
		[]byte(`{"annotations":{"vmshim.io/":"","vmshim.io/VCPUS":"2"}}`),
	}
}

// FuzzResolveSpec decodes a runtime spec and resolves the VM and the 9p
// shares it asks for, as the shim does at create.
func FuzzResolveSpec(f *testing.F) {
	for _, s := range specSeeds() {
		f.Add(s)
	}
	cfg := Default()
	f.Fuzz(func(t *testing.T, data []byte) {
		var spec specs.Spec
		if json.Unmarshal(data, &spec) != nil {
			return
		}
		start := time.Now()
		vm, err := Resolve(cfg, "c1", &spec)
		if d := time.Since(start); d > slow {
			t.Fatalf("Resolve took %v", d)
		}
		checkResolved(t, cfg, &spec, vm, err)
		shares, skipped := ResolveShares(&spec)
		for i, s := range shares {
			if s.Tag != ShareTagPrefix+strconv.Itoa(i) {
				t.Errorf("share %d has tag %q", i, s.Tag)
			}
			for _, p := range []string{s.HostPath, s.GuestPath} {
				if !filepath.IsAbs(p) || filepath.Clean(p) != p {
					t.Errorf("share %d: path %q is not absolute and clean", i, p)
				}
			}
			if s.GuestPath == "/" || strings.ContainsAny(s.GuestPath, " \t\\") || strings.IndexFunc(s.GuestPath, isControl) >= 0 {
				t.Errorf("share %d: guest path %q cannot be a mount point in fstab", i, s.GuestPath)
			}
			if s.GuestPath == ServiceAccountDir && !s.ReadOnly {
				t.Errorf("service account share is writable")
			}
		}
		for _, s := range skipped {
			if strings.ContainsAny(s, "\n\r") {
				t.Errorf("skipped mount message has a line break: %q", s)
			}
		}
		if err == nil {
			checkSeed(t, &spec, vm, shares)
		}
	})
}

// checkResolved checks the invariants of Resolve's answer: errors are one
// line of valid UTF-8 (they reach kubectl describe through gRPC) and
// invalid-argument; a VM is within cfg's limits and resolving again gives
// the same VM.
func checkResolved(t *testing.T, cfg Config, spec *specs.Spec, vm *VM, err error) {
	t.Helper()
	if err != nil {
		msg := err.Error()
		if msg == "" || strings.ContainsAny(msg, "\n\r") || !utf8.ValidString(msg) {
			t.Fatalf("error is not one line of UTF-8: %q", msg)
		}
		if !errdefs.IsInvalidArgument(err) {
			t.Fatalf("error is not invalid-argument: %v", err)
		}
		if vm != nil {
			t.Fatalf("Resolve returned both a VM and %v", err)
		}
		return
	}
	if vm == nil {
		t.Fatal("Resolve returned no VM and no error")
	}
	if vm.ID != "c1" || vm.Hostname != spec.Hostname {
		t.Errorf("id %q hostname %q", vm.ID, vm.Hostname)
	}
	if vm.VCPUs < 1 || vm.VCPUs > cfg.MaxVCPUs {
		t.Errorf("%d vcpus, not in 1..%d", vm.VCPUs, cfg.MaxVCPUs)
	}
	if mem := int64(vm.MemoryMiB) << 20; mem < MinMemory || mem > mustBytes(cfg.MaxMemory) {
		t.Errorf("%d MiB of memory, not in 64Mi..%s", vm.MemoryMiB, cfg.MaxMemory)
	}
	if !validDiskDriver(vm.DiskDriver) {
		t.Errorf("disk driver %q", vm.DiskDriver)
	}
	if vm.RootDiskSize < 0 || vm.RootDiskSize > cfg.MaxDiskBytes() {
		t.Errorf("root disk size %d not in 0..%s", vm.RootDiskSize, cfg.MaxDiskSize)
	}
	if !strings.HasPrefix(vm.KernelCmdline, cfg.KernelCmdline) || strings.ContainsAny(vm.KernelCmdline, "\x00\n\r") ||
		len(vm.KernelCmdline) > len(cfg.KernelCmdline)+1+maxCmdline {
		t.Errorf("kernel command line %q", vm.KernelCmdline)
	}
	for _, k := range vm.SSHAuthorizedKeys {
		if k == "" || k != strings.TrimSpace(k) || strings.ContainsAny(k, "\x00\n\r") {
			t.Errorf("ssh key %q", k)
		}
	}
	if len(vm.UserData) > MaxUserData || len(vm.NetworkConfig) > MaxNetworkConfig {
		t.Errorf("user-data of %d bytes, network-config of %d", len(vm.UserData), len(vm.NetworkConfig))
	}
	if vm.BootTimeout <= 0 {
		t.Errorf("boot timeout %v", vm.BootTimeout)
	}
	again, err := Resolve(cfg, "c1", spec)
	if err != nil || !reflect.DeepEqual(vm, again) {
		t.Errorf("Resolve is not deterministic: %+v then %+v, %v", vm, again, err)
	}
}

// checkSeed checks that the cloud-init seed builder takes what Resolve and
// ResolveShares accepted, as the shim hands it over at create.
func checkSeed(t *testing.T, spec *specs.Spec, vm *VM, shares []Share) {
	t.Helper()
	ci := cloudinit.Documents{
		InstanceID:    "vmshim-c1",
		Hostname:      spec.Hostname,
		UserData:      vm.UserData,
		SSHKeys:       vm.SSHAuthorizedKeys,
		Env:           vm.Env,
		MACs:          []string{"52:54:00:12:34:56"},
		NetworkConfig: vm.NetworkConfig,
	}
	for _, s := range shares {
		ci.Mounts = append(ci.Mounts, cloudinit.Mount{Tag: s.Tag, Path: s.GuestPath, ReadOnly: s.ReadOnly})
	}
	if _, err := ci.Files(); err != nil {
		t.Fatalf("config accepts what the cloud-init seed refuses: %v", err)
	}
}

func isControl(r rune) bool { return r < ' ' || r == 0x7f }
