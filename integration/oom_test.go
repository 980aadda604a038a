package integration

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	runtimeoptions "github.com/containerd/containerd/api/types/runtimeoptions/v1"
	"github.com/containerd/containerd/v2/pkg/oci"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// oomGuestMemory is the guest RAM of the OOM tests: QEMU's cgroup holds
// exactly that (tightConfig), and QEMU needs more once the guest has
// filled it.
const oomGuestMemory = "256Mi"

// fillGuestRAM fills the guest's RAM through a tmpfs, whose pages the
// guest cannot give back: all MemAvailable says, less a little.
var fillGuestRAM = []string{"sh", "-c", `mkdir -p /fill && mount -t tmpfs -o size=100% fill /fill && ` +
	`kb=$(sed -n 's/^MemAvailable: *\([0-9]*\) kB/\1/p' /proc/meminfo) && ` +
	`dd if=/dev/zero of=/fill/zero bs=1M count=$((kb / 1024 - 16))`}

// TestTaskOOM makes QEMU exceed its cgroup for real: a guest fills its RAM
// while the shim's memory_overhead is zero. The kernel's OOM killer kills
// QEMU; containerd publishes /tasks/oom before /tasks/exit.
func TestTaskOOM(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*bootTimeout)
	defer cancel()
	tight := filepath.Join(t.TempDir(), "tight.toml")
	if err := os.WriteFile(tight, []byte(tightConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	evlog := subscribeTasks(ctx, t)
	v, err := createVM(ctx, t, uniqueID(t), imageKernelAgent, &runtimeoptions.Options{ConfigPath: tight},
		oci.WithAnnotations(map[string]string{"vmshim.io/memory": oomGuestMemory}))
	if err != nil {
		t.Fatalf("create task: %v\ncontainerd log:\n%s", err, env.daemon.logTail())
	}
	v.start(ctx, t)
	v.console.waitFor(ctx, t, markerAgent)
	startExec(ctx, t, v, "fill", fillGuestRAM...)
	if code := v.waitExit(ctx, t); code != 137 {
		t.Errorf("task exit %d, want 137 (SIGKILL by the OOM killer)", code)
	}
	if _, err := v.task.Delete(ctx); err != nil {
		t.Fatalf("delete task: %v", err)
	}
	v.task = nil
	v.remove(t)
	got := evlog.until(ctx, t, v.id)
	t.Logf("events: %v", got)
	oom, exit := slices.Index(got, "/tasks/oom"), slices.Index(got, "/tasks/exit")
	if oom < 0 || exit < 0 || oom > exit {
		t.Errorf("want /tasks/oom before /tasks/exit, got %v", got)
	}
}

// TestCRIOOMKilled: the same through the CRI, on a runtime handler whose
// shim config leaves QEMU no overhead; the container ends OOMKilled.
func TestCRIOOMKilled(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*bootTimeout)
	defer cancel()
	c := newCRI(t, env.daemon)
	p := c.runPodOn(ctx, t, tightHandler, "oom", 0, nil)
	vm := p.startVM(ctx, t, imageKernelAgent, map[string]string{"vmshim.io/memory": oomGuestMemory})
	vm.waitLog(ctx, t, markerAgent)
	if _, err := vm.execSync(ctx, t, 120, fillGuestRAM...); err == nil {
		t.Log("the fill returned before QEMU was killed")
	}
	st := vm.waitExited(ctx, t)
	t.Logf("container exited %d, reason %q", st.ExitCode, st.Reason)
	if st.ExitCode != 137 || st.Reason != "OOMKilled" {
		t.Errorf("exit %d reason %q, want 137 OOMKilled", st.ExitCode, st.Reason)
	}
	if st.State != runtimeapi.ContainerState_CONTAINER_EXITED || strings.Contains(st.Message, "\n") {
		t.Errorf("status %v message %q", st.State, st.Message)
	}
}
