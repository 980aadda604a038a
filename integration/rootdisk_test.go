package integration

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

const annotationRootDiskVolume = "vmshim.io/root-disk-volume"

// TestRootDiskOnVolume keeps a VM's root disk on a filesystem volume (a
// host directory standing in for a PVC): the guest counts its boots on
// its disk. The first pod's guest finds none before it; a second pod on
// the same volume while the first runs is refused and leaves nothing; a
// pod made after the first is gone boots the same disk, which counts the
// first boot.
func TestRootDiskOnVolume(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*bootTimeout)
	defer cancel()
	c := newCRI(t, env.daemon)
	vol := filepath.Join(env.daemon.dir, "volumes", "root-disk")
	if err := os.MkdirAll(vol, 0o700); err != nil {
		t.Fatal(err)
	}
	withVolume := func(cfg *runtimeapi.ContainerConfig) {
		cfg.Annotations = map[string]string{annotationRootDiskVolume: "/data"}
		cfg.Mounts = []*runtimeapi.Mount{{ContainerPath: "/data", HostPath: vol}}
	}

	first := c.runPod(ctx, t, "rootdisk-1")
	vm := first.createVMWith(ctx, t, imageDiskWait, withVolume)
	if _, err := c.runtime.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: vm.id}); err != nil {
		t.Fatalf("StartContainer: %v", err)
	}
	vm.waitLog(ctx, t, "VMSHIM-DISK-BOOTS 0")
	if line := vm.waitLog(ctx, t, "vmshim: making the root disk on volume /data"); !strings.Contains(line, "/disk/") {
		t.Errorf("log line %q does not name the image's disk", line)
	}
	for _, name := range []string{"vmshim-root.qcow2", "vmshim-root.json"} {
		if _, err := os.Stat(filepath.Join(vol, name)); err != nil {
			t.Errorf("volume: %v", err)
		}
	}

	second := c.runPod(ctx, t, "rootdisk-2")
	cfg := &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: "vm"}, Image: &runtimeapi.ImageSpec{Image: imageDiskWait}, LogPath: "vm.log",
	}
	withVolume(cfg)
	// containerd's CRI makes the task, and so the VM, at StartContainer.
	created, err := c.runtime.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: second.id, Config: cfg, SandboxConfig: second.config})
	if err == nil {
		_, err = c.runtime.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: created.ContainerId})
		c.runtime.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: created.ContainerId})
	}
	switch {
	case err == nil:
		t.Errorf("a second VM started on the volume the first one uses")
	case strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), "root disk volume /data is in use by another running VM"):
		t.Errorf("want one line saying the volume is in use, got:\n%v", err)
	default:
		t.Logf("refused: %v", err)
	}
	second.remove(t)

	first.remove(t)
	assertNothingLeftCRI(t, vm.id)

	third := c.runPod(ctx, t, "rootdisk-3")
	again := third.createVMWith(ctx, t, imageDiskWait, withVolume)
	if _, err := c.runtime.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: again.id}); err != nil {
		t.Fatalf("StartContainer: %v", err)
	}
	again.waitLog(ctx, t, "VMSHIM-DISK-BOOTS 1")
	if _, found := findLogLine(again.log, "vmshim: making the root disk"); found {
		t.Errorf("the kept disk was made again")
	}
	third.remove(t)
	assertNothingLeftCRI(t, again.id)
	if _, err := os.Stat(filepath.Join(vol, "vmshim-root.qcow2")); err != nil {
		t.Errorf("the kept disk went with its pod: %v", err)
	}
}
