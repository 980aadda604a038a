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

	eventstypes "github.com/containerd/containerd/api/events"
	"github.com/containerd/containerd/v2/pkg/protobuf"
	"github.com/containerd/errdefs"
	"github.com/containerd/fifo"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/vmshim/vmshim/launch"
)

const (
	// maxExecInput bounds the stdin an exec may pass to the guest: the
	// agent takes it whole, in one message, before the program starts.
	maxExecInput = 1 << 20
	// stdinWait is how long an exec waits for a writer of its stdin
	// fifo: containerd's clients open theirs before the exec starts,
	// and one that has not come by then never will (see readInput).
	stdinWait = 2 * time.Second
	// stdinRetry is how often, after CloseIO or stdinWait, the shim
	// tries to open a writer of an exec's stdin fifo until its own read
	// end is open.
	stdinRetry = 10 * time.Millisecond
	// agentCallTimeout bounds each guest agent call.
	agentCallTimeout = 10 * time.Second
	// killGrace is how long SIGKILL waits for the guest to report the
	// program's end before the exec is ended without it.
	killGrace = 2 * time.Second
	// statusRetries is how many failed status polls in a row end an exec.
	statusRetries = 5
)

// execProcess is a program run in the guest through its agent. Without a
// terminal, the agent returns its output when it ends, so output reaches
// the exec's stdout and stderr at exit; with one (tty), the program runs
// on a pty of its own and its terminal session relays it as it runs (see
// ttySession). Its events are queued by transition: TaskExecStarted when
// it starts, TaskExit when a started exec stops.
type execProcess struct {
	id, taskID string
	args, env  []string
	stdio      stdio
	agent      launch.GuestAgent
	tty        *ttySession // nil without a terminal
	pub        publish
	ctx        context.Context
	cancel     context.CancelFunc // stops collecting stdin and polling
	outCtx     context.Context    // bounds writing the output; cancelled by dropOutput
	dropOutput context.CancelFunc

	mu       sync.Mutex // guards st, pid, exitCode, exitedAt, starting and ending; never held across a call to the agent
	st       state      // created, running, stopped or deleted
	pid      int        // guest pid once started
	exitCode int
	exitedAt time.Time
	starting bool          // start is calling the agent
	ending   bool          // finish has claimed the exit
	exited   chan struct{} // closed once stopped and, if it started, its exit queued

	stdinEnd     chan struct{} // closed by CloseIO: containerd's client has no more input
	stdinEndOnce sync.Once
}

// newExec validates an exec's process spec (JSON, as containerd sends it).
func newExec(ctx context.Context, taskID, id string, spec []byte, io stdio, agent launch.GuestAgent, pub publish) (*execProcess, error) {
	var p specs.Process
	if err := json.Unmarshal(spec, &p); err != nil {
		return nil, fmt.Errorf("exec %s: process spec: %w", id, errdefs.ErrInvalidArgument)
	}
	if len(p.Args) == 0 || p.Args[0] == "" {
		return nil, fmt.Errorf("exec %s: no command given: %w", id, errdefs.ErrInvalidArgument)
	}
	if agent == nil {
		return nil, fmt.Errorf("exec %s: container %s runs no guest to exec in: %w", id, taskID, errdefs.ErrFailedPrecondition)
	}
	e := &execProcess{
		id: id, taskID: taskID, args: p.Args, env: p.Env, stdio: io, agent: agent, pub: pub,
		exited: make(chan struct{}), stdinEnd: make(chan struct{}),
	}
	e.ctx, e.cancel = context.WithCancel(ctx)
	e.outCtx, e.dropOutput = context.WithCancel(context.WithoutCancel(ctx))
	if p.Terminal || io.terminal {
		if err := e.withTerminal(); err != nil {
			e.cancel()
			e.dropOutput()
			return nil, err
		}
	}
	return e, nil
}

// withTerminal gives the exec a terminal session, if its guest can.
func (e *execProcess) withTerminal() error {
	guest, ok := e.agent.(launch.TerminalGuest)
	if !ok {
		return fmt.Errorf("exec %s: a terminal (tty) is not supported by this guest; exec without -t: %w", e.id, errdefs.ErrNotImplemented)
	}
	logger := log.G(e.ctx).WithFields(log.Fields{"id": e.taskID, "exec_id": e.id})
	tty, err := newTTYSession(e.ctx, e.outCtx, logger, e.args, e.env, e.stdio, guest)
	if err != nil {
		return fmt.Errorf("exec %s: %w", e.id, err)
	}
	e.tty = tty
	return nil
}

// start runs the program. Without a terminal but with stdin, the program
// starts once stdin ends (the agent takes all input up front), so start
// returns before that with pid 0; with a terminal, start returns once the
// guest has the terminal's port open. The agent is called without e.mu
// held and with a deadline.
func (e *execProcess) start(ctx context.Context) (int, error) {
	e.mu.Lock()
	if e.st != stateCreated || e.starting || e.ending {
		defer e.mu.Unlock()
		return 0, fmt.Errorf("exec %s is %s, not created: %w", e.id, e.st, errdefs.ErrFailedPrecondition)
	}
	e.starting = true
	e.mu.Unlock()

	pid, err := e.begin(ctx)
	if err != nil {
		e.mu.Lock()
		e.starting = false
		e.mu.Unlock()
		return 0, fmt.Errorf("exec %s: %w", e.id, err)
	}
	if err := e.started(pid); err != nil {
		// Ended while starting (killed, or its VM stopped): its program
		// must not outlive it.
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

// begin asks the agent to run the program, or, when the program waits for
// stdin, whether it answers.
func (e *execProcess) begin(ctx context.Context) (int, error) {
	if e.tty != nil {
		return e.tty.open(ctx)
	}
	ctx, cancel := context.WithTimeout(ctx, agentCallTimeout)
	defer cancel()
	if e.stdio.stdin != "" {
		return 0, e.agent.Ping(ctx)
	}
	return e.agent.Exec(ctx, e.command(nil))
}

// started records that the program runs (pid 0: once stdin ends), which
// queues TaskExecStarted, unless the exec has ended meanwhile.
func (e *execProcess) started(pid int) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.starting = false
	if e.ending {
		return fmt.Errorf("exec %s ended while starting: %w", e.id, errdefs.ErrFailedPrecondition)
	}
	e.pid = pid
	return e.transition(stateRunning)
}

// transition moves the exec to state to and queues the event that reports
// the move, if any; callers hold e.mu. An exec that never started ends
// without an event, as no TaskExecStarted announced it.
func (e *execProcess) transition(to state) error {
	if err := e.st.next(to); err != nil {
		return fmt.Errorf("exec %s: %w", e.id, err)
	}
	from := e.st
	e.st = to
	switch {
	case from == stateCreated && to == stateRunning:
		e.pub(&eventstypes.TaskExecStarted{ContainerID: e.taskID, ExecID: e.id, Pid: uint32(e.pid)})
	case from == stateRunning && to == stateStopped:
		e.pub(&eventstypes.TaskExit{
			ContainerID: e.taskID, ID: e.id, Pid: uint32(e.pid),
			ExitStatus: uint32(e.exitCode), ExitedAt: protobuf.ToTimestamp(e.exitedAt),
		})
	}
	return nil
}

// command is the agent's command for the program, with input as stdin.
func (e *execProcess) command(input []byte) launch.GuestCommand {
	return launch.GuestCommand{Path: e.args[0], Args: e.args[1:], Env: e.env, Input: input}
}

// runWithInput reads stdin to its end, then runs the program with it.
func (e *execProcess) runWithInput() {
	input, err := e.readInput()
	if err != nil {
		log.G(e.ctx).WithError(err).WithFields(log.Fields{"id": e.taskID, "exec_id": e.id}).Warn("exec stdin")
		e.finish(launch.GuestExecStatus{Exited: true, ExitCode: 255, Stderr: []byte(err.Error() + "\n")})
		return
	}
	cctx, cancel := context.WithTimeout(e.ctx, agentCallTimeout)
	pid, err := e.agent.Exec(cctx, e.command(input))
	cancel()
	if err != nil {
		e.finish(launch.GuestExecStatus{Exited: true, ExitCode: 255, Stderr: []byte(err.Error() + "\n")})
		return
	}
	e.mu.Lock()
	ended := e.ending
	if !ended {
		e.pid = pid
	}
	e.mu.Unlock()
	if ended {
		// Killed while the agent started it.
		if err := e.signalGuest(context.WithoutCancel(e.ctx), unix.SIGKILL, pid); err != nil {
			log.G(e.ctx).WithError(err).WithFields(log.Fields{"id": e.taskID, "exec_id": e.id}).Warn("kill exec in guest")
		}
		return
	}
	e.poll(pid)
}

// readInput reads the stdin fifo until it ends, at most maxExecInput.
// A client with no input at all may close its end of the fifo before it
// was ever opened, and no writer ever comes: ctr's stdin from /dev/null
// does, before it can send CloseIO. Once CloseIO says the input is
// over, or no writer has come within stdinWait, the shim opens and
// closes a writer itself, so that the open returns and the read ends
// with what a writer wrote, if one did.
func (e *execProcess) readInput() ([]byte, error) {
	opened := make(chan struct{})
	go e.unblockStdin(opened)
	f, err := fifo.OpenFifo(e.ctx, e.stdio.stdin, syscall.O_RDONLY, 0)
	close(opened)
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

// unblockStdin waits for CloseIO or stdinWait, then opens and closes a
// writer of the stdin fifo, every stdinRetry until the reader has opened
// it (a writer that does not block needs a reader), or the exec ends.
func (e *execProcess) unblockStdin(opened <-chan struct{}) {
	wait := time.NewTimer(stdinWait)
	defer wait.Stop()
	select {
	case <-e.stdinEnd:
	case <-wait.C:
	case <-opened:
		return
	case <-e.ctx.Done():
		return
	}
	t := time.NewTicker(stdinRetry)
	defer t.Stop()
	for {
		fd, err := unix.Open(e.stdio.stdin, unix.O_WRONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err == nil {
			unix.Close(fd)
			return
		}
		select {
		case <-opened:
			return
		case <-e.ctx.Done():
			return
		case <-t.C:
		}
	}
}

// poll asks the agent about the program until it ends.
func (e *execProcess) poll(pid int) {
	logger := log.G(e.ctx).WithFields(log.Fields{"id": e.taskID, "exec_id": e.id, "pid": pid})
	failures := 0
	_ = statusPolls().Until(e.ctx, false, true, func(ctx context.Context) (bool, error) {
		cctx, cancel := context.WithTimeout(ctx, agentCallTimeout)
		st, err := e.agent.ExecStatus(cctx, pid)
		cancel()
		switch {
		case err != nil && ctx.Err() != nil:
			return true, nil
		case err != nil:
			failures++
			logger.WithError(err).Debug("exec status")
			if failures >= statusRetries {
				logger.WithError(err).Warn("guest agent lost the exec; ending it")
				e.finish(launch.GuestExecStatus{Exited: true, ExitCode: 255})
				return true, nil
			}
			return false, nil
		case st.Exited:
			e.finish(st)
			return true, nil
		}
		failures = 0
		return false, nil
	})
}

// finish writes the program's output, or ends its terminal session, and
// records its exit, once. The output is written only for an exec that
// started, within fifoTimeout or until dropOutput.
func (e *execProcess) finish(st launch.GuestExecStatus) {
	started, ok := e.claim()
	if !ok {
		return
	}
	e.cancel()
	if st.Truncated {
		log.G(e.ctx).WithFields(log.Fields{"id": e.taskID, "exec_id": e.id}).Warn("exec output truncated by the guest agent")
	}
	switch {
	case e.tty != nil:
		e.tty.close()
	case started:
		writeFifos(e.outCtx, e.stdio, st.Stdout, st.Stderr)
	}
	e.dropOutput()
	e.mu.Lock()
	e.exitCode, e.exitedAt = st.ExitCode, time.Now()
	if err := e.transition(stateStopped); err != nil {
		log.G(e.ctx).WithError(err).Error("record exec exit")
	}
	e.mu.Unlock()
	close(e.exited)
}

// claim makes the caller the one to record the exit, unless another has
// or it is recorded; started reports whether the exec got to run.
func (e *execProcess) claim() (started, ok bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ending || e.st == stateStopped || e.st == stateDeleted {
		return false, false
	}
	e.ending = true
	return e.st != stateCreated, true
}

// kill signals the program in the guest (the agent runs `kill`), within
// agentCallTimeout. SIGKILL returns at once and always ends the exec: if
// the guest does not report the program's end within killGrace, the exec
// ends without it, with status 137.
func (e *execProcess) kill(ctx context.Context, sig uint32) error {
	e.mu.Lock()
	st, pid := e.st, e.pid
	e.mu.Unlock()
	if st == stateStopped || st == stateDeleted {
		return fmt.Errorf("exec %s: process already finished: %w", e.id, errdefs.ErrNotFound)
	}
	switch {
	case sig == 0:
		return nil
	case syscall.Signal(sig) == unix.SIGKILL:
		e.killNow(ctx, pid)
		return nil
	case pid == 0:
		// Not started, or waiting for stdin: nothing runs in the guest yet.
		go e.finish(launch.GuestExecStatus{Exited: true, ExitCode: 128 + int(sig)})
		return nil
	}
	return e.signalGuest(ctx, syscall.Signal(sig), pid)
}

// killNow sends SIGKILL to the program in the background and ends the exec
// once the guest reports the program's end or killGrace has passed.
func (e *execProcess) killNow(ctx context.Context, pid int) {
	killed := launch.GuestExecStatus{Exited: true, ExitCode: 128 + int(unix.SIGKILL)}
	if pid == 0 {
		go e.finish(killed)
		return
	}
	logger := log.G(ctx).WithFields(log.Fields{"id": e.taskID, "exec_id": e.id, "pid": pid})
	go func() {
		if err := e.signalGuest(context.WithoutCancel(ctx), unix.SIGKILL, pid); err != nil {
			logger.WithError(err).Warn("kill exec in guest")
		}
	}()
	go func() {
		t := time.NewTimer(killGrace)
		defer t.Stop()
		select {
		case <-e.exited:
		case <-t.C:
			e.finish(killed)
		}
	}()
}

// signalGuest sends sig to the program's guest pid with the guest's kill;
// for a terminal, pid is script's, and its child, the program, gets sig.
func (e *execProcess) signalGuest(ctx context.Context, sig syscall.Signal, pid int) error {
	if e.tty != nil {
		return e.tty.signal(ctx, pid, sig)
	}
	ctx, cancel := context.WithTimeout(ctx, agentCallTimeout)
	defer cancel()
	_, err := e.agent.Exec(ctx, launch.GuestCommand{Path: "kill", Args: []string{"-" + strconv.Itoa(int(sig)), strconv.Itoa(pid)}})
	if err != nil {
		return fmt.Errorf("signal exec %s: %w", e.id, err)
	}
	return nil
}

// vmGone ends the exec when its VM stops: the guest and its programs are
// gone.
func (e *execProcess) vmGone() {
	if e.tty != nil {
		e.tty.markVMGone()
	}
	e.finish(launch.GuestExecStatus{Exited: true, ExitCode: 128 + int(unix.SIGKILL)})
}

// endExecs ends the execs of a VM that has stopped and returns once each
// has stopped and, if it started, queued its exit: the task's exit must
// be the last published. An exec still writing its output gets
// flushTimeout, then its output is cut short.
func endExecs(ctx context.Context, execs []*execProcess) {
	if len(execs) == 0 {
		return
	}
	all := make(chan struct{})
	go func() {
		for _, e := range execs {
			<-e.exited
		}
		close(all)
	}()
	for _, e := range execs {
		go e.vmGone()
	}
	t := time.NewTimer(flushTimeout)
	defer t.Stop()
	select {
	case <-all:
		return
	case <-t.C:
	}
	log.G(ctx).WithField("id", execs[0].taskID).Warn("exec output not drained before the vm's exit")
	for _, e := range execs {
		e.dropOutput()
	}
	<-all
}

// wait blocks until the exec has stopped or ctx ends.
func (e *execProcess) wait(ctx context.Context) error { return waitClosed(ctx, e.exited) }

// delete forgets a stopped exec.
func (e *execProcess) delete() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.st == stateCreated && !e.starting && !e.ending {
		// Never started: nothing runs, nothing to report.
		e.ending = true
		e.cancel()
		if err := e.transition(stateStopped); err != nil {
			return err
		}
		close(e.exited)
	}
	return e.transition(stateDeleted)
}

// resize sets the window size of the exec's terminal, its width and
// height clamped to maxTermSize; an exec without a terminal has no window
// and ignores it.
func (e *execProcess) resize(width, height uint32) error {
	if e.tty == nil {
		return nil
	}
	e.mu.Lock()
	st := e.st
	e.mu.Unlock()
	if st == stateStopped || st == stateDeleted {
		return fmt.Errorf("exec %s: process already finished: %w", e.id, errdefs.ErrNotFound)
	}
	e.tty.resize(clampSize(width, height))
	return nil
}

// closeStdin ends the input of the exec's terminal, which hangs up; an
// exec without a terminal reads stdin until its fifo's writer closes it,
// and, when no writer has opened it, no further (readInput).
func (e *execProcess) closeStdin() {
	if e.tty != nil {
		e.tty.closeStdin()
		return
	}
	e.stdinEndOnce.Do(func() { close(e.stdinEnd) })
}

// snapshot returns the exec's state, guest pid and exit.
func (e *execProcess) snapshot() (state, int, int, time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.st, e.pid, e.exitCode, e.exitedAt
}
