package shim

import (
	"fmt"

	apitask "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/errdefs"
)

// state is a task's lifecycle state.
type state int

const (
	stateCreated state = iota
	stateRunning
	statePaused
	stateStopped
	stateDeleted
)

func (s state) String() string {
	return [...]string{"created", "running", "paused", "stopped", "deleted"}[s]
}

// status maps the state to containerd's task status.
func (s state) status() apitask.Status {
	switch s {
	case stateCreated:
		return apitask.Status_CREATED
	case stateRunning:
		return apitask.Status_RUNNING
	case statePaused:
		return apitask.Status_PAUSED
	case stateStopped, stateDeleted:
		return apitask.Status_STOPPED
	}
	return apitask.Status_UNKNOWN
}

// next checks that the move from s to to is allowed; the error wraps
// errdefs.ErrFailedPrecondition.
func (s state) next(to state) error {
	var ok bool
	switch s {
	case stateCreated:
		ok = to == stateRunning || to == stateStopped
	case stateRunning:
		ok = to == statePaused || to == stateStopped
	case statePaused:
		ok = to == stateRunning || to == stateStopped
	case stateStopped:
		ok = to == stateDeleted
	}
	if !ok {
		return fmt.Errorf("task is %s, cannot become %s: %w", s, to, errdefs.ErrFailedPrecondition)
	}
	return nil
}
