package shim

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	eventstypes "github.com/containerd/containerd/api/events"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	apitask "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/v2/core/runtime"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"

	"github.com/vmshim/vmshim/qemu"
)

// TestOOMReportedBeforeExit: an OOM kill the watch reports becomes
// TaskOOM at once; one the watch has not reported yet when QEMU exits
// (the kernel counts it before it kills) comes before TaskExit; one after
// the exit is not published.
func TestOOMReportedBeforeExit(t *testing.T) {
	s, l, p, _, rec := newLoggedService(t)
	kills := newFakeOOM()
	l.prepare = func(v *fakeVM) { v.oom = kills }
	running(t, s, p, "vm1")
	vm := l.vm(t, "vm1")

	kills.kill(true)
	expect[*eventstypes.TaskOOM](t, p, runtime.TaskOOMEventTopic)
	kills.kill(false)
	vm.exit(137)
	expect[*eventstypes.TaskOOM](t, p, runtime.TaskOOMEventTopic)
	expect[*eventstypes.TaskExit](t, p, runtime.TaskExitEventTopic)
	kills.kill(true)
	if _, err := s.Delete(context.Background(), &taskAPI.DeleteRequest{ID: "vm1"}); err != nil {
		t.Fatalf("delete: %v", err)
	}
	got := lifecycle(drained(t, s, p, rec), "vm1")
	want := []string{runtime.TaskCreateEventTopic, runtime.TaskStartEventTopic, runtime.TaskOOMEventTopic,
		runtime.TaskOOMEventTopic, runtime.TaskExitEventTopic, runtime.TaskDeleteEventTopic}
	if !slices.Equal(got, want) {
		t.Errorf("events %v, want %v", got, want)
	}
}

// TestIOPauseShowsPaused: a disk error that pauses the VM makes the task
// paused, says why in the container's output, and a resume runs it again.
func TestIOPauseShowsPaused(t *testing.T) {
	s, l, p, _, _ := newLoggedService(t)
	out := filepath.Join(t.TempDir(), "out")
	create(t, s, p, &taskAPI.CreateTaskRequest{ID: "vm1", Stdout: "file://" + out})
	if _, err := s.Start(context.Background(), &taskAPI.StartRequest{ID: "vm1"}); err != nil {
		t.Fatal(err)
	}
	expect[*eventstypes.TaskStart](t, p, runtime.TaskStartEventTopic)
	vm := l.vm(t, "vm1")

	vm.setIOPause(&qemu.IOPause{Node: "root", Operation: "write", NoSpace: true, Reason: "No space left on device"})
	expect[*eventstypes.TaskPaused](t, p, runtime.TaskPausedEventTopic)
	wantStatus(t, s, "vm1", apitask.Status_PAUSED)
	const line = "vmshim: the VM is paused: disk root: write failed: No space left on device"
	waitFor(t, "the console line", func() bool {
		data, _ := os.ReadFile(out)
		return strings.Contains(string(data), line)
	})
	if _, err := s.Pause(context.Background(), &taskAPI.PauseRequest{ID: "vm1"}); !errdefs.IsFailedPrecondition(errgrpc.ToNative(err)) {
		t.Errorf("pause of a paused task: %v", err)
	}

	if _, err := s.Resume(context.Background(), &taskAPI.ResumeRequest{ID: "vm1"}); err != nil {
		t.Fatalf("resume: %v", err)
	}
	expect[*eventstypes.TaskResumed](t, p, runtime.TaskResumedEventTopic)
	wantStatus(t, s, "vm1", apitask.Status_RUNNING)

	// It fails again after the resume: paused again.
	vm.setIOPause(&qemu.IOPause{Node: "root", Operation: "write", NoSpace: true})
	expect[*eventstypes.TaskPaused](t, p, runtime.TaskPausedEventTopic)
	wantStatus(t, s, "vm1", apitask.Status_PAUSED)
	vm.exit(137)
	expect[*eventstypes.TaskExit](t, p, runtime.TaskExitEventTopic)
}

// TestDeleteRetriesRelease: a Delete whose release fails says so and
// publishes nothing; the next Delete finishes it, and only then is the
// task gone and TaskDelete published.
func TestDeleteRetriesRelease(t *testing.T) {
	s, l, p, _, _ := newLoggedService(t)
	l.prepare = func(v *fakeVM) { v.releaseErrs = []error{errors.New("cni del: plugin failed")} }
	running(t, s, p, "vm1")
	l.vm(t, "vm1").exit(0)
	expect[*eventstypes.TaskExit](t, p, runtime.TaskExitEventTopic)

	ctx := context.Background()
	_, err := s.Delete(ctx, &taskAPI.DeleteRequest{ID: "vm1"})
	if err == nil || !strings.Contains(err.Error(), "cni del: plugin failed") || !strings.Contains(err.Error(), "delete it again") {
		t.Fatalf("delete with a failing release: %v", err)
	}
	wantStatus(t, s, "vm1", apitask.Status_STOPPED)
	if _, err := s.Delete(ctx, &taskAPI.DeleteRequest{ID: "vm1"}); err != nil {
		t.Fatalf("second delete: %v", err)
	}
	expect[*eventstypes.TaskDelete](t, p, runtime.TaskDeleteEventTopic)
	if n := l.vm(t, "vm1").releaseCount(); n != 1 {
		t.Errorf("released %d times, want once", n)
	}
	if _, err := s.Delete(ctx, &taskAPI.DeleteRequest{ID: "vm1"}); !errdefs.IsNotFound(errgrpc.ToNative(err)) {
		t.Errorf("third delete: %v, want not found", err)
	}
}
