package integration

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestSuspendResume: a VM with vmshim.io/on-stop suspend and its root
// disk on a volume is saved there when the CRI stops it, exiting 0; the
// next pod on the volume resumes it instead of booting (its guest never
// boots again) and takes the state off the volume; the pod after that,
// the state gone, boots the disk.
func TestSuspendResume(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*bootTimeout)
	defer cancel()
	vol := filepath.Join(env.daemon.dir, "volumes", "suspend")
	if err := os.MkdirAll(vol, 0o700); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(vol, "vmshim-state")
	c := newCRI(t, env.daemon)
	config := func(suspend bool) func(cfg *runtimeapi.ContainerConfig) {
		return func(cfg *runtimeapi.ContainerConfig) {
			cfg.Annotations = map[string]string{annotationRootDiskVolume: "/data"}
			if suspend {
				cfg.Annotations["vmshim.io/on-stop"] = "suspend"
			}
			cfg.Mounts = []*runtimeapi.Mount{{ContainerPath: "/data", HostPath: vol}}
		}
	}

	first := c.runPod(ctx, t, "suspend-1")
	vm := first.createVMWith(ctx, t, imageDiskWait, config(true))
	if _, err := c.runtime.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: vm.id}); err != nil {
		t.Fatalf("StartContainer: %v", err)
	}
	vm.waitLog(ctx, t, "VMSHIM-DISK-BOOTS 0")
	vm.stop(ctx, t, 60)
	if st := vm.waitExited(ctx, t); st.ExitCode != 0 {
		t.Errorf("suspended VM: exit %d (%s), want 0", st.ExitCode, st.Message)
	}
	t.Logf("%s", vm.waitLog(ctx, t, "vmshim: suspended:"))
	if fi, err := os.Stat(state); err != nil || fi.Size() < 1<<20 {
		t.Fatalf("the state on the volume: %v, %v", fi, err)
	}
	first.remove(t)
	assertNothingLeftCRI(t, vm.id)

	second := c.runPod(ctx, t, "suspend-2")
	resumed := second.createVMWith(ctx, t, imageDiskWait, config(false))
	if _, err := c.runtime.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: resumed.id}); err != nil {
		t.Fatalf("StartContainer of the resuming VM: %v\n%s", err, c.d.logTail())
	}
	t.Logf("%s", resumed.waitLog(ctx, t, "vmshim: resumed the state saved on volume /data"))
	if _, err := os.Stat(state); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the state is still on the volume after the resume: %v", err)
	}
	if _, booted := findLogLine(resumed.log, "VMSHIM-DISK-BOOTS"); booted {
		t.Errorf("the resumed guest booted again")
	}
	if st := resumed.status(ctx, t); st.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Errorf("resumed VM state %v, want running", st.State)
	}
	second.remove(t)
	assertNothingLeftCRI(t, resumed.id)

	third := c.runPod(ctx, t, "suspend-3")
	booted := third.createVMWith(ctx, t, imageDiskWait, config(false))
	if _, err := c.runtime.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: booted.id}); err != nil {
		t.Fatalf("StartContainer: %v", err)
	}
	booted.waitLog(ctx, t, "VMSHIM-DISK-BOOTS 1")
	third.remove(t)
	assertNothingLeftCRI(t, booted.id)
}
