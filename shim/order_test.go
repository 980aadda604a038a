package shim

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/v2/core/runtime"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/vmshim/vmshim/launch"
	"github.com/vmshim/vmshim/logtest"
)

// The order tests check the event order containerd's runc shim
// guarantees: TaskCreate first, TaskStart before any TaskExit, each
// exec's TaskExecAdded, TaskExecStarted and TaskExit in that order, every
// exec's TaskExit before the init's, and nothing after TaskDelete.

// lifecycle names the events of container id in the order published:
// the topic, with ":EXEC" for an exec's event.
func lifecycle(events []published, id string) []string {
	var names []string
	for _, e := range events {
		var container, exec string
		switch ev := e.event.(type) {
		case *eventstypes.TaskCreate:
			container = ev.ContainerID
		case *eventstypes.TaskStart:
			container = ev.ContainerID
		case *eventstypes.TaskPaused:
			container = ev.ContainerID
		case *eventstypes.TaskOOM:
			container = ev.ContainerID
		case *eventstypes.TaskResumed:
			container = ev.ContainerID
		case *eventstypes.TaskDelete:
			container = ev.ContainerID
		case *eventstypes.TaskExecAdded:
			container, exec = ev.ContainerID, ev.ExecID
		case *eventstypes.TaskExecStarted:
			container, exec = ev.ContainerID, ev.ExecID
		case *eventstypes.TaskExit:
			container = ev.ContainerID
			if ev.ID != ev.ContainerID {
				exec = ev.ID
			}
		}
		if container != id {
			continue
		}
		if exec != "" {
			names = append(names, e.topic+":"+exec)
		} else {
			names = append(names, e.topic)
		}
	}
	return names
}

// checkOrder fails the test where the events of one container break the
// runc shim's order.
func checkOrder(t *testing.T, names []string) {
	t.Helper()
	if len(names) == 0 || names[0] != runtime.TaskCreateEventTopic {
		t.Fatalf("events %v do not begin with TaskCreate", names)
	}
	seen := map[string]int{}
	for i, n := range names {
		topic, exec, _ := strings.Cut(n, ":")
		if seen[n] > 0 {
			t.Errorf("events %v: %s twice", names, n)
		}
		if why := misplaced(seen, topic, exec); why != "" {
			t.Errorf("events %v: %s at %d %s", names, n, i, why)
		}
		seen[n]++
	}
}

// misplaced says why an event may not come after those seen, or "".
func misplaced(seen map[string]int, topic, exec string) string {
	switch {
	case seen[runtime.TaskDeleteEventTopic] > 0 && topic != runtime.TaskDeleteEventTopic:
		return "after TaskDelete"
	case topic == runtime.TaskDeleteEventTopic && seen[runtime.TaskExitEventTopic] == 0:
		return "before the init's TaskExit"
	case seen[runtime.TaskExitEventTopic] > 0 && topic != runtime.TaskDeleteEventTopic:
		return "after the init's TaskExit"
	case topic == runtime.TaskStartEventTopic || topic == runtime.TaskCreateEventTopic || topic == runtime.TaskDeleteEventTopic:
		return ""
	case exec == "" && topic == runtime.TaskExitEventTopic:
		return ""
	case seen[runtime.TaskStartEventTopic] == 0:
		return "before TaskStart"
	case topic == runtime.TaskExecStartedEventTopic && seen[runtime.TaskExecAddedEventTopic+":"+exec] == 0:
		return "before its TaskExecAdded"
	case topic == runtime.TaskExitEventTopic && seen[runtime.TaskExecStartedEventTopic+":"+exec] == 0:
		return "before its TaskExecStarted"
	}
	return ""
}

// drained shuts the service down once it serves no task and returns
// every event it published; none may have been dropped.
func drained(t *testing.T, s *service, p *fakePublisher, rec *logtest.Recorder) []published {
	t.Helper()
	if _, err := s.Shutdown(context.Background(), &taskAPI.ShutdownRequest{}); err != nil {
		t.Fatal(err)
	}
	p.waitUntil(t, "publisher close", func() bool { return p.closed })
	for _, w := range rec.Warnings() {
		if strings.Contains(w, "event after shutdown dropped") {
			t.Errorf("an event came after the task was deleted: %s", w)
		}
	}
	return p.all()
}

// taskOf returns the service's task id.
func taskOf(t *testing.T, s *service, id string) *task {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	tk := s.tasks[id]
	if tk == nil {
		t.Fatalf("no task %s", id)
	}
	return tk
}

// waitFor waits until cond holds, checking every millisecond.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// exitInPoststart is a poststart hook during which the VM exits: the
// hook returns once the task has queued its exit.
type exitInPoststart struct {
	t  *testing.T
	vm *fakeVM
	tk func() *task
}

// beforeStart does nothing.
func (h *exitInPoststart) BeforeStart(context.Context) error { return nil }

// afterStart ends the VM and waits for the task to queue its exit.
func (h *exitInPoststart) AfterStart(context.Context) {
	h.vm.exit(0)
	if !closedWithin(h.tk().exited) {
		h.t.Error("the task's exit waited for its poststart hooks")
	}
}

// TestOrderStartBeforeExitDuringPoststart: the VM exits while its
// poststart hooks run, before Start returns; TaskStart still comes
// before TaskExit.
func TestOrderStartBeforeExitDuringPoststart(t *testing.T) {
	s, l, p, _, rec := newLoggedService(t)
	create(t, s, p, &taskAPI.CreateTaskRequest{ID: "vm1"})
	vm := l.vm(t, "vm1")
	vm.mu.Lock()
	vm.hooks = &exitInPoststart{t: t, vm: vm, tk: func() *task { return taskOf(t, s, "vm1") }}
	vm.mu.Unlock()
	if _, err := s.Start(context.Background(), &taskAPI.StartRequest{ID: "vm1"}); err != nil {
		t.Fatalf("start: %v", err)
	}
	if _, err := s.Delete(context.Background(), &taskAPI.DeleteRequest{ID: "vm1"}); err != nil {
		t.Fatalf("delete: %v", err)
	}
	got := lifecycle(drained(t, s, p, rec), "vm1")
	checkOrder(t, got)
	want := []string{runtime.TaskCreateEventTopic, runtime.TaskStartEventTopic, runtime.TaskExitEventTopic, runtime.TaskDeleteEventTopic}
	if !slices.Equal(got, want) {
		t.Errorf("events %v, want %v", got, want)
	}
}

// TestOrderStartRacesExit: the guest powers off the moment its vCPUs
// run, so the exit races Start. Whichever wins, TaskStart (sent only if
// Start succeeded) precedes TaskExit.
func TestOrderStartRacesExit(t *testing.T) {
	for range 20 {
		s, l, p, _, rec := newLoggedService(t)
		create(t, s, p, &taskAPI.CreateTaskRequest{ID: "vm1"})
		vm := l.vm(t, "vm1")
		vm.mu.Lock()
		vm.onStart = func() { vm.exit(0) }
		vm.mu.Unlock()
		_, startErr := s.Start(context.Background(), &taskAPI.StartRequest{ID: "vm1"})
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		if _, err := s.Wait(ctx, &taskAPI.WaitRequest{ID: "vm1"}); err != nil {
			t.Fatalf("wait: %v", err)
		}
		cancel()
		if _, err := s.Delete(context.Background(), &taskAPI.DeleteRequest{ID: "vm1"}); err != nil {
			t.Fatalf("delete: %v", err)
		}
		got := lifecycle(drained(t, s, p, rec), "vm1")
		checkOrder(t, got)
		if started := slices.Contains(got, runtime.TaskStartEventTopic); started != (startErr == nil) {
			t.Errorf("start returned %v, but events %v", startErr, got)
		}
	}
}

// TestOrderExecExitsBeforeInitExit kills a VM with execs running, one
// created and one whose start waits on the agent, and a pause waiting on
// a frozen QEMU: the running execs' exits come before the init's, the
// others never start, and nothing follows TaskDelete.
func TestOrderExecExitsBeforeInitExit(t *testing.T) {
	agent := newFakeAgent()
	agent.hang["sleep"] = true
	s, l, p, _, rec := newLoggedService(t)
	ctx := context.Background()
	running(t, s, p, "vm1")
	vm := l.vm(t, "vm1")
	vm.mu.Lock()
	vm.agent = agent
	vm.mu.Unlock()
	for _, id := range []string{"e1", "e2", "e3"} {
		addExec(t, s, id, "sleep")
		if _, err := s.Start(ctx, &taskAPI.StartRequest{ID: "vm1", ExecID: id}); err != nil {
			t.Fatalf("start %s: %v", id, err)
		}
	}
	addExec(t, s, "created", "true")
	addExec(t, s, "starting", "slow")
	held := agent.holdCalls(func(c *agentCall) bool { return c.cmd.Path == "slow" })
	startErr := make(chan error, 1)
	go func() {
		_, err := s.Start(ctx, &taskAPI.StartRequest{ID: "vm1", ExecID: "starting"})
		startErr <- err
	}()
	call := receive(t, held, "the held exec start")
	pauseErr := pendingPause(t, s, vm)

	if _, err := s.Kill(ctx, &taskAPI.KillRequest{ID: "vm1", Signal: uint32(syscall.SIGKILL)}); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, waitTimeout)
	defer cancel()
	if _, err := s.Wait(wctx, &taskAPI.WaitRequest{ID: "vm1"}); err != nil {
		t.Fatalf("wait: %v", err)
	}
	if _, err := s.Delete(ctx, &taskAPI.DeleteRequest{ID: "vm1"}); err != nil {
		t.Fatalf("delete: %v", err)
	}
	call.release(nil)
	if err := receive(t, startErr, "exec start"); err == nil {
		t.Error("an exec started in a deleted task")
	}
	if err := receive(t, pauseErr, "pause"); err == nil {
		t.Error("a killed VM paused")
	}
	got := lifecycle(drained(t, s, p, rec), "vm1")
	checkOrder(t, got)
	for _, n := range []string{"e1", "e2", "e3"} {
		if !slices.Contains(got, runtime.TaskExitEventTopic+":"+n) {
			t.Errorf("events %v lack the exit of %s", got, n)
		}
	}
	for _, n := range []string{"created", "starting"} {
		if slices.Contains(got, runtime.TaskExecStartedEventTopic+":"+n) || slices.Contains(got, runtime.TaskExitEventTopic+":"+n) {
			t.Errorf("events %v: exec %s never started, yet has events", got, n)
		}
	}
}

// addExec adds exec id running path to task vm1.
func addExec(t *testing.T, s *service, id, path string) {
	t.Helper()
	_, err := s.Exec(context.Background(), &taskAPI.ExecProcessRequest{
		ID: "vm1", ExecID: id, Spec: processSpec(t, specs.Process{Args: []string{path}}),
	})
	if err != nil {
		t.Fatalf("exec %s: %v", id, err)
	}
}

// pendingPause freezes the VM's QMP and leaves a Pause of task vm1
// waiting on it; its result comes on the returned channel.
func pendingPause(t *testing.T, s *service, vm *fakeVM) <-chan error {
	t.Helper()
	vm.mu.Lock()
	vm.frozen = make(chan struct{})
	vm.mu.Unlock()
	errc := make(chan error, 1)
	go func() {
		_, err := s.Pause(context.Background(), &taskAPI.PauseRequest{ID: "vm1"})
		errc <- err
	}()
	waitFor(t, "the pause call", func() bool { return vm.count("pause") == 1 })
	return errc
}

// TestOrderExecOutputHoldsInitExit: an exec's program has ended and its
// output waits for a reader when the VM exits. The init's exit, Wait and
// Delete wait for the exec's exit; once the output is read, the exec's
// exit, the init's and TaskDelete follow in that order.
func TestOrderExecOutputHoldsInitExit(t *testing.T) {
	agent := newFakeAgent()
	agent.results["sh"] = launch.GuestExecStatus{ExitCode: 3, Stdout: []byte("out\n")}
	s, l, p, _, rec := newLoggedService(t)
	ctx := context.Background()
	running(t, s, p, "vm1")
	vm := l.vm(t, "vm1")
	vm.mu.Lock()
	vm.agent = agent
	vm.mu.Unlock()
	stdout := mkfifo(t, "out")
	if _, err := s.Exec(ctx, &taskAPI.ExecProcessRequest{
		ID: "vm1", ExecID: "e1", Stdout: stdout, Spec: processSpec(t, specs.Process{Args: []string{"sh"}}),
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Start(ctx, &taskAPI.StartRequest{ID: "vm1", ExecID: "e1"}); err != nil {
		t.Fatal(err)
	}
	_, e, err := s.get("vm1", "e1")
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the exec writing its output", func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		return e.ending
	})
	vm.exit(5)

	deleted := make(chan error, 1)
	go func() {
		if _, err := s.Wait(ctx, &taskAPI.WaitRequest{ID: "vm1"}); err != nil {
			deleted <- err
			return
		}
		_, err := s.Delete(ctx, &taskAPI.DeleteRequest{ID: "vm1"})
		deleted <- err
	}()
	select {
	case err := <-deleted:
		t.Fatalf("wait and delete returned (%v) before the exec's exit", err)
	case <-time.After(50 * time.Millisecond):
	}
	if got := lifecycle(p.all(), "vm1"); slices.Contains(got, runtime.TaskExitEventTopic) {
		t.Fatalf("the init's exit came while an exec's was pending: %v", got)
	}
	out := readFifo(t, openFifo(t, stdout, os.O_RDONLY))
	if got := receive(t, out, "exec stdout"); got != "out\n" {
		t.Errorf("exec stdout %q", got)
	}
	if err := receive(t, deleted, "delete"); err != nil {
		t.Fatal(err)
	}
	events := drained(t, s, p, rec)
	got := lifecycle(events, "vm1")
	checkOrder(t, got)
	want := []string{runtime.TaskExitEventTopic + ":e1", runtime.TaskExitEventTopic, runtime.TaskDeleteEventTopic}
	if tail := got[len(got)-3:]; !slices.Equal(tail, want) {
		t.Errorf("events %v, want them to end with %v", got, want)
	}
	for _, ev := range events {
		if x, ok := ev.event.(*eventstypes.TaskExit); ok && x.ID == "e1" && x.ExitStatus != 3 {
			t.Errorf("exec exit %d, want 3", x.ExitStatus)
		}
	}
}

// TestOrderExecStartRacesExit: a program that ends at once is reported
// started before it is reported exited, however soon its first status
// poll comes; the agent answers the execs' calls out of order.
func TestOrderExecStartRacesExit(t *testing.T) {
	agent := newFakeAgent()
	agent.results["true"] = launch.GuestExecStatus{}
	s, p, _ := execVM(t, agent)
	ctx := context.Background()
	held := agent.holdCalls(nil)
	ids := []string{"a", "b", "c"}
	pids := make(chan uint32, len(ids))
	for _, id := range ids {
		addExec(t, s, id, "true")
		go func() {
			r, err := s.Start(ctx, &taskAPI.StartRequest{ID: "vm1", ExecID: id})
			if err != nil {
				t.Errorf("start %s: %v", id, err)
			}
			pids <- r.GetPid()
		}()
	}
	var calls []*agentCall
	for range ids {
		calls = append(calls, receive(t, held, "an exec start"))
	}
	agent.stopHolding()
	for _, c := range slices.Backward(calls) {
		c.release(nil)
	}
	for range ids {
		receive(t, pids, "exec start")
	}
	for _, id := range ids {
		wctx, cancel := context.WithTimeout(ctx, waitTimeout)
		_, err := s.Wait(wctx, &taskAPI.WaitRequest{ID: "vm1", ExecID: id})
		cancel()
		if err != nil {
			t.Fatalf("wait %s: %v", id, err)
		}
	}
	p.waitUntil(t, "exec exits", func() bool {
		return strings.Count(strings.Join(lifecycle(p.events, "vm1"), " "), runtime.TaskExitEventTopic+":") == len(ids)
	})
	checkOrder(t, lifecycle(p.all(), "vm1"))
	started := map[string]uint32{}
	for _, ev := range p.all() {
		switch x := ev.event.(type) {
		case *eventstypes.TaskExecStarted:
			started[x.ExecID] = x.Pid
		case *eventstypes.TaskExit:
			if pid, ok := started[x.ID]; ok && pid != x.Pid {
				t.Errorf("exec %s started as pid %d, exited as %d", x.ID, pid, x.Pid)
			}
		}
	}
}

// TestOrderFailedExecStart: an agent that fails the start leaves no
// TaskExecStarted and no TaskExit, and the exec can be deleted.
func TestOrderFailedExecStart(t *testing.T) {
	agent := newFakeAgent()
	s, p, _ := execVM(t, agent)
	ctx := context.Background()
	addExec(t, s, "e1", "true")
	held := agent.holdCalls(nil)
	errc := make(chan error, 1)
	go func() {
		_, err := s.Start(ctx, &taskAPI.StartRequest{ID: "vm1", ExecID: "e1"})
		errc <- err
	}()
	receive(t, held, "the exec start").release(errors.New("guest agent guest-exec: unavailable"))
	if err := receive(t, errc, "start"); err == nil {
		t.Fatal("start succeeded")
	}
	if _, err := s.Delete(ctx, &taskAPI.DeleteRequest{ID: "vm1", ExecID: "e1"}); err != nil {
		t.Fatalf("delete: %v", err)
	}
	got := lifecycle(p.all(), "vm1")
	checkOrder(t, got)
	if slices.Contains(got, runtime.TaskExecStartedEventTopic+":e1") || slices.Contains(got, runtime.TaskExitEventTopic+":e1") {
		t.Errorf("events %v for an exec that never started", got)
	}
}
