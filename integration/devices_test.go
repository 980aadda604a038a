package integration

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestCRIBlockDevice gives a VM container a host block device (as a raw
// block volume or a device plugin would) and a character device: the
// block device becomes a writable disk of the guest, the character device
// does not become anything.
func TestCRIBlockDevice(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*bootTimeout)
	defer cancel()
	loop := loopDevice(t, 64)
	p := newCRI(t, env.daemon).runPod(ctx, t, "blockdev")
	vm := p.createVMWith(ctx, t, imageDiskWait, func(cfg *runtimeapi.ContainerConfig) {
		cfg.Devices = []*runtimeapi.Device{
			{ContainerPath: "/dev/xvdb", HostPath: loop, Permissions: "rwm"},
			{ContainerPath: "/dev/not-a-disk", HostPath: "/dev/zero", Permissions: "rw"},
		}
	})
	if _, err := p.c.runtime.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: vm.id}); err != nil {
		t.Fatalf("StartContainer: %v", err)
	}
	line := vm.waitLog(ctx, t, markerDisks)
	disks := parseDisks(t, line)
	var volume []string
	for name, d := range disks {
		if d.sectors == 64<<20/512 && !d.readOnly {
			volume = append(volume, name)
		}
	}
	// The root disk, the volume, the cloud-init seed; /dev/zero is none.
	if len(volume) != 1 || len(disks) != 3 {
		t.Errorf("guest disks %q: want the root disk, the 64 MiB volume (writable) and the seed", line)
	}
	p.remove(t)
	assertNothingLeftCRI(t, vm.id)
}

// loopDevice attaches a loop device to a new file of sizeMiB and returns
// its node; the test detaches it.
func loopDevice(t *testing.T, sizeMiB int64) string {
	t.Helper()
	backing := filepath.Join(t.TempDir(), "volume.raw")
	if err := os.WriteFile(backing, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(backing, sizeMiB<<20); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("losetup", "--find", "--show", backing).CombinedOutput()
	if err != nil {
		t.Fatalf("losetup: %v: %s", err, out)
	}
	loop := strings.TrimSpace(string(out))
	t.Cleanup(func() { _ = exec.Command("losetup", "-d", loop).Run() })
	return loop
}
