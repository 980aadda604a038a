package shim

import (
	"errors"
	"strings"
	"testing"

	apitask "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/errdefs"
)

// allStates lists every state in order.
func allStates() []state {
	return []state{stateCreated, stateRunning, statePaused, stateStopped, stateDeleted}
}

func TestStateNext(t *testing.T) {
	allowed := map[[2]state]bool{
		{stateCreated, stateRunning}: true,
		{stateCreated, stateStopped}: true,
		{stateRunning, statePaused}:  true,
		{stateRunning, stateStopped}: true,
		{statePaused, stateRunning}:  true,
		{statePaused, stateStopped}:  true,
		{stateStopped, stateDeleted}: true,
	}
	for _, from := range allStates() {
		for _, to := range allStates() {
			t.Run(from.String()+"->"+to.String(), func(t *testing.T) {
				err := from.next(to)
				if allowed[[2]state{from, to}] {
					if err != nil {
						t.Fatalf("want allowed, got %v", err)
					}
					return
				}
				if err == nil {
					t.Fatal("want refused, got allowed")
				}
				if !errors.Is(err, errdefs.ErrFailedPrecondition) {
					t.Fatalf("error %q does not wrap ErrFailedPrecondition", err)
				}
				msg := err.Error()
				if !strings.Contains(msg, from.String()) || !strings.Contains(msg, to.String()) {
					t.Fatalf("error %q does not name both states", msg)
				}
			})
		}
	}
}

func TestStateStatus(t *testing.T) {
	want := map[state]apitask.Status{
		stateCreated: apitask.Status_CREATED,
		stateRunning: apitask.Status_RUNNING,
		statePaused:  apitask.Status_PAUSED,
		stateStopped: apitask.Status_STOPPED,
		stateDeleted: apitask.Status_STOPPED,
	}
	for _, s := range allStates() {
		if got := s.status(); got != want[s] {
			t.Errorf("%s.status() = %v, want %v", s, got, want[s])
		}
	}
	if got := state(99).status(); got != apitask.Status_UNKNOWN {
		t.Errorf("unknown state status = %v, want UNKNOWN", got)
	}
}

func TestStateString(t *testing.T) {
	want := []string{"created", "running", "paused", "stopped", "deleted"}
	for i, s := range allStates() {
		if s.String() != want[i] {
			t.Errorf("state %d is %q, want %q", i, s, want[i])
		}
	}
}

func TestTaskTransitionNamesTask(t *testing.T) {
	tk := &task{id: "t1", st: stateStopped}
	err := tk.transition(stateRunning)
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "t1") {
		t.Fatalf("transition error %v: want FailedPrecondition naming the task", err)
	}
	if tk.st != stateStopped {
		t.Fatalf("refused transition changed the state to %s", tk.st)
	}
	if err := tk.transition(stateDeleted); err != nil || tk.st != stateDeleted {
		t.Fatalf("transition to deleted: %v, state %s", err, tk.st)
	}
}
