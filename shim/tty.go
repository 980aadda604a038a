package shim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/fifo"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"github.com/vmshim/vmshim/launch"
)

const (
	// ttyOpenTimeout bounds how long Start waits for the guest to open a
	// terminal's port: the agent starts ttyRunScript, which looks for it.
	ttyOpenTimeout = 20 * time.Second
	// initialSizeWait is how long a terminal waits for its first window
	// size (containerd's ResizePty follows Start) before its program
	// starts with defaultSize.
	initialSizeWait = time.Second
	// ttyAgentTimeout bounds each guest agent call of a session.
	ttyAgentTimeout = 10 * time.Second
	// ttyPortTimeout bounds adding or removing a session's port.
	ttyPortTimeout = 10 * time.Second
	// ttyOutputTimeout bounds how long the output, once the program has
	// ended, waits for a reader.
	ttyOutputTimeout = 10 * time.Second
	// helperTimeout bounds a resize or a hangup in the guest, status
	// polls included.
	helperTimeout = 10 * time.Second
	// drainGrace is how long output is still read once the port could
	// not be removed (its reads then never end on their own).
	drainGrace = 200 * time.Millisecond
)

// ttyState is where a terminal session is in its life.
type ttyState int

const (
	ttyNew     ttyState = iota // no port yet
	ttyOpening                 // open is adding the port and starting the program
	ttyOpen                    // the program runs on the port, the relays run
	ttyClosed                  // ended; nothing of it is left once close returns
)

// String names the state.
func (s ttyState) String() string {
	return [...]string{"new", "opening", "open", "closed"}[s]
}

// next checks that a session may move from s to to.
func (s ttyState) next(to ttyState) error {
	ok := map[ttyState][]ttyState{
		ttyNew:     {ttyOpening, ttyClosed},
		ttyOpening: {ttyNew, ttyOpen, ttyClosed},
		ttyOpen:    {ttyClosed},
	}
	for _, t := range ok[s] {
		if t == to {
			return nil
		}
	}
	return fmt.Errorf("terminal is %s, cannot become %s: %w", s, to, errdefs.ErrFailedPrecondition)
}

// ttySession is an exec's terminal. The program runs in the guest under
// util-linux's script (see ttyRunScript) on a virtio-serial port of its
// own; the session relays the port to the exec's fifos (stdin to the
// port, the port to stdout: a terminal has no stderr), sets the window
// size, and removes the port when the program has ended.
type ttySession struct {
	guest   launch.TerminalGuest
	stdio   stdio
	cmdline string   // what script runs (ttyCommandLine)
	env     []string // the program's environment (ttyEnv)
	// openTimeout bounds how long open waits for the guest to open the
	// port (ttyOpenTimeout).
	openTimeout time.Duration
	logger      *log.Entry
	ctx         context.Context    // ends with the session: stops input, resizes and a pending open
	cancel      context.CancelFunc // ends ctx
	outCtx      context.Context    // bounds writing the output
	dropOut     context.CancelFunc // ends outCtx
	sized       chan struct{}      // closed at the first resize
	wake        chan struct{}      // holds a token when the size may have changed
	header      chan struct{}      // closed once the first size is written to the port
	outDone     chan struct{}      // closed once the output relay has ended (when open)

	mu          sync.Mutex // guards everything below; never held across a call to the agent or the VM
	st          ttyState
	port        launch.GuestPort // set while open
	pid         int              // script's guest pid, while open
	size        winSize          // the latest size asked for
	resized     bool             // a size has been asked for
	applied     winSize          // the size the pty has
	stdin       io.Closer        // the stdin fifo while it is read
	stdinClosed bool             // CloseIO came, or input ended
	vmGone      bool             // the VM has gone: its ports went with it
}

// newTTYSession prepares the terminal of an exec; ctx ends its work,
// outCtx its output.
func newTTYSession(ctx, outCtx context.Context, logger *log.Entry, args, env []string, io stdio, guest launch.TerminalGuest) (*ttySession, error) {
	cmdline, err := ttyCommandLine(args, env)
	if err != nil {
		return nil, err
	}
	s := &ttySession{
		guest: guest, stdio: io, cmdline: cmdline, env: ttyEnv(env), logger: logger, openTimeout: ttyOpenTimeout,
		sized: make(chan struct{}), wake: make(chan struct{}, 1), header: make(chan struct{}),
	}
	s.ctx, s.cancel = context.WithCancel(ctx)
	s.outCtx, s.dropOut = context.WithCancel(outCtx)
	return s, nil
}

// transition moves the session to state to; callers hold s.mu.
func (s *ttySession) transition(to ttyState) error {
	if err := s.st.next(to); err != nil {
		return err
	}
	s.st = to
	return nil
}

// open adds the session's port, starts the program in the guest and waits
// until the guest has the port open, then starts the relays. It returns
// script's guest pid. Each call has a deadline, and on failure nothing is
// left: not the port, nor the program.
func (s *ttySession) open(ctx context.Context) (int, error) {
	s.mu.Lock()
	err := s.transition(ttyOpening)
	s.mu.Unlock()
	if err != nil {
		return 0, err
	}
	port, pid, err := s.startProgram(ctx)
	s.mu.Lock()
	if err == nil && s.st == ttyClosed {
		err = fmt.Errorf("terminal: the exec ended while starting: %w", errdefs.ErrFailedPrecondition)
	}
	if err != nil {
		if s.st == ttyOpening {
			_ = s.transition(ttyNew)
		}
		s.mu.Unlock()
		if port != nil {
			s.discard(port, pid)
		}
		return 0, err
	}
	_ = s.transition(ttyOpen)
	s.port, s.pid = port, pid
	s.outDone = make(chan struct{})
	s.mu.Unlock()
	go s.output(port.Conn(), s.outDone)
	go s.input(port.Conn())
	go s.resizer(pid)
	return pid, nil
}

// startProgram adds the port and starts the program on it; it returns
// what it made, even on failure, for the caller to discard: the pid only
// while the program may still run (an ended one's pid may be another's
// soon).
func (s *ttySession) startProgram(ctx context.Context) (launch.GuestPort, int, error) {
	actx, cancel := context.WithTimeout(ctx, ttyPortTimeout)
	port, err := s.guest.AddPort(actx)
	cancel()
	if err != nil {
		return nil, 0, fmt.Errorf("terminal: %w", err)
	}
	actx, cancel = context.WithTimeout(ctx, ttyAgentTimeout)
	pid, err := s.guest.Exec(actx, ttyRunCommand(port.Name(), s.cmdline, s.env))
	cancel()
	if err != nil {
		return port, 0, fmt.Errorf("terminal: %w", err)
	}
	if ended, err := s.waitOpen(ctx, port, pid); err != nil {
		if ended {
			pid = 0
		}
		return port, pid, err
	}
	return port, pid, nil
}

// waitOpen waits until the guest has opened the port, within
// openTimeout. Meanwhile it polls the program: ttyRunScript ends early,
// with a message, when the guest lacks what it needs; ended reports that.
func (s *ttySession) waitOpen(ctx context.Context, port launch.GuestPort, pid int) (ended bool, err error) {
	wctx, cancel := context.WithTimeout(ctx, s.openTimeout)
	defer cancel()
	// The polls end at once when the port opens or goes, or the session
	// ends: each cancels them with its reason.
	pctx, stop := context.WithCancelCause(wctx)
	defer stop(nil)
	go func() {
		select {
		case <-port.Opened():
			stop(errPortOpened)
		case <-port.Gone():
			stop(fmt.Errorf("terminal: the vm has gone: %w", errdefs.ErrFailedPrecondition))
		case <-s.ctx.Done():
			stop(fmt.Errorf("terminal: the exec ended while starting: %w", errdefs.ErrFailedPrecondition))
		case <-pctx.Done():
		}
	}()
	err = statusPolls().Until(pctx, false, true, func(pctx context.Context) (bool, error) {
		cctx, ccancel := context.WithTimeout(pctx, ttyAgentTimeout)
		st, err := s.guest.ExecStatus(cctx, pid)
		ccancel()
		if err == nil && st.Exited {
			ended = true
			return true, ttyStartError(st)
		}
		return false, nil
	})
	switch cause := context.Cause(pctx); {
	case ended:
		return true, err
	case errors.Is(cause, errPortOpened):
		return false, nil
	case cause != nil && !errors.Is(cause, context.Canceled) && wctx.Err() == nil:
		return false, cause
	case ctx.Err() != nil:
		return false, fmt.Errorf("terminal: %w", ctx.Err())
	}
	return false, fmt.Errorf("terminal: the guest did not open port %s within %v: %w", port.Name(), s.openTimeout, context.DeadlineExceeded)
}

// errPortOpened ends waitOpen's polls: the guest has the port open.
var errPortOpened = errors.New("port opened")

// ttyStartError says why ttyRunScript ended before it opened the port.
func ttyStartError(st launch.GuestExecStatus) error {
	msg := guestMessage(st.Stderr)
	switch {
	case msg != "":
	case st.ExitCode == ttyNoScript:
		msg = "the guest has no util-linux script, which a terminal needs"
	case st.ExitCode == ttyNoPort:
		msg = "the guest has no virtio-serial port for the terminal"
	default:
		msg = fmt.Sprintf("the guest's terminal program exited with status %d before it opened its port", st.ExitCode)
	}
	return fmt.Errorf("terminal: %s: %w", msg, errdefs.ErrFailedPrecondition)
}

// discard undoes what a failed open made: it stops the program, if any,
// and removes the port, each within its own deadline.
func (s *ttySession) discard(port launch.GuestPort, pid int) {
	ctx := context.WithoutCancel(s.outCtx)
	if pid > 0 {
		if err := s.signal(ctx, pid, unix.SIGKILL); err != nil {
			s.logger.WithError(err).Warn("stop terminal program")
		}
	}
	rctx, cancel := context.WithTimeout(ctx, ttyPortTimeout)
	defer cancel()
	if err := port.Remove(rctx); err != nil {
		s.logger.WithError(err).Warn("remove terminal port")
	}
	_ = port.Conn().Close()
}

// signal sends sig to the program of the session whose script has pid
// (ttySignalScript), within ttyAgentTimeout.
func (s *ttySession) signal(ctx context.Context, pid int, sig syscall.Signal) error {
	ctx, cancel := context.WithTimeout(ctx, ttyAgentTimeout)
	defer cancel()
	if _, err := s.guest.Exec(ctx, ttySignalCommand(pid, sig)); err != nil {
		return fmt.Errorf("signal terminal program: %w", err)
	}
	return nil
}

// resize asks for a window size; the resizer applies the latest one.
func (s *ttySession) resize(w winSize) {
	s.mu.Lock()
	s.size = w
	if !s.resized {
		s.resized = true
		close(s.sized)
	}
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// firstSize waits for the first size, at most initialSizeWait, and
// records it as the pty's.
func (s *ttySession) firstSize() winSize {
	t := time.NewTimer(initialSizeWait)
	defer t.Stop()
	select {
	case <-s.sized:
	case <-t.C:
	case <-s.ctx.Done():
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.applied = defaultSize
	if s.resized {
		s.applied = s.size
	}
	return s.applied
}

// resizer applies each new size to the pty (ttyResizeScript) once the
// first has gone out with the header, until the session ends. Sizes that
// come while one is applied are merged: only the latest is applied.
func (s *ttySession) resizer(pid int) {
	select {
	case <-s.header:
	case <-s.ctx.Done():
		return
	}
	for {
		select {
		case <-s.wake:
		case <-s.ctx.Done():
			return
		}
		s.mu.Lock()
		w, applied := s.size, s.applied
		s.mu.Unlock()
		if w == applied {
			continue
		}
		if err := s.runHelper(ttyResizeCommand(pid, w)); err != nil {
			if s.ctx.Err() == nil {
				s.logger.WithError(err).Warn("resize terminal")
			}
			continue
		}
		s.mu.Lock()
		s.applied = w
		s.mu.Unlock()
	}
}

// runHelper runs a helper program in the guest and waits for its end,
// within helperTimeout; a non-zero exit is an error with its message.
func (s *ttySession) runHelper(c launch.GuestCommand) error {
	ctx, cancel := context.WithTimeout(s.ctx, helperTimeout)
	defer cancel()
	pid, err := s.guest.Exec(ctx, c)
	if err != nil {
		return err
	}
	err = statusPolls().Until(ctx, false, true, func(ctx context.Context) (bool, error) {
		st, err := s.guest.ExecStatus(ctx, pid)
		switch {
		case err != nil:
			s.logger.WithError(err).Debug("terminal helper status")
			return false, nil
		case st.Exited && st.ExitCode != 0:
			return true, fmt.Errorf("guest pid %d exited with status %d: %s", pid, st.ExitCode, guestMessage(st.Stderr))
		}
		return st.Exited, nil
	})
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("guest pid %d: %w", pid, ctx.Err())
	}
	return err
}

// input writes the first window size to the port, then relays stdin to
// it. When stdin ends (the client went away, or CloseIO), the program
// gets SIGHUP, as a terminal that hangs up sends it.
func (s *ttySession) input(conn net.Conn) {
	w := s.firstSize()
	if s.ctx.Err() != nil {
		return
	}
	if _, err := conn.Write(w.header()); err != nil {
		s.logger.WithError(err).Warn("terminal size not sent")
		return
	}
	close(s.header)
	if s.stdio.stdin == "" {
		return
	}
	if f := s.openStdin(); f != nil {
		if _, err := io.Copy(conn, f); err != nil && s.ctx.Err() == nil {
			s.logger.WithError(err).Debug("terminal input")
		}
		s.closeStdin()
	}
	if s.ctx.Err() == nil {
		s.hangup()
	}
}

// openStdin opens the stdin fifo for the relay, or returns nil if stdin
// was closed or the session ended meanwhile.
func (s *ttySession) openStdin() io.ReadCloser {
	f, err := fifo.OpenFifo(s.ctx, s.stdio.stdin, syscall.O_RDONLY, 0)
	if err != nil {
		if s.ctx.Err() == nil {
			s.logger.WithError(err).Warn("open terminal stdin")
		}
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stdinClosed || s.st == ttyClosed {
		f.Close()
		return nil
	}
	s.stdin = f
	return f
}

// closeStdin stops relaying stdin (CloseIO); input then hangs up.
func (s *ttySession) closeStdin() {
	s.mu.Lock()
	f := s.stdin
	s.stdin, s.stdinClosed = nil, true
	s.mu.Unlock()
	if f != nil {
		_ = f.Close()
	}
}

// hangup sends SIGHUP to the program.
func (s *ttySession) hangup() {
	s.mu.Lock()
	pid := s.pid
	s.mu.Unlock()
	if err := s.signal(s.ctx, pid, unix.SIGHUP); err != nil && s.ctx.Err() == nil {
		s.logger.WithError(err).Warn("hang up terminal")
	}
}

// output relays the port to the stdout fifo until the port ends. If the
// fifo cannot be written, the port is still read to its end, so the
// guest never stalls on it.
func (s *ttySession) output(conn net.Conn, done chan<- struct{}) {
	defer close(done)
	var w io.Writer
	if s.stdio.stdout != "" {
		f, err := fifo.OpenFifo(s.outCtx, s.stdio.stdout, syscall.O_WRONLY, 0)
		if err != nil {
			s.logger.WithError(err).Warn("terminal output dropped")
		} else {
			stop := context.AfterFunc(s.outCtx, func() { f.Close() })
			defer stop()
			defer f.Close()
			w = f
		}
	}
	buf := make([]byte, 32<<10)
	for {
		n, err := conn.Read(buf)
		if n > 0 && w != nil {
			if _, werr := w.Write(buf[:n]); werr != nil {
				s.logger.WithError(werr).Debug("terminal output dropped")
				w = nil
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				s.logger.WithError(err).Debug("terminal output")
			}
			return
		}
	}
}

// markVMGone records that the VM has gone: close then asks it nothing.
func (s *ttySession) markVMGone() {
	s.mu.Lock()
	s.vmGone = true
	s.mu.Unlock()
}

// close ends the session once its program has ended, the exec was
// killed or the VM has gone: input and resizes stop, the port is removed
// (the VM then closes its end, so the output is read to its end), and the
// output fifo is closed, within ttyOutputTimeout or until dropOut. Only the
// first call acts.
func (s *ttySession) close() {
	s.mu.Lock()
	if s.st == ttyClosed {
		s.mu.Unlock()
		return
	}
	_ = s.transition(ttyClosed)
	port, gone, outDone := s.port, s.vmGone, s.outDone
	s.port = nil
	s.mu.Unlock()
	s.cancel()
	s.closeStdin()
	if port == nil {
		return
	}
	conn := port.Conn()
	if !gone {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(s.outCtx), ttyPortTimeout)
		if err := port.Remove(ctx); err != nil {
			s.logger.WithError(err).Warn("remove terminal port")
			_ = conn.SetReadDeadline(time.Now().Add(drainGrace))
		}
		cancel()
	}
	t := time.NewTimer(ttyOutputTimeout)
	defer t.Stop()
	select {
	case <-outDone:
	case <-t.C:
		s.logger.Warn("terminal output not drained")
		s.dropOut()
		_ = conn.Close()
		<-outDone
	}
	_ = conn.Close()
	if s.stdio.stderr != "" {
		writeFifos(s.outCtx, stdio{stderr: s.stdio.stderr}, nil, nil)
	}
}

// state returns the session's state.
func (s *ttySession) state() ttyState {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.st
}
