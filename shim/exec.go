package shim

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/fifo"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/vmshim/vmshim/qemu"
)

const (
	// maxExecInput bounds the stdin an exec may pass to the guest: the
	// agent takes it whole, in one message, before the program starts.
	maxExecInput = 1 << 20
	// agentCallTimeout bounds each guest agent call.
	agentCallTimeout = 10 * time.Second
	// outputTimeout bounds how long an exec's output waits for a reader.
	outputTimeout = 10 * time.Second
	// killGrace is how long SIGKILL waits for the guest to report the
	// program's end before the exec is ended without it.
	killGrace = 2 * time.Second
	// pollMin and pollMax bound the interval between status polls.
	pollMin = 20 * time.Millisecond
	pollMax = 500 * time.Millisecond
	// statusRetries is how many failed status polls in a row end an exec.
	statusRetries = 5
)

// execProcess is a program run in the guest through its agent. The agent
// runs it without a terminal and returns its output when it ends, so
// output reaches the exec's stdout and stderr at exit.
type execProcess struct {
	id, taskID string
	args, env  []string
	stdio      stdio
	agent      GuestAgent
	cancel     context.CancelFunc // stops collecting stdin and polling
	ctx        context.Context

	mu       sync.Mutex // guards st, pid, exitCode, exitedAt, starting and ending
	st       state      // created, running, stopped or deleted
	pid      int        // guest pid once started
	exitCode int
	exitedAt time.Time
	starting bool          // start is calling the agent
	ending   bool          // the exit is being recorded
	exited   chan struct{} // closed once stopped and the exit published
	onExit   func(*execProcess)
}

// newExec validates an exec's process spec (JSON, as containerd sends it).
func newExec(ctx context.Context, taskID, id string, spec []byte, io stdio, agent GuestAgent, onExit func(*execProcess)) (*execProcess, error) {
	var p specs.Process
	if err := json.Unmarshal(spec, &p); err != nil {
		return nil, fmt.Errorf("exec %s: process spec: %w", id, errdefs.ErrInvalidArgument)
	}
	if len(p.Args) == 0 || p.Args[0] == "" {
		return nil, fmt.Errorf("exec %s: no command given: %w", id, errdefs.ErrInvalidArgument)
	}
	if p.Terminal || io.terminal {
		return nil, fmt.Errorf("exec %s: a terminal (tty) is not supported: the guest agent runs commands without one; exec without -t: %w",
			id, errdefs.ErrNotImplemented)
	}
	if agent == nil {
		return nil, fmt.Errorf("exec %s: container %s runs no guest to exec in: %w", id, taskID, errdefs.ErrFailedPrecondition)
	}
	ctx, cancel := context.WithCancel(ctx)
	return &execProcess{
		id: id, taskID: taskID, args: p.Args, env: p.Env, stdio: io, agent: agent,
		ctx: ctx, cancel: cancel, exited: make(chan struct{}), onExit: onExit,
	}, nil
}

// start runs the program. With stdin, the program starts once stdin ends
// (the agent takes all input up front), so start returns before that
// with pid 0. The agent is called without e.mu held.
func (e *execProcess) start(ctx context.Context) (int, error) {
	e.mu.Lock()
	if e.st != stateCreated || e.starting {
		defer e.mu.Unlock()
		return 0, fmt.Errorf("exec %s is %s, not created: %w", e.id, e.st, errdefs.ErrFailedPrecondition)
	}
	e.starting = true
	e.mu.Unlock()

	cctx, cancel := context.WithTimeout(ctx, agentCallTimeout)
	defer cancel()
	var pid int
	var err error
	if e.stdio.stdin != "" {
		err = e.agent.Ping(cctx)
	} else {
		pid, err = e.agent.Exec(cctx, e.command(nil))
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.starting = false
	if err != nil {
		return 0, fmt.Errorf("exec %s: %w", e.id, err)
	}
	e.pid = pid
	if err := e.transition(stateRunning); err != nil {
		// Killed while starting: the exec has ended already, so its
		// program must not outlive it.
		if pid > 0 {
			go e.signalGuest(context.WithoutCancel(ctx), unix.SIGKILL, pid)
		}
		return 0, err
	}
	if pid == 0 {
		go e.runWithInput()
	} else {
		go e.poll(pid)
	}
	return pid, nil
}

// transition moves the exec to state to; callers hold e.mu.
func (e *execProcess) transition(to state) error {
	if err := e.st.next(to); err != nil {
		return fmt.Errorf("exec %s: %w", e.id, err)
	}
	e.st = to
	return nil
}

func (e *execProcess) command(input []byte) qemu.GuestCommand {
	return qemu.GuestCommand{Path: e.args[0], Args: e.args[1:], Env: e.env, Input: input}
}

// runWithInput reads stdin to its end, then runs the program with it.
func (e *execProcess) runWithInput() {
	input, err := e.readInput()
	if err != nil {
		log.G(e.ctx).WithError(err).WithFields(log.Fields{"id": e.taskID, "exec_id": e.id}).Warn("exec stdin")
		e.finish(qemu.GuestExecStatus{Exited: true, ExitCode: 255, Stderr: []byte(err.Error() + "\n")})
		return
	}
	cctx, cancel := context.WithTimeout(e.ctx, agentCallTimeout)
	pid, err := e.agent.Exec(cctx, e.command(input))
	cancel()
	if err != nil {
		e.finish(qemu.GuestExecStatus{Exited: true, ExitCode: 255, Stderr: []byte(err.Error() + "\n")})
		return
	}
	e.mu.Lock()
	e.pid = pid
	e.mu.Unlock()
	e.poll(pid)
}

// readInput reads the stdin fifo until it ends, at most maxExecInput.
func (e *execProcess) readInput() ([]byte, error) {
	f, err := fifo.OpenFifo(e.ctx, e.stdio.stdin, syscall.O_RDONLY, 0)
	if err != nil {
		return nil, fmt.Errorf("open stdin: %w", err)
	}
	defer f.Close()
	stop := context.AfterFunc(e.ctx, func() { f.Close() })
	defer stop()
	b, err := io.ReadAll(io.LimitReader(f, maxExecInput+1))
	if err != nil && e.ctx.Err() != nil {
		return nil, e.ctx.Err()
	}
	if len(b) > maxExecInput {
		return nil, fmt.Errorf("exec stdin is larger than %d bytes: %w", maxExecInput, errdefs.ErrInvalidArgument)
	}
	return b, nil
}

// poll asks the agent about the program until it ends.
func (e *execProcess) poll(pid int) {
	logger := log.G(e.ctx).WithFields(log.Fields{"id": e.taskID, "exec_id": e.id, "pid": pid})
	interval, failures := pollMin, 0
	for {
		t := time.NewTimer(interval)
		select {
		case <-e.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		cctx, cancel := context.WithTimeout(e.ctx, agentCallTimeout)
		st, err := e.agent.ExecStatus(cctx, pid)
		cancel()
		switch {
		case err != nil && e.ctx.Err() != nil:
			return
		case err != nil:
			failures++
			logger.WithError(err).Debug("exec status")
			if failures >= statusRetries {
				logger.WithError(err).Warn("guest agent lost the exec; ending it")
				e.finish(qemu.GuestExecStatus{Exited: true, ExitCode: 255})
				return
			}
		case st.Exited:
			e.finish(st)
			return
		default:
			failures = 0
		}
		interval = min(interval*2, pollMax)
	}
}

// finish writes the program's output and records its exit, once.
func (e *execProcess) finish(st qemu.GuestExecStatus) {
	e.mu.Lock()
	if e.ending || e.st == stateStopped || e.st == stateDeleted {
		e.mu.Unlock()
		return
	}
	e.ending = true
	started := e.st != stateCreated
	e.mu.Unlock()
	e.cancel()
	if st.Truncated {
		log.G(e.ctx).WithFields(log.Fields{"id": e.taskID, "exec_id": e.id}).Warn("exec output truncated by the guest agent")
	}
	if started {
		// An exec never started has no reader waiting for output.
		writeOutputs(context.WithoutCancel(e.ctx), e.stdio, st.Stdout, st.Stderr)
	}
	e.mu.Lock()
	e.exitCode, e.exitedAt = st.ExitCode, time.Now()
	if err := e.transition(stateStopped); err != nil {
		log.G(e.ctx).WithError(err).Error("record exec exit")
	}
	e.mu.Unlock()
	e.onExit(e)
	close(e.exited)
}

// writeOutputs writes stdout and stderr to their fifos, concurrently (a
// reader may drain them in any order), and closes them.
func writeOutputs(ctx context.Context, io stdio, stdout, stderr []byte) {
	ctx, cancel := context.WithTimeout(ctx, outputTimeout)
	defer cancel()
	var wg sync.WaitGroup
	for _, o := range []struct {
		path string
		data []byte
	}{{io.stdout, stdout}, {io.stderr, stderr}} {
		if o.path == "" {
			continue
		}
		wg.Go(func() {
			if err := writeFifo(ctx, o.path, o.data); err != nil {
				log.G(ctx).WithError(err).WithField("fifo", o.path).Warn("exec output dropped")
			}
		})
	}
	wg.Wait()
}

// writeFifo opens a fifo for writing once a reader is there, writes data
// and closes it; ctx bounds the whole.
func writeFifo(ctx context.Context, path string, data []byte) error {
	f, err := fifo.OpenFifo(ctx, path, syscall.O_WRONLY, 0)
	if err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { f.Close() })
	defer stop()
	defer f.Close()
	_, err = f.Write(data)
	return err
}

// kill signals the program in the guest (the agent runs `kill`). SIGKILL
// always ends the exec: if the guest does not report the program's end in
// time, the exec ends without it, with status 137.
func (e *execProcess) kill(ctx context.Context, sig uint32) error {
	e.mu.Lock()
	st, pid := e.st, e.pid
	e.mu.Unlock()
	if st == stateStopped || st == stateDeleted {
		return fmt.Errorf("exec %s: process already finished: %w", e.id, errdefs.ErrNotFound)
	}
	if sig == 0 {
		return nil
	}
	var err error
	if pid > 0 {
		err = e.signalGuest(ctx, syscall.Signal(sig), pid)
	}
	if syscall.Signal(sig) != unix.SIGKILL {
		if pid == 0 {
			// Still waiting for stdin: nothing runs in the guest yet.
			e.finish(qemu.GuestExecStatus{Exited: true, ExitCode: 128 + int(sig)})
		}
		return err
	}
	if err != nil {
		log.G(ctx).WithError(err).WithField("exec_id", e.id).Warn("kill exec in guest")
	}
	go func() {
		t := time.NewTimer(killGrace)
		defer t.Stop()
		select {
		case <-e.exited:
		case <-t.C:
			e.finish(qemu.GuestExecStatus{Exited: true, ExitCode: 128 + int(unix.SIGKILL)})
		}
	}()
	return nil
}

// signalGuest sends sig to the program's guest pid with the guest's kill.
func (e *execProcess) signalGuest(ctx context.Context, sig syscall.Signal, pid int) error {
	ctx, cancel := context.WithTimeout(ctx, agentCallTimeout)
	defer cancel()
	_, err := e.agent.Exec(ctx, qemu.GuestCommand{Path: "kill", Args: []string{"-" + strconv.Itoa(int(sig)), strconv.Itoa(pid)}})
	if err != nil {
		return fmt.Errorf("signal exec %s: %w", e.id, err)
	}
	return nil
}

// vmGone ends the exec when its VM stops: the guest and its programs are
// gone.
func (e *execProcess) vmGone() {
	e.finish(qemu.GuestExecStatus{Exited: true, ExitCode: 128 + int(unix.SIGKILL)})
}

// wait blocks until the exec has stopped or ctx ends.
func (e *execProcess) wait(ctx context.Context) error { return waitClosed(ctx, e.exited) }

// delete forgets a stopped exec.
func (e *execProcess) delete() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.st == stateCreated {
		// Never started: nothing runs, nothing to report.
		e.cancel()
		if err := e.transition(stateStopped); err != nil {
			return err
		}
	}
	return e.transition(stateDeleted)
}

// snapshot returns the exec's state, guest pid and exit.
func (e *execProcess) snapshot() (state, int, int, time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.st, e.pid, e.exitCode, e.exitedAt
}
