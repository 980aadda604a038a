package shim

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// vcpuTimeout bounds a QMP call that starts, stops or restarts the vCPUs.
const vcpuTimeout = 10 * time.Second

// flushTimeout bounds how long an exit waits for the last console output
// to reach stdout before it is reported.
const flushTimeout = 2 * time.Second

// stdio names the task's IO fifos, as containerd passed them.
type stdio struct {
	stdin, stdout, stderr string
	terminal              bool
}

// task is one container: a VM and its console.
type task struct {
	id     string
	bundle string
	stdio  stdio
	vm     VM
	cons   *console

	// opMu serializes the calls that change whether the vCPUs run (see
	// vcpus); it is never taken by kill, state or delete.
	opMu     sync.Mutex
	mu       sync.Mutex // guards st, starting, exitCode, exitedAt and execs; the only writer of st is transition; never held across a call to QEMU
	st       state
	starting bool // a Start is under way
	exitCode int
	exitedAt time.Time
	execs    map[string]*execProcess
	exited   chan struct{} // closed when the task is stopped and its exit published
}

// newTask wraps a created VM whose console goes to out; onExit is called
// once, after the task has become stopped.
func newTask(ctx context.Context, id, bundle string, io stdio, out *output, vm VM, onExit func(*task)) *task {
	t := &task{
		id: id, bundle: bundle, stdio: io, vm: vm,
		cons:   newConsole(ctx, vm.Console(), io, out),
		execs:  make(map[string]*execProcess),
		exited: make(chan struct{}),
	}
	go t.monitor(ctx, onExit)
	return t
}

// transition moves the task to state to; callers hold t.mu.
func (t *task) transition(to state) error {
	if err := t.st.next(to); err != nil {
		return fmt.Errorf("task %s: %w", t.id, err)
	}
	t.st = to
	return nil
}

// monitor waits for QEMU to exit, lets the console drain, and records
// the exit.
func (t *task) monitor(ctx context.Context, onExit func(*task)) {
	<-t.vm.Done()
	select {
	case <-t.cons.flushed():
	case <-time.After(flushTimeout):
		log.G(ctx).WithField("id", t.id).Warn("console output not drained before exit")
	}
	code, at := t.vm.ExitStatus()
	t.mu.Lock()
	if err := t.transition(stateStopped); err != nil {
		log.G(ctx).WithError(err).Error("record exit")
	}
	t.exitCode, t.exitedAt = code, at
	execs := make([]*execProcess, 0, len(t.execs))
	for _, e := range t.execs {
		execs = append(execs, e)
	}
	t.mu.Unlock()
	for _, e := range execs {
		go e.vmGone()
	}
	onExit(t)
	// Only now may Wait and Delete return: TaskExit is queued before
	// TaskDelete, and before a shutdown closes the event queue.
	close(t.exited)
}

// start runs the VM's vCPUs.
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
	hooks := t.vm.StartHooks()
	if hooks != nil {
		if err := hooks.beforeStart(ctx); err != nil {
			return fmt.Errorf("start vm %s: %w", t.id, err)
		}
	}
	if err := t.run(ctx); err != nil {
		return err
	}
	if hooks != nil {
		hooks.afterStart(ctx)
	}
	return nil
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

// vcpus runs op, a QMP call that changes whether the vCPUs run, if check
// accepts the task's state, and then moves the task to state to. The call
// runs under opMu, not mu, and with a deadline: kill, state and delete
// never wait behind a QEMU that does not answer (stopped, or stuck), and
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
	ctx, cancel := context.WithTimeout(ctx, vcpuTimeout)
	defer cancel()
	if err := op(ctx); err != nil {
		return fmt.Errorf("%s vm %s: %w", what, t.id, err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.transition(to)
}

// kill delivers a signal the way a VM understands it: SIGTERM, SIGINT and
// SIGPWR press the power button, SIGKILL stops QEMU at once.
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

// resume restarts the vCPUs of a paused task.
func (t *task) resume(ctx context.Context) error {
	return t.vcpus(ctx, "resume", stateRunning, t.vm.Resume, func(st state) error {
		if st != statePaused {
			return fmt.Errorf("task %s is %s, not paused: %w", t.id, st, errdefs.ErrFailedPrecondition)
		}
		return nil
	})
}

// delete releases a stopped task's resources. A created task that never
// started is stopped first, as containerd expects.
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
	t.mu.Lock()
	err := t.transition(stateDeleted)
	t.mu.Unlock()
	if err != nil {
		return err
	}
	_ = t.cons.Close()
	t.vm.Release(ctx)
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

// addExec registers a program to run in the guest of a running task.
func (t *task) addExec(ctx context.Context, id string, spec []byte, io stdio, onExit func(*execProcess)) (*execProcess, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.st != stateRunning {
		return nil, fmt.Errorf("task %s is %s, exec needs a running VM: %w", t.id, t.st, errdefs.ErrFailedPrecondition)
	}
	if _, ok := t.execs[id]; ok {
		return nil, fmt.Errorf("exec %s in task %s: %w", id, t.id, errdefs.ErrAlreadyExists)
	}
	e, err := newExec(ctx, t.id, id, spec, io, t.vm.GuestAgent(), onExit)
	if err != nil {
		return nil, err
	}
	t.execs[id] = e
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
