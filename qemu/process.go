package qemu

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
)

// dialRetry is the pause between attempts to reach QMP while QEMU starts.
const dialRetry = 20 * time.Millisecond

// outputDrain bounds how long reaping waits for QEMU's output to be copied
// after it exited (a leaked copy of its stderr must not stall Done).
const outputDrain = 5 * time.Second

// stderrTailSize is how much of QEMU's latest output is kept for errors.
const stderrTailSize = 4096

// powerdownAck bounds how long Powerdown waits for QEMU to answer; QEMU
// answers system_powerdown at once unless it is stopped or hung.
const powerdownAck = 2 * time.Second

// LaunchConfig is what Launch needs to start one VM.
type LaunchConfig struct {
	Binary string     // qemu-system-x86_64 path
	Spec   Spec       // the VM; Spec.QMPSocket is where Launch connects
	Files  []*os.File // from FDSet.Files(); the caller keeps and closes its copies
	Stderr io.Writer  // QEMU's own stderr/stdout; nil discards it
	Dir    string     // working dir
	// Start starts the process (for example inside a cgroup); nil means
	// cmd.Start. If it fails after the process started, the process is
	// killed and reaped.
	Start func(cmd *exec.Cmd) error
	// Span, when set, is told when each phase of the launch that began at
	// begin is over: "qemu exec" (the process started), "qmp greeting"
	// (its QMP monitor answered), "qmp setup" (the first queries made).
	Span func(phase string, begin time.Time)
	// GuestReset, when set, is called from QMP's event reader for each
	// reset the guest itself caused (QMP RESET with guest true): a
	// reboot, or a triple fault, which QEMU turns into a reset. It must
	// not block.
	GuestReset func(reason string)
}

// States of the guest's end of the agent port, as VM.agentPort holds them.
const (
	agentPortUnknown int32 = iota // neither an event nor a query has told yet
	agentPortClosed
	agentPortOpen
)

// VM is a running QEMU process and its QMP connection.
type VM struct {
	cmd   *exec.Cmd
	qmp   *Client
	agent *Agent // nil without an agent port; closed by the waiter
	done  chan struct{}

	// agentPort is one of the agentPort* states; events store it, the
	// initial query only replaces agentPortUnknown.
	agentPort atomic.Int32

	io ioState // whether a disk error holds the VM paused

	ports portTable // the serial ports AddSerialPort added

	guestReset func(reason string) // LaunchConfig.GuestReset; nil ignores resets

	vncClients atomic.Int64 // names the fds AddVNCClient passes

	// Written once by the waiter before done is closed; read after done.
	exitCode int
	exitAt   time.Time
}

// Launch starts QEMU for cfg.Spec and returns once QMP is ready. QEMU runs
// in its own process group and without a parent-death signal, so it
// outlives its parent's restarts. On failure QEMU is killed and reaped, the
// QMP socket removed, and the error carries QEMU's last output.
func Launch(ctx context.Context, cfg LaunchConfig) (_ *VM, retErr error) {
	args, err := BuildArgs(cfg.Spec)
	if err != nil {
		return nil, err
	}
	if cfg.Binary == "" {
		return nil, fmt.Errorf("invalid qemu binary: must not be empty: %w", errdefs.ErrInvalidArgument)
	}
	tail := &tailWriter{max: stderrTailSize}
	out := io.Writer(tail)
	if cfg.Stderr != nil {
		out = io.MultiWriter(cfg.Stderr, tail)
	}
	cmd := exec.Command(cfg.Binary, args...)
	cmd.Dir = cfg.Dir
	cmd.Stdout = out
	cmd.Stderr = out
	cmd.WaitDelay = outputDrain
	cmd.ExtraFiles = cfg.Files
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	start := cfg.Start
	if start == nil {
		start = (*exec.Cmd).Start
	}
	phase := func(string, time.Time) {}
	if cfg.Span != nil {
		phase = cfg.Span
	}
	begin := time.Now()
	if err = start(cmd); err != nil {
		if cmd.Process != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		return nil, fmt.Errorf("start qemu %s: %w", cfg.Binary, err)
	}
	v := &VM{cmd: cmd, done: make(chan struct{}), guestReset: cfg.GuestReset}
	if cfg.Spec.AgentSocket != "" {
		v.agent = NewAgent(cfg.Spec.AgentSocket, v.agentOpen)
	}
	go v.wait(cfg.Spec.QMPSocket, cfg.Spec.AgentSocket)
	phase("qemu exec", begin)
	begin = time.Now()
	logger := log.G(ctx).WithFields(log.Fields{"pid": v.Pid(), "id": cfg.Spec.Name})
	logger.WithField("args", strings.Join(args, " ")).Debug("qemu started")
	defer func() {
		if retErr != nil {
			_ = v.Kill()
			<-v.done
		}
	}()

	query, err := v.connect(ctx, cfg.Spec.QMPSocket, logger)
	if err != nil {
		select {
		case <-v.done:
			code, _ := v.ExitStatus()
			return nil, fmt.Errorf("qemu exited with status %d before qmp was ready: %s: %w",
				code, tail.lastLines(3), errdefs.ErrFailedPrecondition)
		default:
		}
		return nil, fmt.Errorf("connect to qemu pid %d: %w (qemu output: %s)", v.Pid(), err, tail.lastLines(3))
	}
	logger.Debug("qemu qmp ready")
	phase("qmp greeting", begin)
	begin = time.Now()
	if query != nil {
		if err := v.agentPortState(ctx, query); err != nil {
			// Events still tell when the guest opens the port.
			logger.WithError(err).Warn("cannot query guest agent port state")
		}
	}
	phase("qmp setup", begin)
	return v, nil
}

// chardevInfo is one entry of the reply to query-chardev.
type chardevInfo struct {
	Label        string `json:"label"`
	FrontendOpen bool   `json:"frontend-open"`
}

// agentPortState sets the agent port's state from the reply to
// query-chardev, unless an event has already told. After a failed query
// the port counts as closed until an event says otherwise.
func (v *VM) agentPortState(ctx context.Context, query *Pending) error {
	var devs []chardevInfo
	if err := query.Wait(ctx, &devs); err != nil {
		return err
	}
	for _, d := range devs {
		if d.Label == AgentChardev {
			state := agentPortClosed
			if d.FrontendOpen {
				state = agentPortOpen
			}
			v.agentPort.CompareAndSwap(agentPortUnknown, state)
		}
	}
	return nil
}

// follow applies QMP events until the channel is closed, then marks the
// agent port closed and the added serial ports gone: the state of the
// agent's and the added ports from VSERPORT_CHANGE and DEVICE_DELETED, the
// guest faults QEMU reports, logged at error level, and whether a disk
// error holds the VM paused.
func (v *VM) follow(logger *log.Entry, events <-chan Event) {
	for ev := range events {
		switch ev.Name {
		case "VSERPORT_CHANGE":
			v.agentPortEvent(ev)
			v.ports.event(ev)
		case "DEVICE_DELETED":
			v.ports.event(ev)
		case "GUEST_PANICKED":
			logFault(logger, ev)
		case "BLOCK_IO_ERROR":
			logFault(logger, ev)
			v.io.ioEvent(ev)
		case "RESUME":
			v.io.ioEvent(ev)
		case "RESET":
			v.resetEvent(ev)
		}
	}
	v.agentPort.Store(agentPortClosed)
	v.ports.end()
}

// resetEvent tells guestReset of a RESET event the guest caused; resets
// asked through QMP (system_reset, a loaded snapshot) are not the guest's.
func (v *VM) resetEvent(ev Event) {
	var data struct {
		Guest  bool   `json:"guest"`
		Reason string `json:"reason"`
	}
	if v.guestReset == nil || json.Unmarshal(ev.Data, &data) != nil || !data.Guest {
		return
	}
	v.guestReset(data.Reason)
}

// agentPortEvent records the agent port's state from a VSERPORT_CHANGE
// event naming it and ignores every other event.
func (v *VM) agentPortEvent(ev Event) {
	if ev.Name != "VSERPORT_CHANGE" {
		return
	}
	var data struct {
		ID   string `json:"id"`
		Open bool   `json:"open"`
	}
	if err := json.Unmarshal(ev.Data, &data); err != nil || data.ID != AgentPortID {
		return
	}
	if data.Open {
		v.agentPort.Store(agentPortOpen)
	} else {
		v.agentPort.Store(agentPortClosed)
	}
}

// faultEvent is the data of the QMP events that report guest faults:
// GUEST_PANICKED (action, info) and BLOCK_IO_ERROR (device or node-name,
// operation, action, nospace, reason).
type faultEvent struct {
	Action    string          `json:"action"`
	Info      json.RawMessage `json:"info"`
	Device    string          `json:"device"`
	NodeName  string          `json:"node-name"`
	Operation string          `json:"operation"`
	NoSpace   bool            `json:"nospace"`
	Reason    string          `json:"reason"`
}

// logFault logs a guest fault QEMU reported at error level: a guest
// panic (QEMU then exits non-zero, -action panic=exit-failure), or a disk
// request that failed on the host, such as a write to an overlay whose
// filesystem is full (QEMU then pauses the VM: action "stop").
func logFault(logger *log.Entry, ev Event) {
	var d faultEvent
	if err := json.Unmarshal(ev.Data, &d); err != nil && len(ev.Data) > 0 {
		logger = logger.WithField("data", string(ev.Data))
	}
	switch ev.Name {
	case "GUEST_PANICKED":
		if len(d.Info) > 0 && string(d.Info) != "null" {
			logger = logger.WithField("info", string(d.Info))
		}
		logger.WithField("action", d.Action).Error("guest panicked")
	case "BLOCK_IO_ERROR":
		node := d.NodeName
		if node == "" {
			node = d.Device
		}
		logger = logger.WithFields(log.Fields{
			"node": node, "operation": d.Operation, "action": d.Action, "nospace": d.NoSpace, "reason": d.Reason,
		})
		if d.Action == "stop" {
			logger.Error("guest disk i/o error, vm paused")
			return
		}
		logger.Error("guest disk i/o error")
	}
}

// agentOpen reports whether the guest has the agent port open.
func (v *VM) agentOpen() bool { return v.agentPort.Load() == agentPortOpen }

// Agent returns the guest agent client, or nil when the VM has no agent port.
func (v *VM) Agent() *Agent { return v.agent }

// connect dials QMP until it answers, QEMU exits or ctx ends, and
// follows its events (see follow). It sends qmp_capabilities and, with
// an agent port, query-chardev at once, not waiting for QEMU's greeting,
// and waits for the first: the handshake and the query take one round
// trip, and events are followed before the query is answered. It returns
// the query, whose reply is yet to be taken.
func (v *VM) connect(ctx context.Context, socket string, logger *log.Entry) (*Pending, error) {
	var lastErr error
	for {
		query, err := v.handshake(ctx, socket, logger)
		if err == nil {
			return query, nil
		}
		lastErr = err
		t := time.NewTimer(dialRetry)
		select {
		case <-t.C:
		case <-v.done:
			t.Stop()
			return nil, lastErr
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("%w (last attempt: %v)", ctx.Err(), lastErr)
		}
	}
}

// handshake is one attempt of connect.
func (v *VM) handshake(ctx context.Context, socket string, logger *log.Entry) (*Pending, error) {
	conn, err := dialSocket(ctx, socket)
	if err != nil {
		return nil, err
	}
	query, err := v.open(ctx, conn, logger)
	if err != nil {
		return nil, fmt.Errorf("qmp %s: %w", socket, err)
	}
	return query, nil
}

// open takes over conn for v.qmp: see connect.
func (v *VM) open(ctx context.Context, conn net.Conn, logger *log.Entry) (*Pending, error) {
	c := Open(ctx, conn)
	events, _ := c.Events() // ends with the connection
	caps, err := c.Send(ctx, "qmp_capabilities", nil)
	var query *Pending
	if err == nil && v.agent != nil {
		query, err = c.Send(ctx, "query-chardev", nil)
	}
	if err == nil {
		err = caps.Wait(ctx, nil)
	}
	if err != nil {
		c.Close() // which ends events too
		return nil, err
	}
	v.qmp = c
	go v.follow(logger, events)
	return query, nil
}

// wait reaps QEMU, records its exit status, removes its listening sockets
// and closes the guest agent client. The QMP client closes itself when
// QEMU's end of the connection goes away.
func (v *VM) wait(sockets ...string) {
	_ = v.cmd.Wait()
	v.exitAt = time.Now()
	v.exitCode = exitCode(v.cmd.ProcessState)
	// QEMU does not remove its listening sockets when it is killed.
	for _, s := range sockets {
		if s != "" {
			_ = os.Remove(s)
		}
	}
	if v.agent != nil {
		_ = v.agent.Close()
	}
	close(v.done)
}

// exitCode maps a process state to a shell-style status: the exit code, or
// 128+signal when killed by a signal.
func exitCode(ps *os.ProcessState) int {
	if ps == nil {
		return -1
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

// Pid returns QEMU's process id.
func (v *VM) Pid() int { return v.cmd.Process.Pid }

// QMP returns the VM's QMP client.
func (v *VM) QMP() *Client { return v.qmp }

// Start runs the vCPUs of a VM launched paused.
func (v *VM) Start(ctx context.Context) error {
	if err := v.qmp.Cont(ctx); err != nil {
		return fmt.Errorf("start vm pid %d: %w", v.Pid(), err)
	}
	return nil
}

// Powerdown presses the guest's ACPI power button. It waits for QEMU's
// acknowledgement for powerdownAck at most: a QEMU that has the request
// but does not answer (stopped with SIGSTOP, or hung) keeps it queued, as
// a stopped process keeps a pending signal, and the caller's deadline,
// then SIGKILL, decides what happens next.
func (v *VM) Powerdown(ctx context.Context) error {
	ackCtx, cancel := context.WithTimeout(ctx, powerdownAck)
	defer cancel()
	err := v.qmp.SystemPowerdown(ackCtx)
	if errors.Is(err, ErrNoReply) && ctx.Err() == nil {
		log.G(ctx).WithField("pid", v.Pid()).Warnf("qemu has not acknowledged the power button within %v; the request stays queued", powerdownAck)
		return nil
	}
	if err != nil {
		return fmt.Errorf("power down vm pid %d: %w", v.Pid(), err)
	}
	return nil
}

// Pause stops the vCPUs.
func (v *VM) Pause(ctx context.Context) error {
	if err := v.qmp.Stop(ctx); err != nil {
		return fmt.Errorf("pause vm pid %d: %w", v.Pid(), err)
	}
	return nil
}

// Resume runs the vCPUs again after Pause.
func (v *VM) Resume(ctx context.Context) error {
	if err := v.qmp.Cont(ctx); err != nil {
		return fmt.Errorf("resume vm pid %d: %w", v.Pid(), err)
	}
	return nil
}

// Kill sends SIGKILL to QEMU; it is a no-op once QEMU has been reaped.
func (v *VM) Kill() error {
	err := v.cmd.Process.Signal(syscall.SIGKILL)
	if err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("kill qemu pid %d: %w", v.Pid(), err)
	}
	return nil
}

// Done returns a channel closed once QEMU has exited and been reaped.
func (v *VM) Done() <-chan struct{} { return v.done }

// ExitStatus returns QEMU's exit code (128+signal when killed) and when it
// was reaped; it is valid once Done is closed and (-1, zero time) before.
func (v *VM) ExitStatus() (code int, at time.Time) {
	select {
	case <-v.done:
		return v.exitCode, v.exitAt
	default:
		return -1, time.Time{}
	}
}

// tailWriter keeps the last max bytes written to it.
type tailWriter struct {
	max int

	mu  sync.Mutex
	buf []byte // guarded by mu
}

// Write keeps the tail of p; it never fails.
func (t *tailWriter) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(p), nil
}

// lastLines returns up to n last non-empty lines joined into one line.
func (t *tailWriter) lastLines(n int) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var lines []string
	for _, l := range bytes.Split(t.buf, []byte("\n")) {
		if s := strings.TrimSpace(strings.ToValidUTF8(string(l), "?")); s != "" {
			lines = append(lines, s)
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	if len(lines) == 0 {
		return "no output"
	}
	return strings.Join(lines, " | ")
}

// Listen makes a unix stream socket listening at path, mode 0600, for
// QEMU to inherit (Spec.QMPFD, Spec.AgentFD), so that QEMU needs neither
// the path nor the right to create it. A stale socket at path is
// replaced. The caller closes the file once QEMU has started.
func Listen(path string) (*os.File, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	l.SetUnlinkOnClose(false)
	defer l.Close()
	if err := os.Chmod(path, 0o600); err != nil {
		_ = os.Remove(path)
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	f, err := l.File()
	if err != nil {
		_ = os.Remove(path)
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	return f, nil
}
