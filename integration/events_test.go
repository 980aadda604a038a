package integration

import (
	"bytes"
	"context"
	"io"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	apievents "github.com/containerd/containerd/api/events"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/events"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// TestTaskEventOrder runs one VM through create, start, an exec that
// ends, an exec still running when the VM is killed, and delete, and
// checks the events containerd publishes for it against the order the
// runc shim guarantees: /tasks/create first, /tasks/start before any
// exit, each exec's /tasks/exec-started before its /tasks/exit, the
// init's /tasks/exit last among exits, /tasks/delete last of all.
func TestTaskEventOrder(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*bootTimeout)
	defer cancel()
	evlog := subscribeTasks(ctx, t)
	v := startVM(ctx, t, imageKernelAgent)
	v.console.waitFor(ctx, t, markerAgent)
	v.console.waitFor(ctx, t, markerBooted)

	if out := runExec(ctx, t, v, "done", "echo", "hello"); out != "hello\n" {
		t.Errorf("exec output %q", out)
	}
	running := startExec(ctx, t, v, "running", "sleep", "600")
	if err := v.task.Kill(ctx, syscall.SIGKILL); err != nil {
		t.Fatalf("kill: %v", err)
	}
	if code := v.waitExit(ctx, t); code != 137 {
		t.Errorf("task exit %d, want 137", code)
	}
	select {
	case st := <-running:
		if code, _, _ := st.Result(); code != 137 {
			t.Errorf("exec still running at the kill exited %d, want 137", code)
		}
	case <-ctx.Done():
		t.Fatal("the running exec did not end with its VM")
	}
	if _, err := v.task.Delete(ctx); err != nil {
		t.Fatalf("delete task: %v", err)
	}
	v.task = nil
	// Once the shim has exited, all it published has reached containerd,
	// so the container's deletion, published by containerd, comes after.
	waitGone(ctx, t, "the shim of "+v.id, func() bool {
		return len(processesMentioning("containerd-shim-vm-v2 -namespace "+testNamespace+" -id "+v.id)) == 0
	})
	v.remove(t)
	got := evlog.until(ctx, t, v.id)
	checkTaskOrder(t, got, "done", "running")
}

// execProcess starts p as exec id of v's task, its IO made by creator,
// and returns it with the channel its exit comes on.
func execProcess(ctx context.Context, t *testing.T, v *vm, id string, p *specs.Process, creator cio.Creator) (client.Process, <-chan client.ExitStatus) {
	t.Helper()
	proc, err := v.task.Exec(ctx, id, p, creator)
	if err != nil {
		t.Fatalf("exec %s: %v", id, err)
	}
	statusC, err := proc.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := proc.Start(ctx); err != nil {
		t.Fatalf("exec %s start: %v", id, err)
	}
	return proc, statusC
}

// runExec runs a command in the VM to its end and returns its stdout.
func runExec(ctx context.Context, t *testing.T, v *vm, id string, args ...string) string {
	t.Helper()
	var stdout bytes.Buffer
	proc, statusC := execProcess(ctx, t, v, id, &specs.Process{Args: args, Cwd: "/"}, cio.NewCreator(cio.WithStreams(nil, &stdout, io.Discard)))
	select {
	case <-statusC:
	case <-ctx.Done():
		t.Fatalf("exec %s did not end: %v", id, ctx.Err())
	}
	proc.IO().Wait()
	if _, err := proc.Delete(ctx); err != nil {
		t.Errorf("exec %s delete: %v", id, err)
	}
	return stdout.String()
}

// startExec starts a command in the VM and returns where its exit comes.
func startExec(ctx context.Context, t *testing.T, v *vm, id string, args ...string) <-chan client.ExitStatus {
	t.Helper()
	_, statusC := execProcess(ctx, t, v, id, &specs.Process{Args: args, Cwd: "/"}, cio.NullIO)
	return statusC
}

// taskLog collects the /tasks/ events and /containers/delete events of
// the test namespace, in the order containerd delivers them.
type taskLog struct {
	mu      sync.Mutex
	events  []taskEvent
	changed chan struct{}
	err     error
}

// taskEvent is one event: its topic and the container and exec it is
// about ("" for the init process).
type taskEvent struct {
	topic, container, exec string
}

// String is the topic, with ":EXEC" for an exec's event.
func (e taskEvent) String() string {
	if e.exec != "" {
		return e.topic + ":" + e.exec
	}
	return e.topic
}

// subscribeTasks subscribes to the test namespace's task and container
// events on the suite's daemon before the test acts.
func subscribeTasks(ctx context.Context, t *testing.T) *taskLog {
	t.Helper()
	return subscribeTasksOn(ctx, t, env.client)
}

// subscribeTasksOn is subscribeTasks on the daemon of cl.
func subscribeTasksOn(ctx context.Context, t *testing.T, cl *client.Client) *taskLog {
	t.Helper()
	ch, errs := cl.EventService().Subscribe(ctx,
		`namespace=="`+testNamespace+`",topic~="^/tasks/"`,
		`namespace=="`+testNamespace+`",topic=="/containers/delete"`)
	l := &taskLog{changed: make(chan struct{})}
	go l.collect(ch, errs)
	return l
}

// collect records events until the subscription ends.
func (l *taskLog) collect(ch <-chan *events.Envelope, errs <-chan error) {
	for {
		select {
		case e := <-ch:
			ev, err := typeurl.UnmarshalAny(e.Event)
			l.add(describe(e.Topic, ev), err)
		case err := <-errs:
			l.add(taskEvent{}, err)
			return
		}
	}
}

// add records one event, or the error that ends the subscription.
func (l *taskLog) add(e taskEvent, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil && l.err == nil {
		l.err = err
	}
	if e.topic != "" {
		l.events = append(l.events, e)
	}
	close(l.changed)
	l.changed = make(chan struct{})
}

// describe names an event's container and exec.
func describe(topic string, ev any) taskEvent {
	e := taskEvent{topic: topic}
	switch x := ev.(type) {
	case *apievents.TaskCreate:
		e.container = x.ContainerID
	case *apievents.TaskStart:
		e.container = x.ContainerID
	case *apievents.TaskExecAdded:
		e.container, e.exec = x.ContainerID, x.ExecID
	case *apievents.TaskExecStarted:
		e.container, e.exec = x.ContainerID, x.ExecID
	case *apievents.TaskExit:
		e.container = x.ContainerID
		if x.ID != x.ContainerID {
			e.exec = x.ID
		}
	case *apievents.TaskPaused:
		e.container = x.ContainerID
	case *apievents.TaskResumed:
		e.container = x.ContainerID
	case *apievents.TaskDelete:
		e.container = x.ContainerID
	case *apievents.TaskOOM:
		e.container = x.ContainerID
	case *apievents.ContainerDelete:
		e.container = x.ID
	}
	return e
}

// until waits for the deletion of container id, which containerd
// publishes after every event the container's shim sent it once the shim
// has exited, and returns the container's task events before it.
func (l *taskLog) until(ctx context.Context, t *testing.T, id string) []string {
	t.Helper()
	for {
		l.mu.Lock()
		var names []string
		done := false
		for _, e := range l.events {
			switch {
			case e.container != id:
			case e.topic == "/containers/delete":
				done = true
			case !done:
				names = append(names, e.String())
			}
		}
		err, changed := l.err, l.changed
		l.mu.Unlock()
		if done {
			return names
		}
		if err != nil {
			t.Fatalf("events: %v", err)
		}
		select {
		case <-changed:
		case <-ctx.Done():
			t.Fatalf("no /containers/delete for %s; task events %v", id, names)
		case <-time.After(time.Minute):
			t.Fatalf("no /containers/delete for %s within a minute; task events %v", id, names)
		}
	}
}

// checkTaskOrder checks a container's task events: the runc shim's
// order, with both execs started and exited.
func checkTaskOrder(t *testing.T, got []string, execs ...string) {
	t.Helper()
	t.Logf("events: %v", got)
	want := []string{"/tasks/create", "/tasks/start"}
	for _, e := range execs {
		want = append(want, "/tasks/exec-started:"+e, "/tasks/exit:"+e)
	}
	want = append(want, "/tasks/exit", "/tasks/delete")
	at := map[string]int{}
	for i, n := range got {
		if _, dup := at[n]; dup {
			t.Errorf("%s twice in %v", n, got)
		}
		at[n] = i
	}
	for _, n := range want {
		if _, ok := at[n]; !ok {
			t.Fatalf("no %s in %v", n, got)
		}
	}
	if got[0] != "/tasks/create" {
		t.Errorf("events begin with %s, want /tasks/create", got[0])
	}
	if last := got[len(got)-1]; last != "/tasks/delete" {
		t.Errorf("events end with %s, want /tasks/delete: nothing may follow it", last)
	}
	for _, e := range execs {
		if at["/tasks/exec-started:"+e] > at["/tasks/exit:"+e] {
			t.Errorf("exec %s exited before it started: %v", e, got)
		}
	}
	for n, i := range at {
		if strings.HasPrefix(n, "/tasks/exit") && i < at["/tasks/start"] {
			t.Errorf("%s before /tasks/start: %v", n, got)
		}
		if strings.HasPrefix(n, "/tasks/exit:") && i > at["/tasks/exit"] {
			t.Errorf("%s after the init's /tasks/exit: %v", n, got)
		}
	}
}
