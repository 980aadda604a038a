package shim

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"syscall"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	"github.com/containerd/containerd/v2/pkg/protobuf"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/vmshim/vmshim/launch"
	"github.com/vmshim/vmshim/procmem"
)

// vmCallTimeout bounds each call the task makes to its VM: one that starts, stops
// or restarts the vCPUs, or presses the power button.
const vmCallTimeout = 10 * time.Second

// flushTimeout bounds how long an exit waits for the last console output
// to reach stdout, and the exits of its execs for their output, before it
// is reported.
const flushTimeout = 2 * time.Second

// publish queues an event for containerd. It never blocks: tasks and execs
// call it with their lock held, in the critical section that makes the
// state change the event reports, so events go out in the order of the
// changes.
type publish func(event any)

// stdio names the task's IO fifos, as containerd passed them.
type stdio struct {
	stdin, stdout, stderr string
	terminal              bool
}

// task is one container: a VM and its console. Its events, and its
// execs', are queued as its state changes (see publish), so containerd
// hears them in the order the runc shim guarantees: TaskCreate first,
// TaskStart before any exit, every exec's exit before the task's, and
// TaskDelete last.
type task struct {
	id     string
	bundle string
	pid    int // the VM's process
	stdio  stdio
	vm     launch.VM
	cons   *console
	pub    publish

	// opMu serializes the calls that change whether the vCPUs run (see
	// vcpus); it is never taken by kill, state or delete.
	opMu     sync.Mutex
	mu       sync.Mutex // guards st, starting, exitCode, exitedAt and execs; the only writer of st is transition; never held across a call to the VM or the guest agent
	st       state
	starting bool // a Start is under way
	exitCode int
	exitedAt time.Time
	execs    map[string]*execProcess
	// oomSeen is the OOM kill count already reported (TaskOOM), and
	// exitQueued whether TaskExit is: no TaskOOM follows it.
	oomSeen    uint64
	exitQueued bool
	// ioPause is the disk error that holds the VM paused, while one does.
	ioPause fmt.Stringer

	relMu    sync.Mutex    // serializes Release; guards released
	released bool          // the VM's resources are all freed
	exited   chan struct{} // closed once the task is stopped and its exit queued, after its execs'
}

// newTask wraps a created VM whose console goes to out and whose events
// go to pub. Once its TaskCreate is queued, watch starts following the VM.
func newTask(ctx context.Context, id, bundle string, io stdio, out *output, vm launch.VM, pub publish) *task {
	return &task{
		id: id, bundle: bundle, pid: vm.Pid(), stdio: io, vm: vm, pub: pub,
		cons:   newConsole(ctx, vm.Console(), io, out),
		execs:  make(map[string]*execProcess),
		exited: make(chan struct{}),
	}
}

// watch starts waiting for the VM's exit; call it once.
func (t *task) watch(ctx context.Context) {
	go t.monitor(ctx)
	if c := t.vm.OOMKills(); c != nil {
		go t.followOOM(ctx, c)
	}
	go t.followIOPause(ctx)
}

// followOOM reports each OOM kill in the VM's cgroup, until the watch or
// the task ends.
func (t *task) followOOM(ctx context.Context, c launch.OOMCounter) {
	for {
		select {
		case _, ok := <-c.Events():
			if !ok {
				return
			}
			t.mu.Lock()
			t.reportOOM(ctx)
			t.mu.Unlock()
		case <-t.exited:
			return
		}
	}
}

// reportOOM queues TaskOOM when the cgroup's kill count has risen since
// the last report, unless the exit is queued already; callers hold t.mu.
// The kernel counts a kill before it sends SIGKILL, so the monitor's call
// at exit sees the kill that ended the VM.
func (t *task) reportOOM(ctx context.Context) {
	c := t.vm.OOMKills()
	if c == nil || t.exitQueued {
		return
	}
	n, err := c.Killed()
	if err != nil {
		log.G(ctx).WithError(err).WithField("id", t.id).Warn("read oom kill count")
	}
	if n > t.oomSeen {
		t.oomSeen = n
		log.G(ctx).WithFields(log.Fields{"id": t.id, "oom_kills": n}).Warn("oom killer acted in the vm's cgroup")
		t.pub(&eventstypes.TaskOOM{ContainerID: t.id})
	}
}

// followIOPause makes the task paused while a disk error holds the VM
// paused, and says why on its console, until the VM exits. The task runs
// again when it is resumed (the VM retries the request then, and pauses
// again if it still fails).
func (t *task) followIOPause(ctx context.Context) {
	for {
		p, changed := t.vm.IOPause()
		if changed == nil {
			return
		}
		t.mu.Lock()
		// Each pause is a new IOPause: one seen for the first time paused
		// the VM again, even if the resume between was missed.
		if p != nil && p != t.ioPause && t.st == stateRunning && t.transition(statePaused) == nil {
			log.G(ctx).WithFields(log.Fields{"id": t.id, "cause": p.String()}).Error("vm paused by a disk error; resume the task once the cause is gone")
			t.cons.note(fmt.Sprintf("vmshim: the VM is paused: %s; it resumes when the task is resumed once the cause is gone", p))
		}
		t.ioPause = p
		t.mu.Unlock()
		select {
		case <-changed:
		case <-t.vm.Done():
			return
		}
	}
}

// transition moves the task to state to and queues the event that
// reports the move, if any; callers hold t.mu.
func (t *task) transition(to state) error {
	if err := t.st.next(to); err != nil {
		return fmt.Errorf("task %s: %w", t.id, err)
	}
	from := t.st
	t.st = to
	if ev := t.event(from, to); ev != nil {
		t.pub(ev)
	}
	return nil
}

// event is the event of the move from one state to another. The exit and
// the delete have none here: monitor and delete queue them once the work
// that must come first is done.
func (t *task) event(from, to state) any {
	switch {
	case from == stateCreated && to == stateRunning:
		return &eventstypes.TaskStart{ContainerID: t.id, Pid: uint32(t.pid)}
	case to == statePaused:
		return &eventstypes.TaskPaused{ContainerID: t.id}
	case from == statePaused && to == stateRunning:
		return &eventstypes.TaskResumed{ContainerID: t.id}
	}
	return nil
}

// monitor waits for the VM to exit, lets the console drain, records the
// exit, ends the execs and queues their exits, then the task's.
func (t *task) monitor(ctx context.Context) {
	<-t.vm.Done()
	select {
	case <-t.cons.flushed():
	case <-time.After(flushTimeout):
		log.G(ctx).WithField("id", t.id).Warn("console output not drained before exit")
	}
	code, at := t.vm.ExitStatus()
	t.mu.Lock()
	// From here no exec is added or started and the task's state only
	// moves on to deleted, which waits for t.exited.
	if err := t.transition(stateStopped); err != nil {
		log.G(ctx).WithError(err).Error("record exit")
	}
	t.exitCode, t.exitedAt = code, at
	execs := make([]*execProcess, 0, len(t.execs))
	for _, e := range t.execs {
		execs = append(execs, e)
	}
	t.mu.Unlock()
	endExecs(ctx, execs)
	t.mu.Lock()
	t.reportOOM(ctx)
	t.exitQueued = true
	t.pub(&eventstypes.TaskExit{
		ContainerID: t.id, ID: t.id, Pid: uint32(t.pid), ExitStatus: uint32(code), ExitedAt: protobuf.ToTimestamp(at),
	})
	t.mu.Unlock()
	// Only now may Wait and Delete return: TaskExit is queued before
	// TaskDelete, and before a shutdown closes the event queue.
	close(t.exited)
}

// start runs the VM's vCPUs; TaskStart is queued as they do, before the
// poststart hooks run and before an exit can be.
func (t *task) start(ctx context.Context) error {
	t.mu.Lock()
	if t.starting {
		t.mu.Unlock()
		return fmt.Errorf("task %s is being started already: %w", t.id, errdefs.ErrFailedPrecondition)
	}
	if t.st != stateCreated {
		st := t.st
		t.mu.Unlock()
		return fmt.Errorf("task %s is %s, not created: %w", t.id, st, errdefs.ErrFailedPrecondition)
	}
	t.starting = true
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		t.starting = false
		t.mu.Unlock()
	}()
	logger := log.G(ctx).WithField("id", t.id)
	hooks := t.vm.StartHooks()
	if hooks != nil {
		begin := time.Now()
		if err := hooks.BeforeStart(ctx); err != nil {
			return fmt.Errorf("start vm %s: %w", t.id, err)
		}
		launch.Span(logger, "start hooks", begin)
	}
	begin := time.Now()
	if err := t.run(ctx); err != nil {
		return err
	}
	launch.Span(logger, "cont", begin)
	if hooks != nil {
		hooks.AfterStart(ctx)
	}
	go releaseSetupMemory(logger)
	time.AfterFunc(releaseAgain, func() { releaseSetupMemory(logger) })
	return nil
}

// releaseAgain is when, after the VM's start, the shim gives back its
// setup memory a second time: what the start left running (port-forward's
// BPF programs loading) is long done by then.
const releaseAgain = 30 * time.Second

// releaseSetupMemory gives back the memory the shim used only to set its
// VM up (procmem.ReleaseOwn): without it the shim kept its whole program
// mapped for the pod's life, though it runs little of it once the VM runs.
func releaseSetupMemory(logger *log.Entry) {
	begin := time.Now()
	n, err := procmem.ReleaseOwn()
	if err != nil {
		logger.WithError(err).Debug("release setup memory")
		return
	}
	logger.WithFields(log.Fields{"mib": n >> 20, "ms": time.Since(begin).Milliseconds()}).Debug("setup memory released")
}

// run starts the vCPUs of a task still created.
func (t *task) run(ctx context.Context) error {
	return t.vcpus(ctx, "start", stateRunning, t.vm.Start, func(st state) error {
		if st != stateCreated {
			return fmt.Errorf("task %s is %s, not created: %w", t.id, st, errdefs.ErrFailedPrecondition)
		}
		return nil
	})
}

// vcpus runs op, a call to the VM that changes whether the vCPUs run, if check
// accepts the task's state, and then moves the task to state to, which
// queues the move's event. The call
// runs under opMu, not mu, and with a deadline: kill, state and delete
// never wait behind a VM that does not answer (stopped, or stuck), and
// SIGKILL ends it whatever op is waiting for. A task that exited during
// the call stays stopped, and the call fails.
func (t *task) vcpus(ctx context.Context, what string, to state, op func(context.Context) error, check func(state) error) error {
	t.opMu.Lock()
	defer t.opMu.Unlock()
	t.mu.Lock()
	err := check(t.st)
	t.mu.Unlock()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, vmCallTimeout)
	defer cancel()
	if err := op(ctx); err != nil {
		return fmt.Errorf("%s vm %s: %w", what, t.id, err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.st == to {
		return nil // a disk error paused it as it was being paused
	}
	return t.transition(to)
}

// kill delivers a signal the way a VM understands it: SIGTERM, SIGINT and
// SIGPWR press the power button (a call within vmCallTimeout), SIGKILL
// stops the VM at once. It takes no lock across either.
func (t *task) kill(ctx context.Context, sig uint32) error {
	t.mu.Lock()
	st := t.st
	t.mu.Unlock()
	if st == stateStopped || st == stateDeleted {
		return fmt.Errorf("task %s: process already finished: %w", t.id, errdefs.ErrNotFound)
	}
	switch syscall.Signal(sig) {
	case 0:
		return nil
	case unix.SIGKILL:
		return t.vm.Kill()
	case unix.SIGTERM, unix.SIGINT, unix.SIGPWR:
		if st == stateCreated {
			// A guest whose vCPUs never ran cannot see the power button.
			return t.vm.Kill()
		}
		ctx, cancel := context.WithTimeout(ctx, vmCallTimeout)
		defer cancel()
		if err := t.vm.Powerdown(ctx); err != nil {
			return fmt.Errorf("task %s: %w", t.id, err)
		}
		return nil
	}
	return fmt.Errorf("signal %d is not supported by VM tasks (SIGTERM, SIGINT and SIGPWR power the guest down, SIGKILL stops it): %w",
		sig, errdefs.ErrNotImplemented)
}

// pause stops the vCPUs.
func (t *task) pause(ctx context.Context) error {
	return t.vcpus(ctx, "pause", statePaused, t.vm.Pause, func(st state) error {
		if err := st.next(statePaused); err != nil {
			return fmt.Errorf("task %s: %w", t.id, err)
		}
		return nil
	})
}

// checkpoint writes a running or paused VM's state into dir (see
// launch.Checkpointer); the VM then ends, and the task exits as it does.
// A checkpoint that fails leaves the vCPUs as they were.
func (t *task) checkpoint(ctx context.Context, dir string) error {
	cp, ok := t.vm.(launch.Checkpointer)
	if !ok {
		return fmt.Errorf("task %s cannot be checkpointed: %w", t.id, errdefs.ErrNotImplemented)
	}
	t.opMu.Lock()
	defer t.opMu.Unlock()
	t.mu.Lock()
	st := t.st
	t.mu.Unlock()
	if st != stateRunning && st != statePaused {
		return fmt.Errorf("task %s is %s, not running: %w", t.id, st, errdefs.ErrFailedPrecondition)
	}
	err := cp.Checkpoint(ctx, dir)
	if err == nil || st != stateRunning {
		return err
	}
	select {
	case <-t.vm.Done():
	default:
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), vmCallTimeout)
		defer cancel()
		if rerr := t.vm.Resume(rctx); rerr != nil {
			return fmt.Errorf("%w; and the vcpus could not run again: %v", err, rerr)
		}
	}
	return err
}

// resume restarts the vCPUs of a paused task.
func (t *task) resume(ctx context.Context) error {
	return t.vcpus(ctx, "resume", stateRunning, t.vm.Resume, func(st state) error {
		if st != statePaused {
			return fmt.Errorf("task %s is %s, not paused: %w", t.id, st, errdefs.ErrFailedPrecondition)
		}
		return nil
	})
}

// delete releases a stopped task's resources and queues TaskDelete, the
// task's last event. A created task that never started is stopped first,
// as containerd expects.
func (t *task) delete(ctx context.Context) error {
	t.mu.Lock()
	st := t.st
	t.mu.Unlock()
	switch st {
	case stateRunning, statePaused:
		return fmt.Errorf("task %s: %w", t.id, st.next(stateDeleted))
	case stateCreated:
		if err := t.vm.Kill(); err != nil {
			return fmt.Errorf("stop created vm %s: %w", t.id, err)
		}
	}
	// A stopped task's exit may still be on its way to the event queue.
	if err := t.wait(ctx); err != nil {
		return err
	}
	t.relMu.Lock()
	defer t.relMu.Unlock()
	t.mu.Lock()
	var err error
	retry := t.st == stateDeleted
	if !retry {
		err = t.transition(stateDeleted)
	}
	code, at := t.exitCode, t.exitedAt
	t.mu.Unlock()
	switch {
	case err != nil:
		return err
	case t.released:
		return fmt.Errorf("task %s: %w", t.id, errdefs.ErrNotFound)
	case !retry:
		_ = t.cons.Close()
	}
	if err := t.vm.Release(ctx); err != nil {
		return fmt.Errorf("delete task %s: %w (delete it again to finish)", t.id, err)
	}
	t.released = true
	t.pub(&eventstypes.TaskDelete{
		ContainerID: t.id, Pid: uint32(t.pid), ExitStatus: uint32(code), ExitedAt: protobuf.ToTimestamp(at),
	})
	return nil
}

// wait blocks until the task is stopped or ctx ends.
func (t *task) wait(ctx context.Context) error { return waitClosed(ctx, t.exited) }

// waitClosed blocks until ch is closed or ctx ends.
func waitClosed(ctx context.Context, ch <-chan struct{}) error {
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// snapshot returns the task's state and exit.
func (t *task) snapshot() (state, int, time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.st, t.exitCode, t.exitedAt
}

// addExec registers a program to run in the guest of a running task and
// queues TaskExecAdded.
func (t *task) addExec(ctx context.Context, id string, spec []byte, io stdio) (*execProcess, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.st != stateRunning {
		return nil, fmt.Errorf("task %s is %s, exec needs a running VM: %w", t.id, t.st, errdefs.ErrFailedPrecondition)
	}
	if _, ok := t.execs[id]; ok {
		return nil, fmt.Errorf("exec %s in task %s: %w", id, t.id, errdefs.ErrAlreadyExists)
	}
	e, err := newExec(ctx, t.id, id, spec, io, t.vm.GuestAgent(), t.pub)
	if err != nil {
		return nil, err
	}
	t.execs[id] = e
	t.pub(&eventstypes.TaskExecAdded{ContainerID: t.id, ExecID: id})
	return e, nil
}

// exec finds one of the task's execs.
func (t *task) exec(id string) (*execProcess, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.execs[id]
	if !ok {
		return nil, fmt.Errorf("exec %s in task %s: %w", id, t.id, errdefs.ErrNotFound)
	}
	return e, nil
}

// deleteExec forgets a stopped exec.
func (t *task) deleteExec(e *execProcess) error {
	if err := e.delete(); err != nil {
		return err
	}
	t.mu.Lock()
	delete(t.execs, e.id)
	t.mu.Unlock()
	return nil
}

// update applies new resource limits (a LinuxResources in JSON, as
// containerd sends it) to the VM.
func (t *task) update(ctx context.Context, resources typeurl.Any) error {
	if resources == nil || len(resources.GetValue()) == 0 {
		return fmt.Errorf("update task %s: no resources given: %w", t.id, errdefs.ErrInvalidArgument)
	}
	var r specs.LinuxResources
	if err := json.Unmarshal(resources.GetValue(), &r); err != nil {
		return fmt.Errorf("update task %s: resources: %w", t.id, errdefs.ErrInvalidArgument)
	}
	t.mu.Lock()
	st := t.st
	t.mu.Unlock()
	if st == stateStopped || st == stateDeleted {
		return fmt.Errorf("update task %s: task is %s: %w", t.id, st, errdefs.ErrFailedPrecondition)
	}
	if err := t.vm.Update(ctx, &r); err != nil {
		return fmt.Errorf("update task %s: %w", t.id, err)
	}
	return nil
}
