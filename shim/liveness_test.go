package shim

import (
	"context"
	"errors"
	"syscall"
	"testing"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	apitask "github.com/containerd/containerd/api/types/task"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// errAgentGone is how a held agent call ends once its VM is gone.
var errAgentGone = errors.New("guest agent closed")

// agentPending leaves an exec operation of task vm1 waiting on a guest
// agent that never answers, and returns the held call and the
// operation's result.
type agentPending func(t *testing.T, s *service, agent *fakeAgent) (*agentCall, <-chan error)

// TestKillStateDeleteDoNotWaitForAgent: with an exec's start, kill or
// status poll, or a terminal session's port, start, resize or removal,
// waiting on a guest agent or QEMU that never answers, and a pause
// waiting on a frozen QEMU, State answers at once, SIGKILL stops the
// task, and Wait and Delete return, all within the liveness bounds.
func TestKillStateDeleteDoNotWaitForAgent(t *testing.T) {
	for name, pend := range map[string]agentPending{
		"exec start":       pendingExecStart,
		"exec stdin start": pendingStdinStart,
		"exec kill":        pendingExecKill,
		"exec poll":        pendingExecPoll,
		"tty add port":     pendingTTYAddPort,
		"tty open":         pendingTTYOpen,
		"tty resize":       pendingTTYResize,
		"tty remove port":  pendingTTYRemove,
	} {
		t.Run(name, func(t *testing.T) {
			agent := newFakeAgent()
			agent.hang["sleep"] = true
			s, _, vm := execVM(t, agent)
			call, opErr := pend(t, s, agent)
			pauseErr := pendingPause(t, s, vm)
			ctx := context.Background()

			within(t, stateBound, "state", func() {
				wantStatus(t, s, "vm1", apitask.Status_RUNNING)
				if _, err := s.State(ctx, &taskAPI.StateRequest{ID: "vm1", ExecID: "e"}); err != nil {
					t.Errorf("exec state: %v", err)
				}
			})
			within(t, killBound, "SIGKILL", func() {
				if _, err := s.Kill(ctx, &taskAPI.KillRequest{ID: "vm1", Signal: uint32(syscall.SIGKILL)}); err != nil {
					t.Errorf("kill: %v", err)
				}
				wctx, cancel := context.WithTimeout(ctx, killBound)
				defer cancel()
				if _, err := s.Wait(wctx, &taskAPI.WaitRequest{ID: "vm1"}); err != nil {
					t.Errorf("task did not stop after SIGKILL: %v", err)
				}
			})
			within(t, stateBound, "delete", func() {
				if _, err := s.Delete(ctx, &taskAPI.DeleteRequest{ID: "vm1"}); err != nil {
					t.Errorf("delete: %v", err)
				}
			})
			call.release(errAgentGone)
			receive(t, opErr, name)
			if err := receive(t, pauseErr, "pause"); err == nil {
				t.Error("a killed VM paused")
			}
		})
	}
}

// pendingExecStart leaves the start of exec e waiting on the agent.
func pendingExecStart(t *testing.T, s *service, agent *fakeAgent) (*agentCall, <-chan error) {
	t.Helper()
	addExec(t, s, "e", "sleep")
	return held(t, agent, "exec", func() error {
		_, err := s.Start(context.Background(), &taskAPI.StartRequest{ID: "vm1", ExecID: "e"})
		return err
	})
}

// pendingStdinStart leaves the start of exec e, which reads stdin,
// waiting on the agent's ping.
func pendingStdinStart(t *testing.T, s *service, agent *fakeAgent) (*agentCall, <-chan error) {
	t.Helper()
	stdin := mkfifo(t, "in")
	if _, err := s.Exec(context.Background(), &taskAPI.ExecProcessRequest{
		ID: "vm1", ExecID: "e", Stdin: stdin, Spec: processSpec(t, specs.Process{Args: []string{"cat"}}),
	}); err != nil {
		t.Fatal(err)
	}
	return held(t, agent, "ping", func() error {
		_, err := s.Start(context.Background(), &taskAPI.StartRequest{ID: "vm1", ExecID: "e"})
		return err
	})
}

// pendingExecKill leaves a SIGTERM to the running exec e waiting on the
// agent.
func pendingExecKill(t *testing.T, s *service, agent *fakeAgent) (*agentCall, <-chan error) {
	t.Helper()
	runSleepExec(t, s)
	return held(t, agent, "exec", func() error {
		_, err := s.Kill(context.Background(), &taskAPI.KillRequest{ID: "vm1", ExecID: "e", Signal: uint32(syscall.SIGTERM)})
		return err
	})
}

// pendingExecPoll leaves a status poll of the running exec e waiting on
// the agent.
func pendingExecPoll(t *testing.T, s *service, agent *fakeAgent) (*agentCall, <-chan error) {
	t.Helper()
	ch := agent.holdCalls(func(c *agentCall) bool { return c.name == "status" })
	runSleepExec(t, s)
	call := receive(t, ch, "a status poll")
	agent.stopHolding()
	done := make(chan error, 1)
	done <- nil
	return call, done
}

// runSleepExec starts exec e, a program that runs until killed.
func runSleepExec(t *testing.T, s *service) {
	t.Helper()
	addExec(t, s, "e", "sleep")
	if _, err := s.Start(context.Background(), &taskAPI.StartRequest{ID: "vm1", ExecID: "e"}); err != nil {
		t.Fatal(err)
	}
}

// held runs op while the agent holds calls named name and returns once
// the agent has op's call.
func held(t *testing.T, agent *fakeAgent, name string, op func() error) (*agentCall, <-chan error) {
	t.Helper()
	ch := agent.holdCalls(func(c *agentCall) bool { return c.name == name })
	errc := make(chan error, 1)
	go func() { errc <- op() }()
	call := receive(t, ch, "the agent's "+name+" call")
	agent.stopHolding()
	return call, errc
}

// TestExecKillHonoursDeadline: a signal other than SIGKILL waits for the
// agent only as long as the caller's context allows, while State answers;
// SIGKILL does not wait for the agent at all.
func TestExecKillHonoursDeadline(t *testing.T) {
	agent := newFakeAgent()
	agent.hang["sleep"] = true
	s, _, _ := execVM(t, agent)
	runSleepExec(t, s)
	ch := agent.holdCalls(func(c *agentCall) bool { return c.cmd.Path == "kill" })
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := s.Kill(ctx, &taskAPI.KillRequest{ID: "vm1", ExecID: "e", Signal: uint32(syscall.SIGTERM)})
		errc <- err
	}()
	receive(t, ch, "the SIGTERM")
	within(t, stateBound, "exec state", func() {
		if _, err := s.State(context.Background(), &taskAPI.StateRequest{ID: "vm1", ExecID: "e"}); err != nil {
			t.Errorf("exec state: %v", err)
		}
	})
	cancel()
	if err := receive(t, errc, "kill"); err == nil {
		t.Fatal("SIGTERM succeeded without the agent")
	}
	within(t, stateBound, "SIGKILL", func() {
		if _, err := s.Kill(context.Background(), &taskAPI.KillRequest{ID: "vm1", ExecID: "e", Signal: uint32(syscall.SIGKILL)}); err != nil {
			t.Errorf("kill: %v", err)
		}
	})
	receive(t, ch, "the SIGKILL").release(errAgentGone)
	wctx, wcancel := context.WithTimeout(context.Background(), waitTimeout)
	defer wcancel()
	wr, err := s.Wait(wctx, &taskAPI.WaitRequest{ID: "vm1", ExecID: "e"})
	if err != nil || wr.ExitStatus != 137 {
		t.Fatalf("wait: %v, %v; want 137", wr, err)
	}
}

// TestCallsHaveDeadlines runs a task and execs through their life and
// checks that every QMP and guest agent call had a deadline.
func TestCallsHaveDeadlines(t *testing.T) {
	agent := newFakeAgent()
	agent.hang["sleep"] = true
	s, _, vm := execVM(t, agent)
	ctx := context.Background()
	for _, call := range []func() error{
		func() error { _, err := s.Pause(ctx, &taskAPI.PauseRequest{ID: "vm1"}); return err },
		func() error { _, err := s.Resume(ctx, &taskAPI.ResumeRequest{ID: "vm1"}); return err },
		func() error {
			runSleepExec(t, s)
			waitFor(t, "a status poll", func() bool { return agentCalls(agent) > 1 })
			return nil
		},
		func() error {
			_, err := s.Kill(ctx, &taskAPI.KillRequest{ID: "vm1", ExecID: "e", Signal: 15})
			return err
		},
		func() error {
			_, err := s.Kill(ctx, &taskAPI.KillRequest{ID: "vm1", ExecID: "e", Signal: 9})
			return err
		},
		func() error { _, err := s.Kill(ctx, &taskAPI.KillRequest{ID: "vm1", Signal: 15}); return err },
	} {
		if err := call(); err != nil {
			t.Fatal(err)
		}
	}
	wctx, cancel := context.WithTimeout(ctx, waitTimeout)
	defer cancel()
	if _, err := s.Wait(wctx, &taskAPI.WaitRequest{ID: "vm1", ExecID: "e"}); err != nil {
		t.Fatal(err)
	}
	vm.mu.Lock()
	qmp := vm.noDeadline
	vm.mu.Unlock()
	agent.mu.Lock()
	ga := agent.noDeadline
	agent.mu.Unlock()
	if len(qmp) > 0 || len(ga) > 0 {
		t.Errorf("calls without a deadline: qmp %v, guest agent %v", qmp, ga)
	}
}

// agentCalls counts the calls the agent has had.
func agentCalls(a *fakeAgent) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.calls
}
