package config

import (
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

const testSum = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"

// diskSpec is a container with a volume at /data, a read-only one at
// /ro, a tmpfs at /tmp and a block device at /dev/xvdb.
func diskSpec(ann map[string]string) *specs.Spec {
	return &specs.Spec{
		Annotations: ann,
		Mounts: []specs.Mount{
			{Destination: "/data", Type: "bind", Source: "/var/lib/kubelet/pods/u/volumes/data", Options: []string{"rbind", "rw"}},
			{Destination: "/ro", Type: "bind", Source: "/srv/ro", Options: []string{"rbind", "ro"}},
			{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs"},
		},
		Linux: &specs.Linux{Devices: []specs.LinuxDevice{{Path: "/dev/xvdb", Type: "b", Major: 7, Minor: 3}}},
	}
}

func TestResolveDisks(t *testing.T) {
	tests := []struct {
		name    string
		ann     map[string]string
		check   func(*testing.T, *VM)
		wantErr string
	}{
		{name: "none", ann: nil, check: func(t *testing.T, vm *VM) {
			if vm.RootVolume != nil || vm.DiskURL != "" || vm.DiskSHA256 != "" {
				t.Errorf("got %+v", vm)
			}
		}},
		{name: "filesystem volume", ann: map[string]string{AnnotationRootDiskVolume: "/data/"}, check: func(t *testing.T, vm *VM) {
			want := RootVolume{Path: "/data", HostDir: "/var/lib/kubelet/pods/u/volumes/data"}
			if vm.RootVolume == nil || *vm.RootVolume != want || vm.RootDiskPolicy != RootDiskKeep {
				t.Errorf("root volume %+v policy %q, want %+v keep", vm.RootVolume, vm.RootDiskPolicy, want)
			}
		}},
		{name: "block volume recreate", ann: map[string]string{AnnotationRootDiskVolume: "/dev/xvdb", AnnotationRootDiskPolicy: "recreate"}, check: func(t *testing.T, vm *VM) {
			if vm.RootVolume == nil || !vm.RootVolume.Block || vm.RootVolume.Path != "/dev/xvdb" || vm.RootDiskPolicy != RootDiskRecreate {
				t.Errorf("root volume %+v policy %q", vm.RootVolume, vm.RootDiskPolicy)
			}
		}},
		{name: "url", ann: map[string]string{AnnotationDiskURL: "https://disks.example/a.qcow2?x=1", AnnotationDiskSHA256: "sha256:" + strings.ToUpper(testSum)}, check: func(t *testing.T, vm *VM) {
			if vm.DiskURL != "https://disks.example/a.qcow2?x=1" || vm.DiskSHA256 != testSum {
				t.Errorf("url %q sum %q", vm.DiskURL, vm.DiskSHA256)
			}
		}},
		{name: "suspend on stop", ann: map[string]string{AnnotationRootDiskVolume: "/data", AnnotationOnStop: "suspend"}, check: func(t *testing.T, vm *VM) {
			if !vm.Suspend {
				t.Errorf("vmshim.io/on-stop suspend with a volume: Suspend is false")
			}
		}},
		{name: "poweroff on stop", ann: map[string]string{AnnotationRootDiskVolume: "/data", AnnotationOnStop: "poweroff"}, check: func(t *testing.T, vm *VM) {
			if vm.Suspend {
				t.Errorf("vmshim.io/on-stop poweroff: Suspend is true")
			}
		}},
		{name: "suspend with the kubelet's grace period", ann: map[string]string{AnnotationRootDiskVolume: "/data", AnnotationOnStop: "suspend", AnnotationTerminationGracePeriod: "45"}, check: func(t *testing.T, vm *VM) {
			if !vm.Suspend || vm.StopGrace != 45*time.Second {
				t.Errorf("Suspend %v, StopGrace %v; want true, 45s", vm.Suspend, vm.StopGrace)
			}
		}},
		{name: "a grace period of 0", ann: map[string]string{AnnotationRootDiskVolume: "/data", AnnotationOnStop: "suspend", AnnotationTerminationGracePeriod: "0"}, check: func(t *testing.T, vm *VM) {
			if vm.StopGrace != 2*time.Second {
				t.Errorf("StopGrace %v, want the kubelet's 2 s", vm.StopGrace)
			}
		}},
		{name: "a grace period without suspend", ann: map[string]string{AnnotationTerminationGracePeriod: "junk"}, check: func(t *testing.T, vm *VM) {
			if vm.StopGrace != 0 {
				t.Errorf("StopGrace %v of a VM that powers off", vm.StopGrace)
			}
		}},
		{name: "bad grace period", ann: map[string]string{AnnotationRootDiskVolume: "/data", AnnotationOnStop: "suspend", AnnotationTerminationGracePeriod: "-1"}, wantErr: `io.kubernetes.pod.terminationGracePeriod: "-1" is not a number of seconds from 0 to 86400`},
		{name: "huge grace period", ann: map[string]string{AnnotationRootDiskVolume: "/data", AnnotationOnStop: "suspend", AnnotationTerminationGracePeriod: "99999999999999999999"}, wantErr: "is not a number of seconds"},
		{name: "boot on a resume error", ann: map[string]string{AnnotationRootDiskVolume: "/data", AnnotationOnResumeError: "boot"}, check: func(t *testing.T, vm *VM) {
			if !vm.ResumeErrorBoots {
				t.Errorf("vmshim.io/on-resume-error boot: ResumeErrorBoots is false")
			}
		}},
		{name: "refuse on a resume error", ann: map[string]string{AnnotationRootDiskVolume: "/data"}, check: func(t *testing.T, vm *VM) {
			if vm.ResumeErrorBoots {
				t.Errorf("by default, ResumeErrorBoots is true")
			}
		}},
		{name: "bad on-resume-error", ann: map[string]string{AnnotationOnResumeError: "retry"}, wantErr: `"retry" is not one of refuse, boot`},
		{name: "suspend without a volume", ann: map[string]string{AnnotationOnStop: "suspend"}, wantErr: "vmshim.io/on-stop: suspend needs vmshim.io/root-disk-volume"},
		{name: "suspend on a block volume", ann: map[string]string{AnnotationRootDiskVolume: "/dev/xvdb", AnnotationOnStop: "suspend"}, wantErr: "needs a filesystem volume"},
		{name: "bad on-stop", ann: map[string]string{AnnotationOnStop: "hibernate"}, wantErr: `"hibernate" is not one of poweroff, suspend`},
		{name: "unknown volume", ann: map[string]string{AnnotationRootDiskVolume: "/nope"}, wantErr: "annotation vmshim.io/root-disk-volume: /nope is neither a volume mounted in the container nor one of its block devices"},
		{name: "read-only volume", ann: map[string]string{AnnotationRootDiskVolume: "/ro"}, wantErr: "the volume at /ro is mounted read-only"},
		{name: "tmpfs", ann: map[string]string{AnnotationRootDiskVolume: "/tmp"}, wantErr: "the mount at /tmp is a tmpfs mount"},
		{name: "relative", ann: map[string]string{AnnotationRootDiskVolume: "data"}, wantErr: `"data" is not an absolute path`},
		{name: "root", ann: map[string]string{AnnotationRootDiskVolume: "/.."}, wantErr: "is the container's root"},
		{name: "newline", ann: map[string]string{AnnotationRootDiskVolume: "/data\n"}, wantErr: "contains a newline"},
		{name: "policy alone", ann: map[string]string{AnnotationRootDiskPolicy: "keep"}, wantErr: "vmshim.io/root-disk-policy: needs vmshim.io/root-disk-volume"},
		{name: "bad policy", ann: map[string]string{AnnotationRootDiskVolume: "/data", AnnotationRootDiskPolicy: "always"}, wantErr: `"always" is not keep or recreate`},
		{name: "url without sum", ann: map[string]string{AnnotationDiskURL: "http://a/b"}, wantErr: "vmshim.io/disk-url: needs vmshim.io/disk-sha256"},
		{name: "sum without url", ann: map[string]string{AnnotationDiskSHA256: testSum}, wantErr: "vmshim.io/disk-sha256: is set without vmshim.io/disk-url"},
		{name: "file url", ann: map[string]string{AnnotationDiskURL: "file:///etc/shadow", AnnotationDiskSHA256: testSum}, wantErr: "scheme must be http or https"},
		{name: "no host", ann: map[string]string{AnnotationDiskURL: "http:///x", AnnotationDiskSHA256: testSum}, wantErr: "no host"},
		{name: "fragment", ann: map[string]string{AnnotationDiskURL: "http://a/b#c", AnnotationDiskSHA256: testSum}, wantErr: "has a fragment"},
		{name: "blank in url", ann: map[string]string{AnnotationDiskURL: "http://a/b c", AnnotationDiskSHA256: testSum}, wantErr: "has a space or control character"},
		{name: "long url", ann: map[string]string{AnnotationDiskURL: "http://a/" + strings.Repeat("x", 4096), AnnotationDiskSHA256: testSum}, wantErr: "longer than 4096 bytes"},
		{name: "short sum", ann: map[string]string{AnnotationDiskURL: "http://a/b", AnnotationDiskSHA256: testSum[:63]}, wantErr: "want 64 hex digits"},
		{name: "md5", ann: map[string]string{AnnotationDiskURL: "http://a/b", AnnotationDiskSHA256: "md5:" + testSum}, wantErr: "want 64 hex digits"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			vm, err := Resolve(Default(), "c1", diskSpec(tc.ann))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errdefs.IsInvalidArgument(err) || strings.Contains(err.Error(), "\n") {
					t.Fatalf("Resolve() error = %v, want one InvalidArgument line containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, vm)
		})
	}
}

// TestResolveOnStopDefault: the config's on_stop suspend applies to a VM
// with a root-disk volume, and leaves one without a volume powering off.
func TestResolveOnStopDefault(t *testing.T) {
	cfg := Default()
	cfg.OnStop = OnStopSuspend
	for _, tc := range []struct {
		ann  map[string]string
		want bool
	}{
		{map[string]string{AnnotationRootDiskVolume: "/data"}, true},
		{nil, false},
		{map[string]string{AnnotationRootDiskVolume: "/data", AnnotationOnStop: "poweroff"}, false},
	} {
		vm, err := Resolve(cfg, "c1", diskSpec(tc.ann))
		if err != nil {
			t.Fatal(err)
		}
		if vm.Suspend != tc.want {
			t.Errorf("annotations %v: Suspend %v, want %v", tc.ann, vm.Suspend, tc.want)
		}
	}
}
