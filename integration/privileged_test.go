package integration

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/pkg/oci"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestSecurityPrivileged checks that a privileged container's host devices
// stay on the host, and that a device keeps the access it was given.
func TestSecurityPrivileged(t *testing.T) {
	// `ctr run --privileged`: every host device in the spec, all allowed.
	t.Run("ctr", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
		defer cancel()
		v, err := createVM(ctx, t, uniqueID(t), imageDiskWait, nil, oci.WithPrivileged, oci.WithAllDevicesAllowed, oci.WithHostDevices)
		if err != nil {
			t.Fatalf("create: %v", err)
		}
		spec, err := v.container.Spec(ctx)
		if err != nil {
			t.Fatal(err)
		}
		blocks := 0
		for _, d := range spec.Linux.Devices {
			if d.Type == "b" {
				blocks++
			}
		}
		if blocks == 0 {
			t.Fatalf("the privileged spec holds no host block device: the test proves nothing")
		}
		v.start(ctx, t)
		v.console.waitFor(ctx, t, markerBooted)
		secCheckNoHostDevices(t, v.id, consoleLine(t, v.console.String(), markerDisks))
		v.remove(t)
		assertNothingLeft(ctx, t, v.id)
	})
	// A privileged pod and container: the CRI adds the host's devices.
	t.Run("cri", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
		defer cancel()
		p := newCRI(t, env.daemon).runPodWith(ctx, t, "sec-privileged", 0, func(cfg *runtimeapi.PodSandboxConfig) {
			cfg.Linux.SecurityContext = &runtimeapi.LinuxSandboxSecurityContext{Privileged: true}
		})
		vm := p.createVMWith(ctx, t, imageDiskWait, func(cfg *runtimeapi.ContainerConfig) {
			cfg.Linux = &runtimeapi.LinuxContainerConfig{SecurityContext: &runtimeapi.LinuxContainerSecurityContext{Privileged: true}}
		})
		if _, err := p.c.runtime.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: vm.id}); err != nil {
			t.Fatalf("StartContainer: %v", err)
		}
		line := vm.waitLog(ctx, t, markerDisks)
		vm.waitLog(ctx, t, markerBooted)
		secCheckNoHostDevices(t, vm.id, line)
		p.remove(t)
		assertNothingLeftCRI(t, vm.id)
	})
	// A device given with permission r is a read-only disk: the guest
	// reads it and cannot write it; one given rw it can write.
	t.Run("cri-read-only-device", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*bootTimeout)
		defer cancel()
		rw, ro := loopDevice(t, 32), loopDevice(t, 48)
		p := newCRI(t, env.daemon).runPod(ctx, t, "sec-ro-device")
		vm := p.createVMWith(ctx, t, imageKernelAgent, func(cfg *runtimeapi.ContainerConfig) {
			cfg.Devices = []*runtimeapi.Device{
				{ContainerPath: "/dev/xvdb", HostPath: rw, Permissions: "rwm"},
				{ContainerPath: "/dev/xvdc", HostPath: ro, Permissions: "r"},
			}
		})
		if _, err := p.c.runtime.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: vm.id}); err != nil {
			t.Fatalf("StartContainer: %v", err)
		}
		disks := parseDisks(t, vm.waitLog(ctx, t, markerDisks))
		vm.waitLog(ctx, t, markerAgent)
		vm.waitLog(ctx, t, markerBooted)
		names := map[int64]string{}
		for name, d := range disks {
			names[d.sectors] = name
			if want := d.sectors == 48<<20/512; d.sectors != 32<<20/512 && !want {
				continue
			} else if d.readOnly != want {
				t.Errorf("guest disk %s (%d sectors): read-only %v, want %v", name, d.sectors, d.readOnly, want)
			}
		}
		if names[32<<20/512] == "" || names[48<<20/512] == "" {
			t.Fatalf("guest disks %v lack the 32 MiB (rw) or the 48 MiB (r) device", disks)
		}
		write := func(name string) *runtimeapi.ExecSyncResponse {
			r, err := vm.execSync(ctx, t, 60, "dd", "if=/dev/zero", "of=/dev/"+name, "bs=4096", "count=1", "conv=fsync")
			if err != nil {
				t.Fatalf("exec dd to %s: %v", name, err)
			}
			return r
		}
		if r := write(names[32<<20/512]); r.ExitCode != 0 {
			t.Errorf("write to the rw device %s: exit %d: %s", names[32<<20/512], r.ExitCode, r.Stderr)
		}
		if r := write(names[48<<20/512]); r.ExitCode == 0 {
			t.Errorf("write to the read-only device %s succeeded", names[48<<20/512])
		} else {
			t.Logf("write to the read-only device: exit %d: %s", r.ExitCode, strings.TrimSpace(string(r.Stderr)))
		}
		if out := vm.mustExec(ctx, t, "dd", "if=/dev/"+names[48<<20/512], "of=/dev/null", "bs=4096", "count=1"); out != "" {
			t.Logf("read: %q", out)
		}
		p.remove(t)
		assertNothingLeftCRI(t, vm.id)
	})
}

// secCheckNoHostDevices checks that VM id's QEMU has no host block
// device in its argv or among its open files, and that the guest (its
// VMSHIM-DISKS line) sees its root disk and seed alone.
func secCheckNoHostDevices(t *testing.T, id, disksLine string) {
	t.Helper()
	pid, argv := secQEMU(t, id)
	for _, a := range argv {
		if strings.Contains(a, "host_device") || strings.Contains(a, "/dev/") && !strings.Contains(a, "/dev/fdset/") {
			t.Errorf("%s: argv names a host device: %q", id, a)
		}
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range fds {
		p := fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())
		fi, err := os.Stat(p)
		if err == nil && fi.Mode()&os.ModeDevice != 0 && fi.Mode()&os.ModeCharDevice == 0 {
			target, _ := os.Readlink(p)
			t.Errorf("%s: qemu holds block device %s open (fd %s)", id, target, fd.Name())
		}
	}
	if disks := parseDisks(t, disksLine); len(disks) != 2 {
		t.Errorf("%s: guest disks %q, want the root disk and the seed alone", id, disksLine)
	}
}

// consoleLine returns the first console line that holds marker.
func consoleLine(t *testing.T, console, marker string) string {
	t.Helper()
	for _, l := range strings.Split(console, "\n") {
		if strings.Contains(l, marker) {
			return strings.TrimRight(l, "\r")
		}
	}
	t.Fatalf("console has no %s line:\n%s", marker, console)
	return ""
}
