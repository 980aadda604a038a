package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strconv"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"
)

// ErrClosed reports that the QMP connection has ended.
var ErrClosed = errors.New("qmp connection closed")

// ErrNoReply reports that a command reached QEMU's socket but its reply did
// not come before the caller's context ended; QEMU may still run it.
var ErrNoReply = errors.New("qmp command sent, no reply")

// EventBuffer is how many events each subscriber may have queued; further
// events for a subscriber whose queue is full are dropped.
const EventBuffer = 256

// maxQMPMessage bounds what is read of the socket for one message: the
// replies and events the shim asks for are a few KiB (query-cpus-fast for
// hundreds of vCPUs under 100 KiB). QEMU runs what the guest gives it, so
// past this the connection is closed, as on any other broken message.
const maxQMPMessage = 4 << 20

// Event is an asynchronous QMP event.
type Event struct {
	Name      string
	Data      json.RawMessage
	Timestamp time.Time
}

// Error is an error reply from QEMU.
type Error struct {
	Class string `json:"class"`
	Desc  string `json:"desc"`
}

// Error implements error.
func (e *Error) Error() string { return "qmp error " + e.Class + ": " + e.Desc }

// Unwrap maps the QMP error class to an errdefs sentinel.
func (e *Error) Unwrap() error {
	switch e.Class {
	case "CommandNotFound":
		return errdefs.ErrNotImplemented
	case "DeviceNotFound":
		return errdefs.ErrNotFound
	case "DeviceNotActive":
		return errdefs.ErrFailedPrecondition
	default:
		return errdefs.ErrUnknown
	}
}

// Status is the reply to query-status.
type Status struct {
	Running bool   `json:"running"`
	Status  string `json:"status"`
}

// Client is a QMP connection. It is safe for concurrent use: one goroutine
// reads replies and events, and each command is matched to its reply by id.
type Client struct {
	conn net.Conn
	log  *log.Entry

	// wsem serializes writes to conn; it is a channel so waiting honours ctx.
	wsem chan struct{}
	// fdsem admits one fd-passing command at a time (see SendFD).
	fdsem chan struct{}

	mu      sync.Mutex
	nextID  uint64                   // guarded by mu
	pending map[string]chan response // guarded by mu; replies by command id
	subs    map[uint64]chan Event    // guarded by mu
	nextSub uint64                   // guarded by mu
	err     error                    // guarded by mu; why the connection ended

	done      chan struct{} // closed when the reader has stopped
	closeOnce sync.Once
	closeErr  error
}

type response struct {
	ret json.RawMessage
	err *Error
}

// message is any message QEMU sends.
type message struct {
	QMP       json.RawMessage `json:"QMP"`
	Return    json.RawMessage `json:"return"`
	Error     *Error          `json:"error"`
	Event     string          `json:"event"`
	Data      json.RawMessage `json:"data"`
	Timestamp *struct {
		Seconds      int64 `json:"seconds"`
		Microseconds int64 `json:"microseconds"`
	} `json:"timestamp"`
	ID json.RawMessage `json:"id"`
}

type request struct {
	Execute   string `json:"execute"`
	Arguments any    `json:"arguments,omitempty"`
	ID        string `json:"id"`
}

// Dial connects to the QMP unix socket at path and negotiates capabilities.
func Dial(ctx context.Context, path string) (*Client, error) {
	conn, err := dialSocket(ctx, path)
	if err != nil {
		return nil, err
	}
	c, err := NewClient(ctx, conn)
	if err != nil {
		return nil, fmt.Errorf("qmp %s: %w", path, err)
	}
	return c, nil
}

// dialSocket connects to the QMP unix socket at path.
func dialSocket(ctx context.Context, path string) (net.Conn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("dial qmp %s: %w", path, err)
	}
	return conn, nil
}

// NewClient takes over conn, reads QEMU's greeting and leaves capability
// negotiation mode. On error conn is closed.
func NewClient(ctx context.Context, conn net.Conn) (*Client, error) {
	c := Open(ctx, conn)
	if err := c.Execute(ctx, "qmp_capabilities", nil, nil); err != nil {
		c.Close()
		return nil, fmt.Errorf("qmp handshake: %w", err)
	}
	return c, nil
}

// Open takes over conn and starts reading it, and returns at once: it
// waits for no greeting and sends nothing. The caller sends
// qmp_capabilities first; it and the commands sent after it may go out
// before QEMU's greeting comes in, since QEMU reads them after sending
// it, in order, so a handshake and a few commands take one round trip.
// Their replies come after the greeting, which must be the first message.
func Open(ctx context.Context, conn net.Conn) *Client {
	c := &Client{
		conn:    conn,
		log:     log.G(ctx),
		wsem:    make(chan struct{}, 1),
		fdsem:   make(chan struct{}, 1),
		pending: map[string]chan response{},
		subs:    map[uint64]chan Event{},
		done:    make(chan struct{}),
	}
	go c.read()
	return c
}

// Done returns a channel closed when the connection ends.
func (c *Client) Done() <-chan struct{} { return c.done }

// Close closes the connection and waits for the reader to stop. Pending
// and later calls fail with ErrClosed.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		c.closeErr = c.conn.Close()
	})
	<-c.done
	return c.closeErr
}

func (c *Client) closedErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// read is the only reader of conn. It exits when the connection ends, after
// failing pending calls and closing every event channel.
func (c *Client) read() {
	err := c.readLoop()
	c.mu.Lock()
	c.err = fmt.Errorf("%w: %v", ErrClosed, err)
	for id, sub := range c.subs {
		close(sub)
		delete(c.subs, id)
	}
	c.mu.Unlock()
	c.closeOnce.Do(func() { c.closeErr = c.conn.Close() })
	close(c.done)
}

func (c *Client) readLoop() error {
	lim := &messageLimit{r: c.conn, left: maxQMPMessage}
	dec := json.NewDecoder(bufio.NewReader(lim))
	greeted := false
	for {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			if errors.Is(err, io.EOF) {
				return errors.New("eof")
			}
			return err
		}
		lim.left = maxQMPMessage
		var m message
		if err := json.Unmarshal(raw, &m); err != nil {
			return fmt.Errorf("decode qmp message: %w", err)
		}
		switch {
		case !greeted:
			if m.QMP == nil {
				return fmt.Errorf("qmp greeting expected, got %.100s", raw)
			}
			greeted = true
		case m.Event != "":
			c.publish(m)
		case m.Return != nil || m.Error != nil:
			c.reply(m)
		default:
			c.log.WithField("message", string(raw)).Debug("ignoring unexpected qmp message")
		}
	}
}

// messageLimit fails reads once left bytes have been read: the reader
// resets left after each message, so one message (with what the decoder
// read ahead of it) is at most maxQMPMessage bytes.
type messageLimit struct {
	r    io.Reader
	left int // read by the reading goroutine alone
}

var errQMPTooLarge = fmt.Errorf("qmp message larger than %d bytes", maxQMPMessage)

func (l *messageLimit) Read(p []byte) (int, error) {
	if l.left <= 0 {
		return 0, errQMPTooLarge
	}
	if len(p) > l.left {
		p = p[:l.left]
	}
	n, err := l.r.Read(p)
	l.left -= n
	return n, err
}

func (c *Client) reply(m message) {
	var id string
	if err := json.Unmarshal(m.ID, &id); err != nil {
		c.log.WithField("id", string(m.ID)).Debug("ignoring qmp reply without a known id")
		return
	}
	c.mu.Lock()
	ch, ok := c.pending[id]
	delete(c.pending, id)
	c.mu.Unlock()
	if !ok {
		// The caller gave up (its context ended); the reply is discarded.
		return
	}
	ch <- response{ret: m.Return, err: m.Error}
}

func (c *Client) publish(m message) {
	ev := Event{Name: m.Event, Data: m.Data}
	if m.Timestamp != nil && m.Timestamp.Seconds >= 0 {
		ev.Timestamp = time.Unix(m.Timestamp.Seconds, m.Timestamp.Microseconds*1000)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, sub := range c.subs {
		select {
		case sub <- ev:
		default:
			c.log.WithField("event", ev.Name).Warn("qmp event subscriber is full, dropping event")
		}
	}
}

// Events subscribes to QMP events. Every subscriber receives every event,
// in order; events are dropped for a subscriber that has EventBuffer events
// queued, so a slow subscriber never blocks the client. The channel is
// closed by cancel or when the connection ends.
func (c *Client) Events() (<-chan Event, func()) {
	ch := make(chan Event, EventBuffer)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		close(ch)
		return ch, func() {}
	}
	id := c.nextSub
	c.nextSub++
	c.subs[id] = ch
	return ch, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if sub, ok := c.subs[id]; ok {
			close(sub)
			delete(c.subs, id)
		}
	}
}

// Execute runs cmd with args (nil for none) and decodes the reply into
// result (nil to discard it). A QMP error reply is returned as *Error. When
// ctx ends first, Execute returns ctx's error, wrapped in ErrNoReply if the
// command had been sent, and a late reply is discarded.
func (c *Client) Execute(ctx context.Context, cmd string, args, result any) error {
	p, err := c.Send(ctx, cmd, args)
	if err != nil {
		return err
	}
	return p.Wait(ctx, result)
}

// Pending is a command sent whose reply is still to be taken.
type Pending struct {
	c   *Client
	cmd string
	id  string
	ch  chan response
}

// Send sends cmd with args (nil for none) and returns without waiting
// for the reply, which Pending.Wait takes. Commands sent one after
// another are answered in order: a caller that sends several and then
// waits for each pays one round trip.
func (c *Client) Send(ctx context.Context, cmd string, args any) (*Pending, error) {
	p, err := c.send1(ctx, cmd, args, nil)
	if err != nil {
		return nil, fmt.Errorf("qmp %s: %w", cmd, err)
	}
	return p, nil
}

// Wait waits for the command's reply and decodes it into result (nil to
// discard it), as Execute does. When ctx ends first, the late reply is
// discarded.
func (p *Pending) Wait(ctx context.Context, result any) error {
	ret, err := p.wait(ctx)
	if err != nil {
		return fmt.Errorf("qmp %s: %w", p.cmd, err)
	}
	if result == nil {
		return nil
	}
	if err := json.Unmarshal(ret, result); err != nil {
		return fmt.Errorf("qmp %s: decode reply: %w", p.cmd, err)
	}
	return nil
}

// execute sends cmd, with oob (SCM_RIGHTS) attached when not nil, and
// waits for its reply.
func (c *Client) execute(ctx context.Context, cmd string, args any, oob []byte) (json.RawMessage, error) {
	p, err := c.send1(ctx, cmd, args, oob)
	if err != nil {
		return nil, err
	}
	return p.wait(ctx)
}

// send1 registers cmd under a new id and writes it, with oob attached
// when not nil.
func (c *Client) send1(ctx context.Context, cmd string, args any, oob []byte) (*Pending, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return nil, c.err
	}
	c.nextID++
	p := &Pending{c: c, cmd: cmd, id: strconv.FormatUint(c.nextID, 10), ch: make(chan response, 1)}
	c.pending[p.id] = p.ch
	c.mu.Unlock()

	b, err := json.Marshal(request{Execute: cmd, Arguments: args, ID: p.id})
	if err != nil {
		p.forget()
		return nil, fmt.Errorf("encode arguments: %w", err)
	}
	if err := c.write(ctx, append(b, '\n'), oob); err != nil {
		p.forget()
		return nil, err
	}
	return p, nil
}

// forget drops the command's entry: a reply that comes later is discarded.
func (p *Pending) forget() {
	p.c.mu.Lock()
	delete(p.c.pending, p.id)
	p.c.mu.Unlock()
}

// wait takes the command's reply.
func (p *Pending) wait(ctx context.Context) (json.RawMessage, error) {
	select {
	case r := <-p.ch:
		return r.ret, r.asError()
	case <-ctx.Done():
		p.forget()
		return nil, fmt.Errorf("%w: %w", ErrNoReply, ctx.Err())
	case <-p.c.done:
		select {
		case r := <-p.ch:
			return r.ret, r.asError()
		default:
			return nil, p.c.closedErr()
		}
	}
}

func (r response) asError() error {
	if r.err != nil {
		return r.err
	}
	return nil
}

// write sends one message, with oob attached to its first byte when not
// nil. It waits for its turn and for the peer to take the bytes only as
// long as ctx allows; a message cut short leaves the stream unusable, so
// the connection is closed then.
func (c *Client) write(ctx context.Context, b, oob []byte) error {
	select {
	case c.wsem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	case <-c.done:
		return c.closedErr()
	}
	defer func() { <-c.wsem }()

	deadline, _ := ctx.Deadline()
	if err := c.conn.SetWriteDeadline(deadline); err != nil && !errors.Is(err, net.ErrClosed) {
		c.log.WithError(err).Debug("set qmp write deadline")
	}
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		_ = c.conn.SetWriteDeadline(time.Unix(1, 0))
		close(fired)
	})
	n, err := c.send(b, oob)
	if !stop() {
		<-fired
	}
	if err == nil {
		return nil
	}
	if n > 0 {
		_ = c.conn.Close()
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		// Only ctx sets write deadlines; its Done may trail the socket's timer.
		<-ctx.Done()
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	select {
	case <-c.done:
		return c.closedErr()
	default:
		return fmt.Errorf("%w: write: %v", ErrClosed, err)
	}
}

// send writes b to the connection, oob with its first byte.
func (c *Client) send(b, oob []byte) (int, error) {
	if oob == nil {
		return c.conn.Write(b)
	}
	uc, ok := c.conn.(*net.UnixConn)
	if !ok {
		return 0, errors.New("passing fds needs a unix socket")
	}
	n, _, err := uc.WriteMsgUnix(b, oob, nil)
	if err == nil && n < len(b) {
		var m int
		m, err = c.conn.Write(b[n:])
		n += m
	}
	return n, err
}

// SendFD passes f to QEMU over the connection (QMP getfd, the fd in
// SCM_RIGHTS) under name, for a later command to use by that name; f
// stays the caller's to close. One call at a time passes an fd: QEMU
// keeps only the fds of the latest message it read.
func (c *Client) SendFD(ctx context.Context, name string, f *os.File) error {
	if _, ok := c.conn.(*net.UnixConn); !ok {
		return fmt.Errorf("qmp getfd %s: passing fds needs a unix socket, not %T: %w", name, c.conn, errdefs.ErrNotImplemented)
	}
	select {
	case c.fdsem <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("qmp getfd %s: %w", name, ctx.Err())
	}
	defer func() { <-c.fdsem }()
	_, err := c.execute(ctx, "getfd", map[string]string{"fdname": name}, unix.UnixRights(int(f.Fd())))
	runtime.KeepAlive(f)
	if err != nil {
		return fmt.Errorf("qmp getfd %s: %w", name, err)
	}
	return nil
}

// SystemPowerdown presses the guest's ACPI power button.
func (c *Client) SystemPowerdown(ctx context.Context) error {
	return c.Execute(ctx, "system_powerdown", nil, nil)
}

// Stop pauses all vCPUs.
func (c *Client) Stop(ctx context.Context) error {
	return c.Execute(ctx, "stop", nil, nil)
}

// Cont resumes all vCPUs.
func (c *Client) Cont(ctx context.Context) error {
	return c.Execute(ctx, "cont", nil, nil)
}

// Quit makes QEMU exit at once. QEMU closes the connection as it exits, so
// a connection that ends before the reply arrives also counts as success.
func (c *Client) Quit(ctx context.Context) error {
	err := c.Execute(ctx, "quit", nil, nil)
	if errors.Is(err, ErrClosed) {
		return nil
	}
	return err
}

// QueryStatus reports whether the vCPUs run and QEMU's run state.
func (c *Client) QueryStatus(ctx context.Context) (Status, error) {
	var st Status
	err := c.Execute(ctx, "query-status", nil, &st)
	return st, err
}
