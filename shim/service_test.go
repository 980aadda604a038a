package shim

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	eventstypes "github.com/containerd/containerd/api/events"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/api/types"
	apitask "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/v2/core/runtime"
	"github.com/containerd/containerd/v2/pkg/shutdown"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
)

// create creates task id with the given stdio and checks its TaskCreate.
func create(t *testing.T, s *service, p *fakePublisher, r *taskAPI.CreateTaskRequest) *taskAPI.CreateTaskResponse {
	t.Helper()
	if r.Bundle == "" {
		r.Bundle = t.TempDir()
	}
	resp, err := s.Create(context.Background(), r)
	if err != nil {
		t.Fatalf("create %s: %v", r.ID, err)
	}
	ev := expect[*eventstypes.TaskCreate](t, p, runtime.TaskCreateEventTopic)
	if ev.ContainerID != r.ID || ev.Pid != resp.Pid || ev.Bundle != r.Bundle {
		t.Fatalf("TaskCreate %+v does not match create %s (pid %d)", ev, r.ID, resp.Pid)
	}
	return resp
}

// running creates and starts task id, consuming its events.
func running(t *testing.T, s *service, p *fakePublisher, id string) {
	t.Helper()
	create(t, s, p, &taskAPI.CreateTaskRequest{ID: id})
	if _, err := s.Start(context.Background(), &taskAPI.StartRequest{ID: id}); err != nil {
		t.Fatalf("start %s: %v", id, err)
	}
	expect[*eventstypes.TaskStart](t, p, runtime.TaskStartEventTopic)
}

func wantStatus(t *testing.T, s *service, id string, want apitask.Status) *taskAPI.StateResponse {
	t.Helper()
	st, err := s.State(context.Background(), &taskAPI.StateRequest{ID: id})
	if err != nil {
		t.Fatalf("state %s: %v", id, err)
	}
	if st.Status != want {
		t.Fatalf("task %s is %v, want %v", id, st.Status, want)
	}
	return st
}

func TestServiceCreateStart(t *testing.T) {
	s, l, p, _ := newService(t)
	ctx := context.Background()
	opts := &anypb.Any{TypeUrl: "example.com/options", Value: []byte{1}}
	rootfs := []*types.Mount{{Type: "overlay", Source: "overlay", Options: []string{"lowerdir=/l"}}}
	stdout := filepath.Join(t.TempDir(), "stdout")
	if err := unix.Mkfifo(stdout, 0o600); err != nil {
		t.Fatal(err)
	}
	req := &taskAPI.CreateTaskRequest{
		ID: "vm1", Bundle: t.TempDir(), Rootfs: rootfs, Stdout: stdout, Options: opts,
	}
	resp := create(t, s, p, req)
	vm := l.vm(t, "vm1")
	if resp.Pid != uint32(vm.pid) {
		t.Fatalf("create pid %d, want %d", resp.Pid, vm.pid)
	}
	if ns := p.all()[0].ns; ns != "test" {
		t.Fatalf("event published in namespace %q, want test", ns)
	}
	lr := l.requests()[0]
	if lr.ID != "vm1" || lr.Bundle != req.Bundle || len(lr.Rootfs) != 1 || lr.Rootfs[0].Type != "overlay" ||
		lr.Rootfs[0].Options[0] != "lowerdir=/l" || lr.Options == nil || lr.Options.GetTypeUrl() != opts.TypeUrl {
		t.Fatalf("launch request %+v does not carry the create request", lr)
	}

	st := wantStatus(t, s, "vm1", apitask.Status_CREATED)
	if st.Pid != resp.Pid || st.Bundle != req.Bundle || st.Stdout != req.Stdout || st.ID != "vm1" {
		t.Fatalf("state %+v does not match the task", st)
	}
	if got := vm.callList(); len(got) != 0 {
		t.Fatalf("create called %v on the vm; vCPUs must stay stopped", got)
	}

	sr, err := s.Start(ctx, &taskAPI.StartRequest{ID: "vm1"})
	if err != nil || sr.Pid != resp.Pid {
		t.Fatalf("start: %v, %v", sr, err)
	}
	if ev := expect[*eventstypes.TaskStart](t, p, runtime.TaskStartEventTopic); ev.ContainerID != "vm1" || ev.Pid != resp.Pid {
		t.Fatalf("TaskStart %+v", ev)
	}
	wantStatus(t, s, "vm1", apitask.Status_RUNNING)

	_, err = s.Start(ctx, &taskAPI.StartRequest{ID: "vm1"})
	wantErr(t, err, "FailedPrecondition", errdefs.IsFailedPrecondition)
	if n := vm.count("start"); n != 1 {
		t.Fatalf("vm started %d times", n)
	}
}

func TestServiceStartFailureKeepsCreated(t *testing.T) {
	s, l, p, _ := newService(t)
	create(t, s, p, &taskAPI.CreateTaskRequest{ID: "vm1"})
	vm := l.vm(t, "vm1")
	vm.mu.Lock()
	vm.startErr = fmt.Errorf("qmp cont: %w", errdefs.ErrUnavailable)
	vm.mu.Unlock()
	_, err := s.Start(context.Background(), &taskAPI.StartRequest{ID: "vm1"})
	wantErr(t, err, "Unavailable", errdefs.IsUnavailable)
	if !strings.Contains(err.Error(), "vm1") {
		t.Fatalf("error %q does not name the task", err)
	}
	wantStatus(t, s, "vm1", apitask.Status_CREATED)
}

func TestServiceKillSignals(t *testing.T) {
	for _, tc := range []struct {
		name    string
		started bool
		sig     syscall.Signal
		want    string // the vm call, or "" for none
	}{
		{"sigterm running", true, unix.SIGTERM, "powerdown"},
		{"sigint running", true, unix.SIGINT, "powerdown"},
		{"sigpwr running", true, unix.SIGPWR, "powerdown"},
		{"sigkill running", true, unix.SIGKILL, "kill"},
		{"sigterm created", false, unix.SIGTERM, "kill"},
		{"sigkill created", false, unix.SIGKILL, "kill"},
		{"signal 0", true, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, l, p, _ := newService(t)
			if tc.started {
				running(t, s, p, "vm1")
			} else {
				create(t, s, p, &taskAPI.CreateTaskRequest{ID: "vm1"})
			}
			vm := l.vm(t, "vm1")
			vm.mu.Lock()
			vm.killKeepsRunning = true
			vm.mu.Unlock()
			if _, err := s.Kill(context.Background(), &taskAPI.KillRequest{ID: "vm1", Signal: uint32(tc.sig)}); err != nil {
				t.Fatal(err)
			}
			calls := vm.callList()
			if tc.started {
				calls = calls[1:] // start
			}
			if got := strings.Join(calls, ","); got != tc.want {
				t.Fatalf("vm calls %q, want %q", got, tc.want)
			}
		})
	}
}

func TestServiceKillUnsupportedSignal(t *testing.T) {
	s, l, p, _ := newService(t)
	running(t, s, p, "vm1")
	_, err := s.Kill(context.Background(), &taskAPI.KillRequest{ID: "vm1", Signal: uint32(unix.SIGHUP)})
	wantErr(t, err, "NotImplemented", errdefs.IsNotImplemented)
	if code := status.Code(err); code != codes.Unimplemented {
		t.Fatalf("gRPC code %v, want Unimplemented", code)
	}
	if !strings.Contains(err.Error(), fmt.Sprint(int(unix.SIGHUP))) {
		t.Fatalf("error %q does not name the signal", err)
	}
	if got := l.vm(t, "vm1").callList(); len(got) != 1 {
		t.Fatalf("unsupported signal reached the vm: %v", got)
	}
}

func TestServiceExitWaitDelete(t *testing.T) {
	s, l, p, _ := newService(t)
	ctx := context.Background()
	running(t, s, p, "vm1")
	vm := l.vm(t, "vm1")

	waited := make(chan *taskAPI.WaitResponse, 1)
	go func() {
		r, err := s.Wait(ctx, &taskAPI.WaitRequest{ID: "vm1"})
		if err != nil {
			t.Errorf("wait: %v", err)
		}
		waited <- r
	}()
	if _, err := s.Kill(ctx, &taskAPI.KillRequest{ID: "vm1", Signal: uint32(unix.SIGKILL)}); err != nil {
		t.Fatal(err)
	}

	ev := expect[*eventstypes.TaskExit](t, p, runtime.TaskExitEventTopic)
	_, at := vm.ExitStatus()
	if ev.ContainerID != "vm1" || ev.ID != "vm1" || ev.Pid != uint32(vm.pid) || ev.ExitStatus != 137 ||
		!ev.ExitedAt.AsTime().Equal(at) {
		t.Fatalf("TaskExit %+v, want exit 137 at %v", ev, at)
	}
	if wr := receive(t, waited, "wait"); wr == nil || wr.ExitStatus != 137 || !wr.ExitedAt.AsTime().Equal(at) {
		t.Fatalf("wait returned %v", wr)
	}
	if st := wantStatus(t, s, "vm1", apitask.Status_STOPPED); st.ExitStatus != 137 {
		t.Fatalf("state exit status %d", st.ExitStatus)
	}
	// Wait on a stopped task returns at once.
	if wr, err := s.Wait(ctx, &taskAPI.WaitRequest{ID: "vm1"}); err != nil || wr.ExitStatus != 137 {
		t.Fatalf("second wait: %v, %v", wr, err)
	}
	_, err := s.Kill(ctx, &taskAPI.KillRequest{ID: "vm1", Signal: uint32(unix.SIGTERM)})
	wantErr(t, err, "NotFound", errdefs.IsNotFound)

	dr, err := s.Delete(ctx, &taskAPI.DeleteRequest{ID: "vm1"})
	if err != nil || dr.ExitStatus != 137 || dr.Pid != uint32(vm.pid) {
		t.Fatalf("delete: %v, %v", dr, err)
	}
	if ev := expect[*eventstypes.TaskDelete](t, p, runtime.TaskDeleteEventTopic); ev.ContainerID != "vm1" || ev.ExitStatus != 137 {
		t.Fatalf("TaskDelete %+v", ev)
	}
	if n := vm.releaseCount(); n != 1 {
		t.Fatalf("vm released %d times, want once", n)
	}
	_, err = s.State(ctx, &taskAPI.StateRequest{ID: "vm1"})
	wantErr(t, err, "NotFound", errdefs.IsNotFound)
	_, err = s.Delete(ctx, &taskAPI.DeleteRequest{ID: "vm1"})
	wantErr(t, err, "NotFound", errdefs.IsNotFound)
	if n := vm.releaseCount(); n != 1 {
		t.Fatalf("vm released %d times, want once", n)
	}
}

func TestServiceGuestPowerOff(t *testing.T) {
	s, l, p, _ := newService(t)
	running(t, s, p, "vm1")
	if _, err := s.Kill(context.Background(), &taskAPI.KillRequest{ID: "vm1", Signal: uint32(unix.SIGTERM)}); err != nil {
		t.Fatal(err)
	}
	l.vm(t, "vm1").exit(0) // the guest answers the power button
	if ev := expect[*eventstypes.TaskExit](t, p, runtime.TaskExitEventTopic); ev.ExitStatus != 0 {
		t.Fatalf("TaskExit %+v, want 0", ev)
	}
	wantStatus(t, s, "vm1", apitask.Status_STOPPED)
}

func TestServiceDeleteRunning(t *testing.T) {
	s, l, p, _ := newService(t)
	running(t, s, p, "vm1")
	_, err := s.Delete(context.Background(), &taskAPI.DeleteRequest{ID: "vm1"})
	wantErr(t, err, "FailedPrecondition", errdefs.IsFailedPrecondition)
	if n := l.vm(t, "vm1").releaseCount(); n != 0 {
		t.Fatalf("running vm released %d times", n)
	}
	wantStatus(t, s, "vm1", apitask.Status_RUNNING)
}

func TestServiceDeleteCreated(t *testing.T) {
	s, l, p, _ := newService(t)
	create(t, s, p, &taskAPI.CreateTaskRequest{ID: "vm1"})
	dr, err := s.Delete(context.Background(), &taskAPI.DeleteRequest{ID: "vm1"})
	if err != nil || dr.ExitStatus != 137 {
		t.Fatalf("delete of a created task: %v, %v", dr, err)
	}
	vm := l.vm(t, "vm1")
	if got := strings.Join(vm.callList(), ","); got != "kill,release" {
		t.Fatalf("vm calls %q, want kill,release", got)
	}
	expect[*eventstypes.TaskExit](t, p, runtime.TaskExitEventTopic)
	expect[*eventstypes.TaskDelete](t, p, runtime.TaskDeleteEventTopic)
}

func TestServicePauseResume(t *testing.T) {
	s, l, p, _ := newService(t)
	ctx := context.Background()
	create(t, s, p, &taskAPI.CreateTaskRequest{ID: "vm1"})
	_, err := s.Pause(ctx, &taskAPI.PauseRequest{ID: "vm1"})
	wantErr(t, err, "FailedPrecondition", errdefs.IsFailedPrecondition)
	if _, err := s.Start(ctx, &taskAPI.StartRequest{ID: "vm1"}); err != nil {
		t.Fatal(err)
	}
	expect[*eventstypes.TaskStart](t, p, runtime.TaskStartEventTopic)
	_, err = s.Resume(ctx, &taskAPI.ResumeRequest{ID: "vm1"})
	wantErr(t, err, "FailedPrecondition", errdefs.IsFailedPrecondition)

	if _, err := s.Pause(ctx, &taskAPI.PauseRequest{ID: "vm1"}); err != nil {
		t.Fatal(err)
	}
	if ev := expect[*eventstypes.TaskPaused](t, p, runtime.TaskPausedEventTopic); ev.ContainerID != "vm1" {
		t.Fatalf("TaskPaused %+v", ev)
	}
	wantStatus(t, s, "vm1", apitask.Status_PAUSED)
	_, err = s.Pause(ctx, &taskAPI.PauseRequest{ID: "vm1"})
	wantErr(t, err, "FailedPrecondition", errdefs.IsFailedPrecondition)

	if _, err := s.Resume(ctx, &taskAPI.ResumeRequest{ID: "vm1"}); err != nil {
		t.Fatal(err)
	}
	if ev := expect[*eventstypes.TaskResumed](t, p, runtime.TaskResumedEventTopic); ev.ContainerID != "vm1" {
		t.Fatalf("TaskResumed %+v", ev)
	}
	wantStatus(t, s, "vm1", apitask.Status_RUNNING)

	vm := l.vm(t, "vm1")
	vm.mu.Lock()
	vm.pauseErr = fmt.Errorf("qmp stop: %w", errdefs.ErrUnavailable)
	vm.mu.Unlock()
	_, err = s.Pause(ctx, &taskAPI.PauseRequest{ID: "vm1"})
	wantErr(t, err, "Unavailable", errdefs.IsUnavailable)
	wantStatus(t, s, "vm1", apitask.Status_RUNNING)
	if got := strings.Join(vm.callList(), ","); got != "start,pause,resume,pause" {
		t.Fatalf("vm calls %q", got)
	}
}

func TestServiceExecAndUnknownIDs(t *testing.T) {
	s, _, p, _ := newService(t)
	ctx := context.Background()
	running(t, s, p, "vm1")
	for _, ids := range [][2]string{{"vm1", "exec1"}, {"nope", ""}} {
		id, exec := ids[0], ids[1]
		calls := map[string]func() error{
			"start": func() error { _, err := s.Start(ctx, &taskAPI.StartRequest{ID: id, ExecID: exec}); return err },
			"state": func() error { _, err := s.State(ctx, &taskAPI.StateRequest{ID: id, ExecID: exec}); return err },
			"kill":  func() error { _, err := s.Kill(ctx, &taskAPI.KillRequest{ID: id, ExecID: exec, Signal: 9}); return err },
			"wait":  func() error { _, err := s.Wait(ctx, &taskAPI.WaitRequest{ID: id, ExecID: exec}); return err },
			"delete": func() error {
				_, err := s.Delete(ctx, &taskAPI.DeleteRequest{ID: id, ExecID: exec})
				return err
			},
			"closeio": func() error {
				_, err := s.CloseIO(ctx, &taskAPI.CloseIORequest{ID: id, ExecID: exec, Stdin: true})
				return err
			},
			"resizepty": func() error {
				_, err := s.ResizePty(ctx, &taskAPI.ResizePtyRequest{ID: id, ExecID: exec})
				return err
			},
		}
		if exec == "" {
			calls["pause"] = func() error { _, err := s.Pause(ctx, &taskAPI.PauseRequest{ID: id}); return err }
			calls["resume"] = func() error { _, err := s.Resume(ctx, &taskAPI.ResumeRequest{ID: id}); return err }
			calls["pids"] = func() error { _, err := s.Pids(ctx, &taskAPI.PidsRequest{ID: id}); return err }
		}
		for name, call := range calls {
			err := call()
			if err == nil || !errdefs.IsNotFound(errgrpc.ToNative(err)) || !strings.Contains(err.Error(), id) {
				t.Errorf("%s(%s, exec %q): %v; want NotFound naming the task", name, id, exec, err)
			}
		}
	}
	wantStatus(t, s, "vm1", apitask.Status_RUNNING)
}

func TestServiceNotImplemented(t *testing.T) {
	s, _, p, _ := newService(t)
	ctx := context.Background()
	running(t, s, p, "vm1")
	for name, call := range map[string]func() error{
		"checkpoint": func() error {
			_, err := s.Checkpoint(ctx, &taskAPI.CheckpointTaskRequest{ID: "vm1", Path: t.TempDir()})
			return err
		},
	} {
		if err := call(); status.Code(err) != codes.Unimplemented || !errdefs.IsNotImplemented(errgrpc.ToNative(err)) {
			t.Errorf("%s: %v; want Unimplemented", name, err)
		}
	}
}

func TestServicePidsConnectResize(t *testing.T) {
	s, l, p, _ := newService(t)
	ctx := context.Background()
	running(t, s, p, "vm1")
	pid := uint32(l.vm(t, "vm1").pid)
	pr, err := s.Pids(ctx, &taskAPI.PidsRequest{ID: "vm1"})
	if err != nil || len(pr.Processes) != 1 || pr.Processes[0].Pid != pid {
		t.Fatalf("pids: %v, %v", pr, err)
	}
	cr, err := s.Connect(ctx, &taskAPI.ConnectRequest{ID: "vm1"})
	if err != nil || cr.ShimPid != uint32(os.Getpid()) || cr.TaskPid != pid {
		t.Fatalf("connect: %v, %v", cr, err)
	}
	if cr, err := s.Connect(ctx, &taskAPI.ConnectRequest{ID: "nope"}); err != nil || cr.TaskPid != 0 {
		t.Fatalf("connect without task: %v, %v", cr, err)
	}
	if _, err := s.ResizePty(ctx, &taskAPI.ResizePtyRequest{ID: "vm1", Width: 80, Height: 25}); err != nil {
		t.Fatalf("resize: %v", err)
	}
}

func TestServiceCreateLaunchError(t *testing.T) {
	s, l, p, _ := newService(t)
	ctx := context.Background()
	l.mu.Lock()
	l.err = fmt.Errorf("annotation vmshim.io/vcpus: %w", errdefs.ErrInvalidArgument)
	l.mu.Unlock()
	_, err := s.Create(ctx, &taskAPI.CreateTaskRequest{ID: "bad", Bundle: t.TempDir()})
	wantErr(t, err, "InvalidArgument", errdefs.IsInvalidArgument)
	if !strings.Contains(err.Error(), "vmshim.io/vcpus") {
		t.Fatalf("error %q lost the launcher's message", err)
	}
	_, err = s.State(ctx, &taskAPI.StateRequest{ID: "bad"})
	wantErr(t, err, "NotFound", errdefs.IsNotFound)

	// No event was sent for the failed create: the next one is vm1's.
	l.mu.Lock()
	l.err = nil
	l.mu.Unlock()
	create(t, s, p, &taskAPI.CreateTaskRequest{ID: "vm1"})
}

func TestServiceCreateTwice(t *testing.T) {
	s, l, p, _ := newService(t)
	create(t, s, p, &taskAPI.CreateTaskRequest{ID: "vm1"})
	_, err := s.Create(context.Background(), &taskAPI.CreateTaskRequest{ID: "vm1", Bundle: t.TempDir()})
	wantErr(t, err, "AlreadyExists", errdefs.IsAlreadyExists)
	if n := len(l.requests()); n != 1 {
		t.Fatalf("launcher called %d times", n)
	}
	wantStatus(t, s, "vm1", apitask.Status_CREATED)
}

// countingShutdown counts Shutdown calls on a real shutdown service.
type countingShutdown struct {
	shutdown.Service
	calls atomic.Int32
}

func (c *countingShutdown) Shutdown() {
	c.calls.Add(1)
	c.Service.Shutdown()
}

func TestServiceShutdown(t *testing.T) {
	s, l, p, _ := newService(t)
	ctx := context.Background()
	sd := &countingShutdown{Service: s.shutdown}
	s.shutdown = sd
	running(t, s, p, "vm1")

	if _, err := s.Shutdown(ctx, &taskAPI.ShutdownRequest{ID: "vm1"}); err != nil {
		t.Fatal(err)
	}
	if n := sd.calls.Load(); n != 0 || isClosedNow(sd.Done()) {
		t.Fatalf("shim shut down (%d calls) while serving a task", n)
	}

	l.vm(t, "vm1").exit(0)
	expect[*eventstypes.TaskExit](t, p, runtime.TaskExitEventTopic)
	if _, err := s.Delete(ctx, &taskAPI.DeleteRequest{ID: "vm1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Shutdown(ctx, &taskAPI.ShutdownRequest{ID: "vm1"}); err != nil {
		t.Fatal(err)
	}
	if !closedWithin(sd.Done()) {
		t.Fatal("shim did not shut down with no task left")
	}
	// Events sent before the shutdown are still published, then the
	// publisher is closed.
	expect[*eventstypes.TaskDelete](t, p, runtime.TaskDeleteEventTopic)
	p.waitUntil(t, "publisher close", func() bool { return p.closed })
}

// TestServiceExitPublishedBeforeShutdown: containerd shuts an idle shim
// down right after the last Delete, and the shim exits once shutdown is
// done; by then the task's TaskExit and TaskDelete, queued before Delete
// returned, are published and the publisher is closed.
// (TestOrderExecOutputHoldsInitExit holds Wait and Delete back while the
// exit waits.)
func TestServiceExitPublishedBeforeShutdown(t *testing.T) {
	s, l, p, sd := newService(t)
	ctx := context.Background()
	running(t, s, p, "vm1")
	l.vm(t, "vm1").exit(3)
	if _, err := s.Wait(ctx, &taskAPI.WaitRequest{ID: "vm1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Delete(ctx, &taskAPI.DeleteRequest{ID: "vm1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Shutdown(ctx, &taskAPI.ShutdownRequest{}); err != nil {
		t.Fatal(err)
	}
	if !closedWithin(sd.Done()) {
		t.Fatal("shim did not shut down")
	}
	p.mu.Lock()
	closed := p.closed
	p.mu.Unlock()
	if !closed {
		t.Fatal("shutdown done before the publisher was closed")
	}
	if ev := expect[*eventstypes.TaskExit](t, p, runtime.TaskExitEventTopic); ev.ExitStatus != 3 {
		t.Fatalf("TaskExit %+v", ev)
	}
	expect[*eventstypes.TaskDelete](t, p, runtime.TaskDeleteEventTopic)
}

// TestServiceCreateNeverNotImplemented: containerd takes NotImplemented
// from Create for an older task API and loses the message, so the shim
// reports what it cannot do as a failed precondition, same text.
func TestServiceCreateNeverNotImplemented(t *testing.T) {
	s, l, _, _ := newService(t)
	l.mu.Lock()
	l.err = fmt.Errorf("route 10.0.0.0/8 on eth0: multipath routes are not supported: %w", errdefs.ErrNotImplemented)
	l.mu.Unlock()
	_, err := s.Create(context.Background(), &taskAPI.CreateTaskRequest{ID: "vm1", Bundle: t.TempDir()})
	if err == nil {
		t.Fatal("create succeeded")
	}
	if st, _ := status.FromError(err); st.Code() != codes.FailedPrecondition ||
		st.Message() != "route 10.0.0.0/8 on eth0: multipath routes are not supported: failed precondition" {
		t.Fatalf("create: %v, want FailedPrecondition with the same message", err)
	}
}
