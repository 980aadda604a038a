package qemu

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/containerd/errdefs"
)

// ErrNoAgent reports that the guest has not opened the guest agent's port.
var ErrNoAgent = fmt.Errorf("no guest agent: the guest has not opened virtio-serial port %s "+
	"(is qemu-guest-agent installed and running in the image?): %w", AgentPortName, errdefs.ErrFailedPrecondition)

// ErrAgentClosed reports a call on a closed Agent, such as one whose VM has exited.
var ErrAgentClosed = fmt.Errorf("guest agent closed: %w", errdefs.ErrFailedPrecondition)

// agentDelimiter is the byte that resets the agent's JSON parser and that
// the agent sends before its answer to guest-sync-delimited; it never
// occurs in UTF-8 text.
const agentDelimiter = 0xFF

// maxAgentReply bounds one reply; guest-exec-status carries up to 16 MiB of
// output per stream, base64-encoded.
const maxAgentReply = 64 << 20

// maxAgentSkip bounds what a call reads and throws away while it looks for
// the answer to its sync: output of calls given up on, or whatever a guest
// writes to the port in place of an agent. Past it the call fails and the
// connection is dropped (the next call dials again). What is skipped is
// never kept: the skip costs the reader's buffer, not memory per byte.
const maxAgentSkip = 1 << 20

// maxSyncReply bounds the answer to a sync, {"return": N} with N < 2^53;
// a longer object is not that answer.
const maxSyncReply = 256

// GuestCommand is a program for the guest agent to run.
type GuestCommand struct {
	Path  string   // program; the guest's PATH is searched
	Args  []string // arguments after the program name
	Env   []string // KEY=value entries replacing the agent's environment; nil keeps it
	Input []byte   // written to the program's stdin, which is then closed
}

// GuestExecStatus is what the agent reports of a started program.
type GuestExecStatus struct {
	Exited    bool
	ExitCode  int // exit code, or 128+signal; valid once Exited
	Signal    int // the signal that ended the program, or 0
	Stdout    []byte
	Stderr    []byte
	Truncated bool // the agent dropped output beyond its capture limit
}

// AgentError is an error reply from the guest agent.
type AgentError struct {
	Class string `json:"class"`
	Desc  string `json:"desc"`
}

// Error implements error.
func (e *AgentError) Error() string { return "guest agent error " + e.Class + ": " + e.Desc }

// Unwrap maps the error class to an errdefs sentinel, as QMP errors are.
func (e *AgentError) Unwrap() error { return (&Error{Class: e.Class}).Unwrap() }

// Agent is a qemu-guest-agent client on the unix socket QEMU listens on
// for the agent's virtio-serial port. Calls are served one at a time; the
// connection is opened by the first call and kept until an error or
// cancellation leaves its state unknown, when the next call reconnects.
type Agent struct {
	socket string
	ready  func() bool

	// sem admits one call at a time; a channel so that waiting honours ctx.
	// The call holding it is the only user of conn and br.
	sem chan struct{}

	mu     sync.Mutex
	conn   net.Conn      // guarded by mu; nil until connected and after a failure
	br     *bufio.Reader // guarded by mu; reads conn
	closed bool          // guarded by mu
}

// NewAgent returns a client for the agent behind socket. ready reports
// whether the guest's end of the port is open; nil means assume it is.
func NewAgent(socket string, ready func() bool) *Agent {
	return &Agent{socket: socket, ready: ready, sem: make(chan struct{}, 1)}
}

// Close closes the connection and interrupts a call in progress; later
// calls fail with ErrAgentClosed.
func (a *Agent) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.closed = true
	var err error
	if a.conn != nil {
		err = a.conn.Close()
		a.conn, a.br = nil, nil
	}
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("close guest agent %s: %w", a.socket, err)
	}
	return nil
}

// Ping checks that the agent answers.
func (a *Agent) Ping(ctx context.Context) error {
	return a.call(ctx, "guest-ping", nil, nil)
}

type execArgs struct {
	Path          string   `json:"path"`
	Arg           []string `json:"arg,omitempty"`
	Env           []string `json:"env,omitempty"`
	InputData     []byte   `json:"input-data,omitempty"` // base64 in JSON
	CaptureOutput bool     `json:"capture-output"`
}

// Exec starts c in the guest with its output captured and returns its pid
// in the guest. When ctx ends after the request was sent, the program may
// run all the same.
func (a *Agent) Exec(ctx context.Context, c GuestCommand) (pid int, err error) {
	if c.Path == "" {
		return 0, fmt.Errorf("guest exec: empty path: %w", errdefs.ErrInvalidArgument)
	}
	var ret struct {
		PID *int `json:"pid"`
	}
	args := execArgs{Path: c.Path, Arg: c.Args, Env: c.Env, InputData: c.Input, CaptureOutput: true}
	if err := a.call(ctx, "guest-exec", args, &ret); err != nil {
		return 0, err
	}
	if ret.PID == nil {
		return 0, fmt.Errorf("guest agent guest-exec: reply has no pid: %w", errdefs.ErrUnknown)
	}
	return *ret.PID, nil
}

type execStatusReply struct {
	Exited       bool   `json:"exited"`
	ExitCode     *int   `json:"exitcode"`
	Signal       *int   `json:"signal"`
	OutData      []byte `json:"out-data"` // base64 in JSON
	ErrData      []byte `json:"err-data"`
	OutTruncated bool   `json:"out-truncated"`
	ErrTruncated bool   `json:"err-truncated"`
}

// ExecStatus reports on a program started by Exec. The agent forgets the
// program once it has reported it exited, with its output.
func (a *Agent) ExecStatus(ctx context.Context, pid int) (GuestExecStatus, error) {
	var r execStatusReply
	if err := a.call(ctx, "guest-exec-status", map[string]int{"pid": pid}, &r); err != nil {
		return GuestExecStatus{}, err
	}
	st := GuestExecStatus{
		Exited:    r.Exited,
		Stdout:    r.OutData,
		Stderr:    r.ErrData,
		Truncated: r.OutTruncated || r.ErrTruncated,
	}
	switch {
	case r.Signal != nil:
		st.Signal = *r.Signal
		st.ExitCode = 128 + *r.Signal
	case r.ExitCode != nil:
		st.ExitCode = *r.ExitCode
	}
	return st, nil
}

type agentRequest struct {
	Execute   string `json:"execute"`
	Arguments any    `json:"arguments,omitempty"`
}

type agentReply struct {
	Return json.RawMessage `json:"return"`
	Error  *AgentError     `json:"error"`
}

// call runs one command: it resynchronises with the agent, sends the
// command and decodes its reply into result (nil to discard it).
func (a *Agent) call(ctx context.Context, cmd string, args, result any) error {
	a.mu.Lock()
	closed := a.closed
	a.mu.Unlock()
	if closed {
		return fmt.Errorf("guest agent %s: %w", cmd, ErrAgentClosed)
	}
	if a.ready != nil && !a.ready() {
		return fmt.Errorf("guest agent %s: %w", cmd, ErrNoAgent)
	}
	select {
	case a.sem <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("guest agent %s: %w", cmd, ctx.Err())
	}
	defer func() { <-a.sem }()
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("guest agent %s: %w", cmd, err)
	}

	conn, br, err := a.connect(ctx)
	if err != nil {
		return fmt.Errorf("guest agent %s: %w", cmd, err)
	}
	ret, err := a.roundTrip(ctx, conn, br, cmd, args)
	if err != nil {
		var aerr *AgentError
		if !errors.As(err, &aerr) {
			// The stream is in an unknown state: start afresh next time.
			a.drop(conn)
			err = a.transportErr(ctx, err)
		}
		return fmt.Errorf("guest agent %s: %w", cmd, err)
	}
	if result != nil {
		if err := json.Unmarshal(ret, result); err != nil {
			return fmt.Errorf("guest agent %s: decode reply: %w", cmd, err)
		}
	}
	return nil
}

// connect returns the open connection, dialling when there is none.
func (a *Agent) connect(ctx context.Context) (net.Conn, *bufio.Reader, error) {
	a.mu.Lock()
	closed, conn, br := a.closed, a.conn, a.br
	a.mu.Unlock()
	if closed {
		return nil, nil, ErrAgentClosed
	}
	if conn != nil {
		return conn, br, nil
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", a.socket)
	if err != nil {
		if ctx.Err() != nil {
			return nil, nil, ctx.Err()
		}
		return nil, nil, fmt.Errorf("%w: %w", errdefs.ErrUnavailable, err)
	}
	br = bufio.NewReader(conn)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		_ = conn.Close()
		return nil, nil, ErrAgentClosed
	}
	a.conn, a.br = conn, br
	return conn, br, nil
}

// drop closes conn and forgets it if it is still the current connection.
func (a *Agent) drop(conn net.Conn) {
	a.mu.Lock()
	if a.conn == conn {
		a.conn, a.br = nil, nil
	}
	a.mu.Unlock()
	_ = conn.Close()
}

// transportErr says why I/O failed: ctx ended, Close was called, or the
// connection broke.
func (a *Agent) transportErr(ctx context.Context, err error) error {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		// Only ctx sets deadlines; its Done may trail the socket's timer.
		<-ctx.Done()
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	a.mu.Lock()
	closed := a.closed
	a.mu.Unlock()
	if closed {
		return ErrAgentClosed
	}
	if errdefs.IsUnavailable(err) {
		return err
	}
	return fmt.Errorf("%w: %w", errdefs.ErrUnavailable, err)
}

// roundTrip syncs with the agent, then sends cmd and reads its reply. All
// I/O ends when ctx does.
func (a *Agent) roundTrip(ctx context.Context, conn net.Conn, br *bufio.Reader, cmd string, args any) (json.RawMessage, error) {
	req, err := json.Marshal(agentRequest{Execute: cmd, Arguments: args})
	if err != nil {
		return nil, fmt.Errorf("encode request: %w", err)
	}
	deadline, _ := ctx.Deadline() // zero: none
	if err := conn.SetDeadline(deadline); err != nil {
		return nil, err
	}
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		_ = conn.SetDeadline(time.Unix(1, 0))
		close(fired)
	})
	defer func() {
		if !stop() {
			<-fired
		}
	}()

	if err := resync(conn, br); err != nil {
		return nil, err
	}
	if _, err := conn.Write(append(req, '\n')); err != nil {
		return nil, fmt.Errorf("write: %w", err)
	}
	raw, _, err := readObject(br, maxAgentReply, nil)
	if errors.Is(err, errTooLarge) {
		return nil, fmt.Errorf("read reply: more than %d bytes", maxAgentReply)
	}
	if err != nil {
		return nil, fmt.Errorf("read reply: %w", err)
	}
	var r agentReply
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, fmt.Errorf("decode reply %.100q: %w", raw, err)
	}
	switch {
	case r.Error != nil:
		return nil, r.Error
	case r.Return == nil:
		return nil, fmt.Errorf("reply %.100q has neither return nor error", raw)
	}
	return r.Return, nil
}

// resync resets the agent's parser and discards everything it sends until
// it answers a guest-sync-delimited with a fresh id: output of earlier
// requests (perhaps written before the guest had an agent, or abandoned by
// a caller) arrives first. It skips at most maxAgentSkip bytes, keeping
// none of them.
func resync(conn net.Conn, br *bufio.Reader) error {
	id := rand.Int64N(1 << 53) // exact in any JSON implementation
	msg, err := json.Marshal(agentRequest{Execute: "guest-sync-delimited", Arguments: map[string]int64{"id": id}})
	if err != nil {
		return fmt.Errorf("encode sync: %w", err)
	}
	if _, err := conn.Write(append(append([]byte{agentDelimiter}, msg...), '\n')); err != nil {
		return fmt.Errorf("write sync: %w", err)
	}
	if err := awaitSync(br, id); err != nil {
		return fmt.Errorf("read sync: %w", err)
	}
	return nil
}

// awaitSync reads br until the answer to the sync with id, {"return": id}
// after a delimiter, keeping nothing else it reads; it fails past
// maxAgentSkip bytes.
func awaitSync(br *bufio.Reader, id int64) error {
	skipped, seek := 0, true // seek: the next object must follow a delimiter
	scratch := make([]byte, 0, maxSyncReply)
	digits := strconv.AppendInt(nil, id, 10)
	var r struct {
		Return *int64 `json:"return"`
	}
	for {
		if skipped > maxAgentSkip {
			return errSkipLimit
		}
		if seek {
			n, err := skipPast(br, agentDelimiter, maxAgentSkip-skipped)
			skipped += n
			if err != nil {
				return err
			}
		}
		raw, n, err := readObject(br, maxSyncReply, scratch[:0])
		skipped += n
		seek = !errors.Is(err, errDelimiter)
		switch {
		case errors.Is(err, errDelimiter), errors.Is(err, errNotObject), errors.Is(err, errTooLarge):
			continue
		case err != nil:
			return err
		}
		r.Return = nil
		if bytes.Contains(raw, digits) && json.Unmarshal(raw, &r) == nil && r.Return != nil && *r.Return == id {
			return nil
		}
		// A stale reply: ours follows the next delimiter.
	}
}

var (
	errDelimiter = errors.New("unexpected delimiter byte")
	errNotObject = errors.New("not a json object")
	errTooLarge  = errors.New("object too large")
	// errSkipLimit is classed itself, so that it crosses ttrpc as one line.
	errSkipLimit = fmt.Errorf("more than %d bytes before the agent's answer to the sync: %w", maxAgentSkip, errdefs.ErrUnavailable)
)

// skipPast discards what br holds up to and including the next delim and
// returns how many bytes it read. It keeps nothing it reads, and fails once
// it has read limit bytes without finding delim.
func skipPast(br *bufio.Reader, delim byte, limit int) (int, error) {
	n := 0
	for {
		b, err := br.ReadSlice(delim)
		n += len(b)
		switch {
		case err == nil:
			return n, nil
		case !errors.Is(err, bufio.ErrBufferFull):
			return n, err
		case n >= limit:
			return n, errSkipLimit
		}
	}
}

// readObject reads one JSON object from br, byte by byte so that nothing
// after it is consumed, and returns it (appended to buf, which may be nil)
// with the count of bytes consumed.
// Leading whitespace is skipped; errDelimiter reports a delimiter byte
// (consumed), errNotObject any other byte that cannot start or continue an
// object, and errTooLarge an object (with the whitespace before it) of
// more than limit bytes, of which limit were consumed.
func readObject(br *bufio.Reader, limit int, buf []byte) ([]byte, int, error) {
	buf = buf[:0]
	depth, inString, escaped := 0, false, false
	for n := 0; ; n++ {
		if n >= limit {
			return nil, n, errTooLarge
		}
		b, err := br.ReadByte()
		if err != nil {
			return nil, n, err
		}
		if b == agentDelimiter {
			return nil, n + 1, errDelimiter
		}
		if len(buf) == 0 {
			switch b {
			case ' ', '\t', '\r', '\n':
				continue
			case '{':
			default:
				return nil, n + 1, errNotObject
			}
		}
		if len(buf) == cap(buf) {
			// Grow by doubling, never past max: a reply near the bound
			// costs max bytes, not twice that.
			buf = append(make([]byte, 0, min(max(2*cap(buf), 512), limit)), buf...)
		}
		buf = append(buf, b)
		switch {
		case escaped:
			escaped = false
		case inString && b == '\\':
			escaped = true
		case b == '"':
			inString = !inString
		case inString:
		case b == '{' || b == '[':
			depth++
		case b == '}' || b == ']':
			depth--
			if depth == 0 {
				return buf, n + 1, nil
			}
		}
	}
}

// guestVCPU is one logical CPU as guest-get-vcpus reports it.
type guestVCPU struct {
	LogicalID  int  `json:"logical-id"`
	Online     bool `json:"online"`
	CanOffline bool `json:"can-offline,omitempty"`
}

// SetOnlineVCPUs has the guest keep its logical CPUs 0..n-1 online and
// the rest offline, and returns how many it has online. A CPU hot-plugged
// a moment ago may not be listed yet: call it again.
func (a *Agent) SetOnlineVCPUs(ctx context.Context, n int) (online int, err error) {
	var cpus []guestVCPU
	if err := a.call(ctx, "guest-get-vcpus", nil, &cpus); err != nil {
		return 0, err
	}
	var change []guestVCPU
	for _, c := range cpus {
		want := c.LogicalID < n
		if c.Online != want && (want || c.CanOffline) {
			change = append(change, guestVCPU{LogicalID: c.LogicalID, Online: want})
		}
		if c.Online {
			online++
		}
	}
	if len(change) == 0 {
		return online, nil
	}
	var done int
	if err := a.call(ctx, "guest-set-vcpus", map[string]any{"vcpus": change}, &done); err != nil {
		return 0, err
	}
	done = max(done, 0) // the guest's count: a negative one would panic below
	for _, c := range change[:min(done, len(change))] {
		if c.Online {
			online++
		} else {
			online--
		}
	}
	if done < len(change) {
		return online, fmt.Errorf("guest agent guest-set-vcpus: logical cpu %d stays %s: %w",
			change[done].LogicalID, map[bool]string{true: "offline", false: "online"}[change[done].Online], errdefs.ErrFailedPrecondition)
	}
	return online, nil
}
