package shim

import (
	"context"
	"errors"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/vmshim/vmshim/launch"
)

// hookedVM is a fakeVM with OCI-hook-like work around Start.
type hookedVM struct {
	*fakeVM
	beforeErr error
	during    func() // called from beforeStart and afterStart
}

func (v *hookedVM) StartHooks() launch.StartHooks { return v }

func (v *hookedVM) BeforeStart(context.Context) error {
	v.record("beforeStart")
	v.during()
	return v.beforeErr
}

func (v *hookedVM) AfterStart(context.Context) {
	v.record("afterStart")
	v.during()
}

func newHookedTask(t *testing.T, beforeErr error) (*task, *hookedVM) {
	t.Helper()
	ctx, _ := testLogger(t)
	vm := &hookedVM{fakeVM: newFakeVM(42), beforeErr: beforeErr}
	tk := newTask(ctx, "vm1", t.TempDir(), stdio{}, &output{}, vm, func(any) {})
	tk.watch(ctx)
	// A hook may ask for the task's state while it runs (through
	// containerd): that must not wait for Start.
	vm.during = func() { tk.snapshot() }
	t.Cleanup(func() {
		_ = vm.Kill()
		_ = tk.cons.Close()
	})
	return tk, vm
}

func TestTaskStartRunsHooksAround(t *testing.T) {
	tk, vm := newHookedTask(t, nil)
	if err := tk.start(context.Background()); err != nil {
		t.Fatalf("start: %v", err)
	}
	vm.mu.Lock()
	calls := slices.Clone(vm.calls)
	vm.mu.Unlock()
	if want := []string{"beforeStart", "start", "afterStart"}; !slices.Equal(calls, want) {
		t.Errorf("calls %v, want %v", calls, want)
	}
	if st, _, _ := tk.snapshot(); st != stateRunning {
		t.Errorf("task is %s, want running", st)
	}
}

func TestTaskStartHookFailureLeavesCreated(t *testing.T) {
	tk, vm := newHookedTask(t, errors.New("startContainer hook #0 (/bin/false): exit status 1"))
	err := tk.start(context.Background())
	if err == nil || !errors.Is(err, vm.beforeErr) {
		t.Fatalf("start: %v, want the hook's error", err)
	}
	vm.mu.Lock()
	calls := slices.Clone(vm.calls)
	vm.mu.Unlock()
	if want := []string{"beforeStart"}; !slices.Equal(calls, want) {
		t.Errorf("calls %v, want %v", calls, want)
	}
	if st, _, _ := tk.snapshot(); st != stateCreated {
		t.Errorf("task is %s, want created", st)
	}
}

// Liveness bounds: with a call to QEMU or the guest agent pending that
// never returns, State answers within stateBound and SIGKILL stops the
// task within killBound.
const (
	stateBound = time.Second
	killBound  = 2 * time.Second
)

// TestTaskKillDoesNotWaitForFrozenQEMU freezes the VM's QMP while a
// start, pause, resume or power-button press waits on it, as SIGSTOP
// does to QEMU: the task's state stays readable, SIGKILL ends the task at
// once, and the pending call then fails.
func TestTaskKillDoesNotWaitForFrozenQEMU(t *testing.T) {
	for _, op := range []string{"start", "pause", "resume", "powerdown"} {
		t.Run(op, func(t *testing.T) {
			ctx, _ := testLogger(t)
			vm := newFakeVM(42)
			tk := newTask(ctx, "vm1", t.TempDir(), stdio{}, &output{}, vm, func(any) {})
			tk.watch(ctx)
			t.Cleanup(func() {
				_ = vm.Kill()
				_ = tk.cons.Close()
			})
			frozenDuring(t, tk, vm, op)
			within(t, stateBound, "state", func() { tk.snapshot() })
			within(t, killBound, "SIGKILL", func() {
				if err := tk.kill(context.Background(), uint32(syscall.SIGKILL)); err != nil {
					t.Errorf("kill: %v", err)
				}
				waitCtx, cancel := context.WithTimeout(context.Background(), killBound)
				defer cancel()
				if err := tk.wait(waitCtx); err != nil {
					t.Errorf("task did not stop after SIGKILL: %v", err)
				}
			})
			if st, code, _ := tk.snapshot(); st != stateStopped || code != 137 {
				t.Errorf("task %s with exit %d, want stopped with 137", st, code)
			}
		})
	}
}

// frozenDuring brings the task to where op applies, freezes the VM's QMP
// and leaves op waiting on it; the test ends with op failed, as the VM
// is killed under it.
func frozenDuring(t *testing.T, tk *task, vm *fakeVM, op string) {
	t.Helper()
	ctx := context.Background()
	calls := map[string]func() error{
		"start":     func() error { return tk.start(ctx) },
		"pause":     func() error { return tk.pause(ctx) },
		"resume":    func() error { return tk.resume(ctx) },
		"powerdown": func() error { return tk.kill(ctx, uint32(syscall.SIGTERM)) },
	}
	if op != "start" {
		if err := tk.start(ctx); err != nil {
			t.Fatalf("start: %v", err)
		}
	}
	if op == "resume" {
		if err := tk.pause(ctx); err != nil {
			t.Fatalf("pause: %v", err)
		}
	}
	vm.mu.Lock()
	vm.frozen = make(chan struct{})
	vm.mu.Unlock()
	pending := make(chan error, 1)
	go func() { pending <- calls[op]() }()
	within(t, waitTimeout, "the "+op+" call", func() {
		for vm.count(op) < 1 {
			time.Sleep(time.Millisecond)
		}
	})
	t.Cleanup(func() {
		if err := receive(t, pending, op); err == nil {
			t.Errorf("%s of a VM killed under it succeeded", op)
		}
	})
}

// within fails the test if fn does not return within d.
func within(t *testing.T, d time.Duration, what string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		fn()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("%s did not return within %v", what, d)
	}
}

// checkpointVM is a fakeVM that can be checkpointed: it pauses, and then
// ends with 0, as a saved VM does, or fails with err.
type checkpointVM struct {
	*fakeVM
	err  error
	dirs []string
}

func (v *checkpointVM) Checkpoint(ctx context.Context, dir string) error {
	v.record("checkpoint")
	v.mu.Lock()
	v.dirs = append(v.dirs, dir)
	v.mu.Unlock()
	if err := v.Pause(ctx); err != nil {
		return err
	}
	if v.err != nil {
		return v.err
	}
	v.exit(0)
	return nil
}

// TestTaskCheckpoint: a running VM's checkpoint ends it with 0; one that
// fails leaves the vCPUs as they were (running again, or paused); a VM
// that cannot be checkpointed, or a task that has not started, says so.
func TestTaskCheckpoint(t *testing.T) {
	ctx := context.Background()
	newTask := func(t *testing.T, vm launch.VM) *task {
		lctx, _ := testLogger(t)
		tk := newTask(lctx, "vm1", t.TempDir(), stdio{}, &output{}, vm, func(any) {})
		tk.watch(lctx)
		t.Cleanup(func() {
			_ = vm.Kill()
			_ = tk.cons.Close()
		})
		return tk
	}
	calls := func(v *fakeVM) []string {
		v.mu.Lock()
		defer v.mu.Unlock()
		return slices.Clone(v.calls)
	}

	t.Run("ends the vm", func(t *testing.T) {
		vm := &checkpointVM{fakeVM: newFakeVM(42)}
		tk := newTask(t, vm)
		if err := tk.start(ctx); err != nil {
			t.Fatal(err)
		}
		if err := tk.checkpoint(ctx, "/ckpt"); err != nil {
			t.Fatalf("checkpoint: %v", err)
		}
		if err := tk.wait(ctx); err != nil {
			t.Fatal(err)
		}
		if st, code, _ := tk.snapshot(); st != stateStopped || code != 0 {
			t.Errorf("task %s with %d after a checkpoint, want stopped with 0", st, code)
		}
		if !slices.Equal(vm.dirs, []string{"/ckpt"}) {
			t.Errorf("checkpoint into %q", vm.dirs)
		}
		if err := tk.checkpoint(ctx, "/ckpt"); !errdefs.IsFailedPrecondition(err) {
			t.Errorf("checkpoint of a stopped task: %v", err)
		}
	})
	for _, tc := range []struct {
		name   string
		paused bool
		want   []string
	}{
		{"fails running", false, []string{"start", "checkpoint", "pause", "resume"}},
		{"fails paused", true, []string{"start", "pause", "checkpoint", "pause"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vm := &checkpointVM{fakeVM: newFakeVM(42), err: errors.New("no room on the volume")}
			tk := newTask(t, vm)
			if err := tk.start(ctx); err != nil {
				t.Fatal(err)
			}
			if tc.paused {
				if err := tk.pause(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if err := tk.checkpoint(ctx, "/ckpt"); !errors.Is(err, vm.err) {
				t.Fatalf("checkpoint: %v, want %v", err, vm.err)
			}
			if got := calls(vm.fakeVM); !slices.Equal(got, tc.want) {
				t.Errorf("calls %v, want %v", got, tc.want)
			}
		})
	}
	t.Run("not a checkpointer", func(t *testing.T) {
		tk := newTask(t, newFakeVM(42))
		if err := tk.start(ctx); err != nil {
			t.Fatal(err)
		}
		if err := tk.checkpoint(ctx, "/ckpt"); !errdefs.IsNotImplemented(err) {
			t.Errorf("checkpoint of a VM that cannot be: %v", err)
		}
	})
	t.Run("created", func(t *testing.T) {
		tk := newTask(t, &checkpointVM{fakeVM: newFakeVM(42)})
		if err := tk.checkpoint(ctx, "/ckpt"); !errdefs.IsFailedPrecondition(err) {
			t.Errorf("checkpoint of a created task: %v", err)
		}
	})
}
