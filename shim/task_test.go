package shim

import (
	"context"
	"errors"
	"slices"
	"testing"
)

// hookedVM is a fakeVM with OCI-hook-like work around Start.
type hookedVM struct {
	*fakeVM
	beforeErr error
	during    func() // called from beforeStart and afterStart
}

func (v *hookedVM) StartHooks() StartHooks { return v }

func (v *hookedVM) beforeStart(context.Context) error {
	v.record("beforeStart")
	v.during()
	return v.beforeErr
}

func (v *hookedVM) afterStart(context.Context) {
	v.record("afterStart")
	v.during()
}

func newHookedTask(t *testing.T, beforeErr error) (*task, *hookedVM) {
	t.Helper()
	ctx, _ := testLogger(t)
	vm := &hookedVM{fakeVM: newFakeVM(42), beforeErr: beforeErr}
	tk := newTask(ctx, "vm1", t.TempDir(), stdio{}, &output{}, vm, func(*task) {})
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
