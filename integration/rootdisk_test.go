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
// host directory standing in for a PVC); see testKeptRootDisk.
func TestRootDiskOnVolume(t *testing.T) {
	vol := filepath.Join(env.daemon.dir, "volumes", "root-disk")
	if err := os.MkdirAll(vol, 0o700); err != nil {
		t.Fatal(err)
	}
	testKeptRootDisk(t, "/data", "vmshim: making the root disk on volume /data", func(cfg *runtimeapi.ContainerConfig) {
		cfg.Mounts = []*runtimeapi.Mount{{ContainerPath: "/data", HostPath: vol}}
	})
	for _, name := range []string{"vmshim-root.qcow2", "vmshim-root.json"} {
		if _, err := os.Stat(filepath.Join(vol, name)); err != nil {
			t.Errorf("volume: %v", err)
		}
	}
}

// TestRootDiskOnBlockVolume keeps a VM's root disk on a block volume (a
// loop device, as volumeDevices hands one over): the image's disk is
// written onto it once, with progress in the container's log; see
// testKeptRootDisk.
func TestRootDiskOnBlockVolume(t *testing.T) {
	loop := loopDevice(t, 64)
	testKeptRootDisk(t, "/dev/xvdb", "vmshim: writing the root disk onto volume /dev/xvdb: 100%", func(cfg *runtimeapi.ContainerConfig) {
		cfg.Devices = []*runtimeapi.Device{{ContainerPath: "/dev/xvdb", HostPath: loop, Permissions: "rwm"}}
	})
}

// testKeptRootDisk runs VMs whose root disk is kept on the volume at path,
// which withVolume gives the container: the guest counts its boots on its
// disk. The first pod's guest finds none before it, and the container's
// log has made; a second pod on the same volume while the first runs is
// refused and leaves nothing; a pod made after the first is gone boots
// the same disk, which counts the first boot.
func testKeptRootDisk(t *testing.T, path, made string, withVolume func(*runtimeapi.ContainerConfig)) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*bootTimeout)
	defer cancel()
	c := newCRI(t, env.daemon)
	config := func(cfg *runtimeapi.ContainerConfig) {
		cfg.Annotations = map[string]string{annotationRootDiskVolume: path}
		withVolume(cfg)
	}

	first := c.runPod(ctx, t, "rootdisk-1")
	vm := first.createVMWith(ctx, t, imageDiskWait, config)
	if _, err := c.runtime.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: vm.id}); err != nil {
		t.Fatalf("StartContainer: %v", err)
	}
	vm.waitLog(ctx, t, "VMSHIM-DISK-BOOTS 0")
	if line := vm.waitLog(ctx, t, made); !strings.Contains(line, "/disk/") && !strings.Contains(line, "%") {
		t.Errorf("log line %q", line)
	}

	second := c.runPod(ctx, t, "rootdisk-2")
	cfg := &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: "vm"}, Image: &runtimeapi.ImageSpec{Image: imageDiskWait}, LogPath: "vm.log",
	}
	config(cfg)
	// containerd's CRI makes the task, and so the VM, at StartContainer.
	created, err := c.runtime.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: second.id, Config: cfg, SandboxConfig: second.config})
	if err == nil {
		_, err = c.runtime.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: created.ContainerId})
		c.runtime.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: created.ContainerId})
	}
	switch {
	case err == nil:
		t.Errorf("a second VM started on the volume the first one uses")
	case strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), "root disk volume "+path+" is in use by another running VM"):
		t.Errorf("want one line saying the volume is in use, got:\n%v", err)
	default:
		t.Logf("refused: %v", err)
	}
	second.remove(t)
	if created != nil {
		assertNothingLeftCRI(t, created.ContainerId)
	}

	first.remove(t)
	assertNothingLeftCRI(t, vm.id)

	third := c.runPod(ctx, t, "rootdisk-3")
	again := third.createVMWith(ctx, t, imageDiskWait, config)
	if _, err := c.runtime.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: again.id}); err != nil {
		t.Fatalf("StartContainer: %v", err)
	}
	again.waitLog(ctx, t, "VMSHIM-DISK-BOOTS 1")
	if _, found := findLogLine(again.log, made); found {
		t.Errorf("the kept disk was made again")
	}
	third.remove(t)
	assertNothingLeftCRI(t, again.id)
}
