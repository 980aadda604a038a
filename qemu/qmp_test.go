package qemu

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

const greeting = `{"QMP": {"version": {"qemu": {"micro": 0, "minor": 2, "major": 7}, "package": ""}, "capabilities": ["oob"]}}`

// peer is a scripted QMP server on one end of a net.Pipe.
type peer struct {
	t    *testing.T
	conn net.Conn
	dec  *json.Decoder
}

type peerRequest struct {
	Execute   string          `json:"execute"`
	Arguments json.RawMessage `json:"arguments"`
	ID        json.RawMessage `json:"id"`
}

func newPeer(t *testing.T) (*peer, net.Conn) {
	t.Helper()
	client, server := net.Pipe()
	t.Cleanup(func() { server.Close(); client.Close() })
	return &peer{t: t, conn: server, dec: json.NewDecoder(server)}, client
}

func (p *peer) send(format string, args ...any) {
	p.t.Helper()
	if _, err := fmt.Fprintf(p.conn, format+"\r\n", args...); err != nil {
		p.t.Errorf("peer send: %v", err)
	}
}

func (p *peer) recv() peerRequest {
	p.t.Helper()
	var r peerRequest
	if err := p.dec.Decode(&r); err != nil {
		p.t.Errorf("peer recv: %v", err)
	}
	return r
}

// handshake plays QEMU's side of NewClient.
func (p *peer) handshake() {
	p.t.Helper()
	p.send("%s", greeting)
	r := p.recv()
	if r.Execute != "qmp_capabilities" || len(r.ID) == 0 {
		p.t.Errorf("first command = %+v, want qmp_capabilities with an id", r)
	}
	p.send(`{"return": {}, "id": %s}`, r.ID)
}

// connect returns a client talking to a scripted peer after the handshake.
func connect(t *testing.T) (*Client, *peer) {
	t.Helper()
	p, conn := newPeer(t)
	go p.handshake()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := NewClient(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, p
}

func testCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// noLeak fails t when goroutines started after it was called outlive the test body.
func noLeak(t *testing.T) func() {
	before := runtime.NumGoroutine()
	return func() {
		t.Helper()
		deadline := time.Now().Add(2 * time.Second)
		for runtime.NumGoroutine() > before {
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<16)
				t.Fatalf("%d goroutines before, %d after:\n%s", before, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

func TestClientResult(t *testing.T) {
	c, p := connect(t)
	go func() {
		r := p.recv()
		if r.Execute != "query-status" {
			t.Errorf("command = %q", r.Execute)
		}
		p.send(`{"return": {"status": "paused", "singlestep": false, "running": false}, "id": %s}`, r.ID)
	}()
	st, err := c.QueryStatus(testCtx(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if st != (Status{Running: false, Status: "paused"}) {
		t.Errorf("status = %+v", st)
	}
}

func TestClientArguments(t *testing.T) {
	c, p := connect(t)
	go func() {
		r := p.recv()
		if r.Execute != "device_del" || string(r.Arguments) != `{"id":"dev-a"}` {
			t.Errorf("request = %s %s", r.Execute, r.Arguments)
		}
		p.send(`{"return": {}, "id": %s}`, r.ID)
	}()
	if err := c.Execute(testCtx(t, 5*time.Second), "device_del", map[string]string{"id": "dev-a"}, nil); err != nil {
		t.Fatal(err)
	}
}

func TestClientErrorReply(t *testing.T) {
	c, p := connect(t)
	go func() {
		r := p.recv()
		p.send(`{"id": %s, "error": {"class": "CommandNotFound", "desc": "The command nope has not been found"}}`, r.ID)
	}()
	err := c.Execute(testCtx(t, 5*time.Second), "nope", nil, nil)
	var qerr *Error
	if !errors.As(err, &qerr) {
		t.Fatalf("error %v is not a *Error", err)
	}
	if qerr.Class != "CommandNotFound" || qerr.Desc != "The command nope has not been found" {
		t.Errorf("error = %+v", qerr)
	}
	if !errors.Is(err, errdefs.ErrNotImplemented) {
		t.Errorf("error %v does not map to ErrNotImplemented", err)
	}
}

func TestClientEventsFanOut(t *testing.T) {
	c, p := connect(t)
	ev1, cancel1 := c.Events()
	ev2, cancel2 := c.Events()
	defer cancel2()
	go func() {
		p.send(`{"event": "STOP", "timestamp": {"seconds": 1700000000, "microseconds": 250}}`)
		r := p.recv()
		p.send(`{"event": "RESUME", "data": {"x": 1}, "timestamp": {"seconds": 1700000001, "microseconds": 0}}`)
		p.send(`{"return": {}, "id": %s}`, r.ID)
		p.send(`{"event": "SHUTDOWN", "data": {"guest": true, "reason": "guest-shutdown"}, "timestamp": {"seconds": 1700000002, "microseconds": 0}}`)
	}()
	if err := c.Cont(testCtx(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	for i, ch := range []<-chan Event{ev1, ev2} {
		var names []string
		for len(names) < 3 {
			select {
			case ev := <-ch:
				names = append(names, ev.Name)
				if ev.Name == "STOP" && !ev.Timestamp.Equal(time.Unix(1700000000, 250000)) {
					t.Errorf("STOP timestamp = %v", ev.Timestamp)
				}
				if ev.Name == "RESUME" && string(ev.Data) != `{"x": 1}` {
					t.Errorf("RESUME data = %s", ev.Data)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("subscriber %d got %v, want 3 events", i, names)
			}
		}
		if fmt.Sprint(names) != "[STOP RESUME SHUTDOWN]" {
			t.Errorf("subscriber %d got %v", i, names)
		}
	}
	cancel1()
	cancel1() // idempotent
	if _, ok := <-ev1; ok {
		t.Error("channel open after cancel")
	}
	go p.send(`{"event": "STOP", "timestamp": {"seconds": 1, "microseconds": 0}}`)
	select {
	case ev := <-ev2:
		if ev.Name != "STOP" {
			t.Errorf("event = %v", ev.Name)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("remaining subscriber got no event")
	}
}

func TestClientConcurrentCommands(t *testing.T) {
	c, p := connect(t)
	const n = 20
	go func() {
		reqs := make([]peerRequest, n)
		for i := range reqs {
			reqs[i] = p.recv()
		}
		for i := n - 1; i >= 0; i-- { // answer in reverse order
			p.send(`{"return": %s, "id": %s}`, reqs[i].Arguments, reqs[i].ID)
		}
	}()
	ctx := testCtx(t, 5*time.Second)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var got struct{ N int }
			if err := c.Execute(ctx, "echo", map[string]int{"n": i}, &got); err != nil {
				t.Errorf("call %d: %v", i, err)
			} else if got.N != i {
				t.Errorf("call %d got reply for %d", i, got.N)
			}
		}()
	}
	wg.Wait()
}

func TestClientNoGreeting(t *testing.T) {
	check := noLeak(t)
	p, conn := newPeer(t)
	_ = p // never speaks
	_, err := NewClient(testCtx(t, 100*time.Millisecond), conn)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("error = %v, want deadline exceeded", err)
	}
	check()
}

func TestClientBadGreeting(t *testing.T) {
	p, conn := newPeer(t)
	go p.send(`{"return": {}}`)
	_, err := NewClient(testCtx(t, 5*time.Second), conn)
	if !errors.Is(err, ErrClosed) {
		t.Fatalf("error = %v, want ErrClosed", err)
	}
}

func TestClientNeverAnswers(t *testing.T) {
	check := noLeak(t)
	c, p := connect(t)
	late := make(chan peerRequest, 1)
	go func() { late <- p.recv() }()
	start := time.Now()
	err := c.Stop(testCtx(t, 100*time.Millisecond))
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, ErrNoReply) {
		t.Fatalf("error = %v, want deadline exceeded and ErrNoReply", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("call returned after %s", d)
	}
	// The late reply is discarded and the client keeps working.
	r := <-late
	go func() {
		p.send(`{"return": {"status": "stale"}, "id": %s}`, r.ID)
		r := p.recv()
		p.send(`{"return": {"status": "running", "running": true}, "id": %s}`, r.ID)
	}()
	st, err := c.QueryStatus(testCtx(t, 5*time.Second))
	if err != nil || st.Status != "running" {
		t.Fatalf("QueryStatus = %+v, %v", st, err)
	}
	c.Close()
	check()
}

func TestClientPeerNeverReads(t *testing.T) {
	check := noLeak(t)
	c, _ := connect(t)
	err := c.Cont(testCtx(t, 100*time.Millisecond))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("error = %v, want deadline exceeded", err)
	}
	if errors.Is(err, ErrNoReply) {
		t.Errorf("error = %v: ErrNoReply for a command never sent", err)
	}
	c.Close()
	check()
}

func TestClientHangUpMidCall(t *testing.T) {
	check := noLeak(t)
	c, p := connect(t)
	events, cancel := c.Events()
	defer cancel()
	go func() {
		p.recv()
		p.conn.Close()
	}()
	err := c.SystemPowerdown(testCtx(t, 5*time.Second))
	if !errors.Is(err, ErrClosed) {
		t.Fatalf("error = %v, want ErrClosed", err)
	}
	select {
	case <-c.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Done not closed")
	}
	if _, ok := <-events; ok {
		t.Error("event channel open after hang-up")
	}
	if err := c.Cont(testCtx(t, 5*time.Second)); !errors.Is(err, ErrClosed) {
		t.Errorf("later call: %v, want ErrClosed", err)
	}
	if ch, _ := c.Events(); ch != nil {
		if _, ok := <-ch; ok {
			t.Error("subscription after hang-up is open")
		}
	}
	c.Close()
	check()
}

func TestClientQuitClosesConnection(t *testing.T) {
	c, p := connect(t)
	go func() {
		if r := p.recv(); r.Execute != "quit" {
			t.Errorf("command = %q", r.Execute)
		}
		p.conn.Close()
	}()
	if err := c.Quit(testCtx(t, 5*time.Second)); err != nil {
		t.Fatalf("Quit: %v", err)
	}
}

func TestClientCloseFailsPending(t *testing.T) {
	c, p := connect(t)
	got := make(chan peerRequest, 1)
	go func() { got <- p.recv() }()
	errc := make(chan error, 1)
	go func() { errc <- c.Stop(context.Background()) }()
	waitCommand(t, got, "stop")
	c.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("error = %v, want ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("pending call not failed by Close")
	}
}

// qmpCalls are the client's calls, each with the command it sends.
var qmpCalls = []struct {
	cmd  string
	call func(*Client, context.Context) error
}{
	{"stop", (*Client).Stop},
	{"cont", (*Client).Cont},
	{"system_powerdown", (*Client).SystemPowerdown},
	{"quit", (*Client).Quit},
	{"query-status", func(c *Client, ctx context.Context) error { _, err := c.QueryStatus(ctx); return err }},
	{"query-chardev", func(c *Client, ctx context.Context) error {
		var devs []map[string]any
		return c.Execute(ctx, "query-chardev", nil, &devs)
	}},
}

// TestClientCallsEndWithContext: a peer that reads each command and never
// answers, as a QEMU stopped with SIGSTOP does, holds no call past its
// context's deadline or cancellation. The test waits until the peer has
// the command, so the call is waiting for the reply.
func TestClientCallsEndWithContext(t *testing.T) {
	for _, qc := range qmpCalls {
		endsWithContext(t, qc.cmd, func(t *testing.T) silentCall {
			check := noLeak(t)
			c, p := connect(t)
			got := make(chan peerRequest, 1)
			go func() { got <- p.recv() }() // and never answers
			return silentCall{
				call: func(ctx context.Context) error { return qc.call(c, ctx) },
				sent: func() { waitCommand(t, got, qc.cmd) },
				after: func(err error) {
					if !errors.Is(err, ErrNoReply) {
						t.Errorf("error = %v, want ErrNoReply", err)
					}
					c.Close()
					check()
				},
			}
		})
	}
}

// qemuBinary returns the QEMU binary or skips the test.
func qemuBinary(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Skip("qemu-system-x86_64 not installed")
	}
	return path
}

func TestQMPRealQEMU(t *testing.T) {
	bin := qemuBinary(t)
	sock := filepath.Join(t.TempDir(), "qmp.sock")
	cmd := exec.Command(bin, "-machine", "none", "-nodefaults", "-no-user-config", "-display", "none", "-S",
		"-chardev", "socket,id=qmp,path="+escapeOpt(sock)+",server=on,wait=off", "-mon", "chardev=qmp,mode=control")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		cmd.Process.Kill()
		<-exited
	}()
	ctx := testCtx(t, 10*time.Second)
	var c *Client
	for c == nil {
		var err error
		if c, err = Dial(ctx, sock); err != nil {
			if ctx.Err() != nil {
				t.Fatal(err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	defer c.Close()
	st, err := c.QueryStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Running || st.Status != "prelaunch" {
		t.Errorf("status = %+v, want prelaunch and not running", st)
	}
	var qerr *Error
	if err := c.Execute(ctx, "no-such-command", nil, nil); !errors.As(err, &qerr) || qerr.Class != "CommandNotFound" {
		t.Errorf("unknown command: %v", err)
	}
	if err := c.Quit(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		exited <- err
		if err != nil {
			t.Errorf("qemu exit: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("qemu did not exit after quit")
	}
	select {
	case <-c.Done():
	case <-ctx.Done():
		t.Fatal("client not done after qemu exit")
	}
}

// Commands sent with Open's client go out before QEMU's greeting comes
// in, and each reply reaches its own command, in whatever order QEMU
// answers.
func TestClientPipelined(t *testing.T) {
	check := noLeak(t)
	p, conn := newPeer(t)
	ctx := testCtx(t, 5*time.Second)
	c := Open(ctx, conn)
	done := make(chan struct{})
	go func() {
		defer close(done)
		caps, status := p.recv(), p.recv() // nothing sent to the client yet
		if caps.Execute != "qmp_capabilities" || status.Execute != "query-status" {
			t.Errorf("commands %q, %q", caps.Execute, status.Execute)
		}
		p.send("%s", greeting)
		p.send(`{"return": {"status": "prelaunch", "running": false}, "id": %s}`, status.ID)
		p.send(`{"return": {}, "id": %s}`, caps.ID)
	}()
	caps, err := c.Send(ctx, "qmp_capabilities", nil)
	if err != nil {
		t.Fatal(err)
	}
	status, err := c.Send(ctx, "query-status", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := caps.Wait(ctx, nil); err != nil {
		t.Fatal(err)
	}
	var st Status
	if err := status.Wait(ctx, &st); err != nil || st.Status != "prelaunch" {
		t.Fatalf("query-status = %+v, %v", st, err)
	}
	<-done
	c.Close()
	// A command sent once the connection is gone fails at once.
	if _, err := c.Send(ctx, "cont", nil); !errors.Is(err, ErrClosed) {
		t.Errorf("Send after Close: %v, want ErrClosed", err)
	}
	check()
}

// TestClientEndlessMessage: a QEMU that sends one message without end (an
// unterminated string, or whitespace) is cut off once maxQMPMessage bytes
// have come: the connection closes and calls fail, with nothing kept past
// the bound. Many messages that each stay under it are fine.
func TestClientEndlessMessage(t *testing.T) {
	for name, start := range map[string]string{
		"string":     `{"event": "X", "data": "z`,
		"whitespace": ` `,
	} {
		t.Run(name, func(t *testing.T) {
			check := noLeak(t)
			c, p := connect(t)
			// Messages under the bound, together far over it.
			msg := fmt.Sprintf(`{"event": "X", "data": "%s"}`, make([]byte, 0))
			big := `{"event": "BIG", "data": "` + string(bytes.Repeat([]byte("y"), maxQMPMessage/4)) + `"}`
			var written atomic.Int64
			go func() {
				for range 5 {
					if _, err := p.conn.Write([]byte(big)); err != nil {
						return
					}
				}
				_, _ = p.conn.Write([]byte(msg))
				chunk := bytes.Repeat([]byte(start[len(start)-1:]), 64<<10)
				if _, err := p.conn.Write([]byte(start)); err != nil {
					return
				}
				for {
					n, err := p.conn.Write(chunk)
					written.Add(int64(n))
					if err != nil {
						return
					}
				}
			}()
			select {
			case <-c.Done():
			case <-time.After(time.Minute):
				t.Fatal("the client kept reading an endless message")
			}
			if w := written.Load(); w > maxQMPMessage+(128<<10) {
				t.Errorf("read %d bytes of one message", w)
			}
			if err := c.Cont(testCtx(t, 5*time.Second)); !errors.Is(err, ErrClosed) || !strings.Contains(err.Error(), "larger than") {
				t.Errorf("call after the endless message: %v", err)
			}
			c.Close()
			check()
		})
	}
}
