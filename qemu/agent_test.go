package qemu

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
)

// staleOutput is what the fake agent sends before answering a sync: noise,
// a cut-off message, replies to abandoned requests (one after a delimiter
// of its own), a delimiter followed by no JSON, and a delimiter arriving
// inside an unfinished object.
const staleOutput = "junk {\"a\": \"b\\\"}\n" +
	"{\"return\": {\"pid\": 1}}\n" +
	"\xff{\"return\": 1234}\n" +
	"{\"return\": {\"exited\": true}}\n" +
	"\xffnot json\n" +
	"\xff{\"return\": {\"pid\""

// hangUp as a fake agent's reply closes the connection instead.
const hangUp = "\x00hang up"

type fakeRequest struct {
	Execute   string          `json:"execute"`
	Arguments json.RawMessage `json:"arguments"`
}

// fakeAgent is a scripted qemu-guest-agent behind a unix socket. Like
// QEMU's chardev it serves one connection at a time.
type fakeAgent struct {
	t    *testing.T
	path string
	ln   net.Listener

	mu     sync.Mutex
	reply  func(fakeRequest) string // answer to a command; "" says nothing, hangUp hangs up
	stale  string                   // sent before every sync answer
	silent bool                     // ignore everything
	conns  int                      // connections accepted
	cmds   []fakeRequest            // commands other than syncs, in order
	conn   net.Conn                 // the connection being served
	got    chan fakeRequest         // when set, receives each command as it arrives
}

func newFakeAgent(t *testing.T, reply func(fakeRequest) string) *fakeAgent {
	t.Helper()
	path := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeAgent{t: t, path: path, ln: ln, reply: reply, stale: staleOutput}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.serve()
	}()
	t.Cleanup(func() {
		ln.Close()
		f.mu.Lock()
		if f.conn != nil {
			f.conn.Close()
		}
		f.mu.Unlock()
		<-done
	})
	return f
}

func (f *fakeAgent) serve() {
	for {
		conn, err := f.ln.Accept()
		if err != nil {
			return
		}
		f.mu.Lock()
		f.conns++
		f.conn = conn
		f.mu.Unlock()
		f.serveConn(conn)
		conn.Close()
	}
}

func (f *fakeAgent) serveConn(conn net.Conn) {
	br := bufio.NewReader(conn)
	for {
		line, err := br.ReadBytes('\n')
		if err != nil {
			return
		}
		f.mu.Lock()
		silent, stale, reply := f.silent, f.stale, f.reply
		f.mu.Unlock()
		if silent {
			continue
		}
		if i := bytes.LastIndexByte(line, agentDelimiter); i >= 0 {
			// The parser reset makes the agent report a stray byte.
			io.WriteString(conn, `{"error": {"class": "GenericError", "desc": "JSON parse error, stray '\ufffd'"}}`+"\n")
			line = line[i+1:]
		}
		var req fakeRequest
		if err := json.Unmarshal(line, &req); err != nil {
			f.t.Errorf("fake agent: bad request %q: %v", line, err)
			return
		}
		if req.Execute == "guest-sync-delimited" {
			var args struct {
				ID json.RawMessage `json:"id"`
			}
			if err := json.Unmarshal(req.Arguments, &args); err != nil || len(args.ID) == 0 {
				f.t.Errorf("fake agent: bad sync %s", line)
				return
			}
			fmt.Fprintf(conn, "%s\xff{\"return\": %s}\n", stale, args.ID)
			continue
		}
		f.mu.Lock()
		f.cmds = append(f.cmds, req)
		got := f.got
		f.mu.Unlock()
		if got != nil {
			got <- req
		}
		switch r := reply(req); r {
		case "":
		case hangUp:
			return
		default:
			io.WriteString(conn, r+"\n")
		}
	}
}

func (f *fakeAgent) set(fn func(f *fakeAgent)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

func (f *fakeAgent) stats() (conns int, cmds []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.cmds {
		cmds = append(cmds, c.Execute+" "+string(c.Arguments))
	}
	return f.conns, cmds
}

// answer returns a reply function that always says s.
func answer(s string) func(fakeRequest) string {
	return func(fakeRequest) string { return s }
}

func TestAgentCalls(t *testing.T) {
	ping := func(ctx context.Context, a *Agent) (any, error) { return nil, a.Ping(ctx) }
	exec := func(c GuestCommand) func(context.Context, *Agent) (any, error) {
		return func(ctx context.Context, a *Agent) (any, error) { return a.Exec(ctx, c) }
	}
	status := func(ctx context.Context, a *Agent) (any, error) { return a.ExecStatus(ctx, 12) }
	const statusReq = `guest-exec-status {"pid":12}`
	tests := []struct {
		name    string
		reply   string
		call    func(context.Context, *Agent) (any, error)
		wantReq string // "" when no command may reach the agent
		want    any
		wantErr error
	}{
		{name: "ping", reply: `{"return": {}}`, call: ping, wantReq: "guest-ping "},
		{
			name:  "exec",
			reply: `{"return": {"pid": 4711}}`,
			call: exec(GuestCommand{Path: "/bin/sh", Args: []string{"-c", "cat; exit 3"},
				Env: []string{"A=1", "B=<&>"}, Input: []byte("in\x00put")}),
			wantReq: `guest-exec {"path":"/bin/sh","arg":["-c","cat; exit 3"],"env":["A=1","B=\u003c\u0026\u003e"],"input-data":"aW4AcHV0","capture-output":true}`,
			want:    4711,
		},
		{
			name: "exec path only", reply: `{"return": {"pid": 1}}`, call: exec(GuestCommand{Path: "true"}),
			wantReq: `guest-exec {"path":"true","capture-output":true}`, want: 1,
		},
		{name: "exec empty path", call: exec(GuestCommand{}), want: 0, wantErr: errdefs.ErrInvalidArgument},
		{
			name: "exec reply without pid", reply: `{"return": {}}`, call: exec(GuestCommand{Path: "true"}),
			wantReq: `guest-exec {"path":"true","capture-output":true}`, want: 0, wantErr: errdefs.ErrUnknown,
		},
		{
			name:  "exec fails",
			reply: `{"error": {"class": "GenericError", "desc": "Guest agent command failed, error was 'Failed to execute child process “nope” (No such file or directory)'"}}`,
			call:  exec(GuestCommand{Path: "nope"}), wantReq: `guest-exec {"path":"nope","capture-output":true}`,
			want: 0, wantErr: errdefs.ErrUnknown,
		},
		{
			name: "command disabled", reply: `{"error": {"class": "CommandNotFound", "desc": "Command guest-exec has been disabled"}}`,
			call: exec(GuestCommand{Path: "true"}), wantReq: `guest-exec {"path":"true","capture-output":true}`,
			want: 0, wantErr: errdefs.ErrNotImplemented,
		},
		{
			name: "running", reply: `{"return": {"exited": false}}`, call: status, wantReq: statusReq,
			want: GuestExecStatus{},
		},
		{
			name:    "exit 0 with output",
			reply:   `{"return": {"exitcode": 0, "out-data": "aGVsbG8K", "err-data": "d2Fybgo=", "exited": true}}`,
			call:    status,
			wantReq: statusReq,
			want:    GuestExecStatus{Exited: true, Stdout: []byte("hello\n"), Stderr: []byte("warn\n")},
		},
		{
			name: "exit 3", reply: `{"return": {"exitcode": 3, "exited": true}}`, call: status, wantReq: statusReq,
			want: GuestExecStatus{Exited: true, ExitCode: 3},
		},
		{
			name: "killed", reply: `{"return": {"signal": 9, "exited": true, "out-data": ""}}`, call: status, wantReq: statusReq,
			want: GuestExecStatus{Exited: true, ExitCode: 137, Signal: 9, Stdout: []byte{}},
		},
		{
			name:  "truncated",
			reply: `{"return": {"exitcode": 0, "out-data": "eA==", "exited": true, "out-truncated": false, "err-truncated": true}}`,
			call:  status, wantReq: statusReq,
			want: GuestExecStatus{Exited: true, Stdout: []byte("x"), Truncated: true},
		},
		{
			name: "bad base64", reply: `{"return": {"exitcode": 0, "out-data": "!!", "exited": true}}`, call: status,
			wantReq: statusReq, want: GuestExecStatus{}, wantErr: errors.New("any"),
		},
		{
			name: "unknown pid", reply: `{"error": {"class": "GenericError", "desc": "Invalid parameter 'pid'"}}`, call: status,
			wantReq: statusReq, want: GuestExecStatus{}, wantErr: errdefs.ErrUnknown,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeAgent(t, answer(tt.reply))
			a := NewAgent(f.path, nil)
			defer a.Close()
			got, err := tt.call(testCtx(t, 5*time.Second), a)
			switch {
			case tt.wantErr == nil && err != nil:
				t.Fatalf("error: %v", err)
			case tt.wantErr != nil && err == nil:
				t.Fatalf("no error, want %v", tt.wantErr)
			case tt.wantErr != nil && tt.wantErr.Error() != "any" && !errors.Is(err, tt.wantErr):
				t.Errorf("error %v, want %v", err, tt.wantErr)
			}
			if tt.want != nil && !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
			_, cmds := f.stats()
			var wantCmds []string
			if tt.wantReq != "" {
				wantCmds = []string{tt.wantReq}
			}
			if !reflect.DeepEqual(cmds, wantCmds) {
				t.Errorf("agent got %q, want %q", cmds, wantCmds)
			}
		})
	}
}

func TestAgentErrorReply(t *testing.T) {
	f := newFakeAgent(t, answer(`{"error": {"class": "GenericError", "desc": "Invalid parameter 'pid'"}}`))
	a := NewAgent(f.path, nil)
	defer a.Close()
	ctx := testCtx(t, 5*time.Second)
	_, err := a.ExecStatus(ctx, 7)
	var aerr *AgentError
	if !errors.As(err, &aerr) || aerr.Class != "GenericError" || aerr.Desc != "Invalid parameter 'pid'" {
		t.Fatalf("error %v is not the agent's error", err)
	}
	if want := "guest agent guest-exec-status: guest agent error GenericError: Invalid parameter 'pid'"; err.Error() != want {
		t.Errorf("error text %q, want %q", err, want)
	}
	// An error reply leaves the stream in step: the connection is kept.
	f.set(func(f *fakeAgent) { f.reply = answer(`{"return": {}}`) })
	if err := a.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	if conns, _ := f.stats(); conns != 1 {
		t.Errorf("%d connections, want 1", conns)
	}
}

func TestAgentNotReady(t *testing.T) {
	f := newFakeAgent(t, answer(`{"return": {}}`))
	open := false
	a := NewAgent(f.path, func() bool { return open })
	defer a.Close()
	start := time.Now()
	err := a.Ping(context.Background())
	if !errors.Is(err, ErrNoAgent) || !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("error = %v, want ErrNoAgent", err)
	}
	for _, want := range []string{"no guest agent", AgentPortName, "qemu-guest-agent"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if _, err := a.Exec(context.Background(), GuestCommand{Path: "true"}); !errors.Is(err, ErrNoAgent) {
		t.Errorf("Exec: %v, want ErrNoAgent", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("failing took %s", d)
	}
	if conns, _ := f.stats(); conns != 0 {
		t.Errorf("%d connections while the port is closed", conns)
	}
	open = true
	if err := a.Ping(testCtx(t, 5*time.Second)); err != nil {
		t.Fatalf("Ping once open: %v", err)
	}
}

func TestAgentNeverAnswers(t *testing.T) {
	t.Cleanup(noLeak(t)) // runs after the fake agent's cleanup
	f := newFakeAgent(t, answer(`{"return": {}}`))
	f.set(func(f *fakeAgent) { f.silent = true })
	a := NewAgent(f.path, nil)
	start := time.Now()
	err := a.Ping(testCtx(t, 200*time.Millisecond))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("error = %v, want deadline exceeded", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("call returned after %s", d)
	}
	// The next call reconnects and finds the agent answering.
	f.set(func(f *fakeAgent) { f.silent = false })
	if err := a.Ping(testCtx(t, 5*time.Second)); err != nil {
		t.Fatalf("Ping after timeout: %v", err)
	}
	if conns, cmds := f.stats(); conns != 2 || len(cmds) != 1 {
		t.Errorf("%d connections and commands %q, want 2 and one ping", conns, cmds)
	}
	a.Close()
}

func TestAgentCancelWhileWaiting(t *testing.T) {
	f := newFakeAgent(t, answer(""))
	got := f.notify()
	a := NewAgent(f.path, nil)
	defer a.Close()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 2)
	for range 2 { // the second call waits for the first
		go func() { errc <- a.Ping(ctx) }()
	}
	waitCommand(t, got, "guest-ping")
	cancel()
	for range 2 {
		select {
		case err := <-errc:
			if !errors.Is(err, context.Canceled) {
				t.Errorf("error = %v, want canceled", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("call not cancelled")
		}
	}
}

// agentCalls are the agent client's calls, each with the command it sends.
var agentCalls = []struct {
	cmd  string
	call func(context.Context, *Agent) error
}{
	{"guest-ping", func(ctx context.Context, a *Agent) error { return a.Ping(ctx) }},
	{"guest-exec", func(ctx context.Context, a *Agent) error {
		_, err := a.Exec(ctx, GuestCommand{Path: "true"})
		return err
	}},
	{"guest-exec-status", func(ctx context.Context, a *Agent) error { _, err := a.ExecStatus(ctx, 7); return err }},
}

// TestAgentCallsEndWithContext: an agent that syncs, reads each command
// and never answers it holds no call past its context's deadline or
// cancellation; the next call reconnects. The test waits until the agent
// has the command, so the call is waiting for the reply.
func TestAgentCallsEndWithContext(t *testing.T) {
	for _, ac := range agentCalls {
		endsWithContext(t, ac.cmd, func(t *testing.T) silentCall {
			t.Cleanup(noLeak(t)) // runs after the fake agent's cleanup
			f := newFakeAgent(t, answer(""))
			got := f.notify()
			a := NewAgent(f.path, nil)
			t.Cleanup(func() { a.Close() })
			return silentCall{
				call: func(ctx context.Context) error { return ac.call(ctx, a) },
				sent: func() { waitCommand(t, got, ac.cmd) },
				after: func(error) {
					f.set(func(f *fakeAgent) { f.reply = answer(`{"return": {}}`) })
					if err := a.Ping(testCtx(t, 5*time.Second)); err != nil {
						t.Fatalf("Ping after the silence: %v", err)
					}
					if conns, _ := f.stats(); conns != 2 {
						t.Errorf("%d connections, want 2: the abandoned one is dropped", conns)
					}
				},
			}
		})
	}
}

// notify makes the fake agent report each command as it arrives.
func (f *fakeAgent) notify() <-chan fakeRequest {
	ch := make(chan fakeRequest, 16)
	f.set(func(f *fakeAgent) { f.got = ch })
	return ch
}

func TestAgentPeerHangsUp(t *testing.T) {
	f := newFakeAgent(t, func(r fakeRequest) string {
		if r.Execute == "guest-exec" {
			return hangUp
		}
		return `{"return": {}}`
	})
	a := NewAgent(f.path, nil)
	defer a.Close()
	ctx := testCtx(t, 5*time.Second)
	_, err := a.Exec(ctx, GuestCommand{Path: "true"})
	if !errors.Is(err, errdefs.ErrUnavailable) || !errors.Is(err, io.EOF) {
		t.Fatalf("error = %v, want unavailable: EOF", err)
	}
	if err := a.Ping(ctx); err != nil {
		t.Fatalf("Ping after hang-up: %v", err)
	}
	if conns, _ := f.stats(); conns != 2 {
		t.Errorf("%d connections, want 2", conns)
	}
}

func TestAgentNoSocket(t *testing.T) {
	a := NewAgent(filepath.Join(t.TempDir(), "missing.sock"), nil)
	defer a.Close()
	if err := a.Ping(testCtx(t, 5*time.Second)); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("error = %v, want unavailable", err)
	}
}

func TestAgentClose(t *testing.T) {
	t.Cleanup(noLeak(t)) // runs after the fake agent's cleanup
	f := newFakeAgent(t, answer(""))
	got := f.notify()
	a := NewAgent(f.path, nil)
	errc := make(chan error, 1)
	go func() { errc <- a.Ping(context.Background()) }()
	waitCommand(t, got, "guest-ping")
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, ErrAgentClosed) {
			t.Errorf("interrupted call: %v, want ErrAgentClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not interrupt the call")
	}
	if err := a.Ping(context.Background()); !errors.Is(err, ErrAgentClosed) || !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("Ping after Close: %v, want ErrAgentClosed", err)
	}
	if err := a.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestReadObject(t *testing.T) {
	tests := []struct {
		in      string
		want    string
		wantErr error
	}{
		{" \r\n{\"a\": {\"b\": [1, {}]}}{\"next\": 1}", `{"a": {"b": [1, {}]}}`, nil},
		{`{"s": "}{\"\\"}tail`, `{"s": "}{\"\\"}`, nil},
		{"{\"a\": 1\xff{}", "", errDelimiter},
		{"\n\xff", "", errDelimiter},
		{"[1]", "", errNotObject},
		{`{"a": `, "", io.EOF},
		{`{"a": "` + strings.Repeat("x", 100) + `"}`, "", errTooLarge},
		{strings.Repeat(" ", 100) + "{}", "", errTooLarge},
	}
	for _, tt := range tests {
		got, _, err := readObject(bufio.NewReader(strings.NewReader(tt.in)), 64, nil)
		if !errors.Is(err, tt.wantErr) || string(got) != tt.want {
			t.Errorf("readObject(%q) = %q, %v; want %q, %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

// TestAgentPortFloods: a guest that writes zeros (or anything but the
// sync's answer) to the agent port without end makes a call fail once
// maxAgentSkip bytes have been skipped, keeping none of them; the
// connection is dropped, and the next call dials again.
func TestAgentPortFloods(t *testing.T) {
	for name, junk := range map[string][]byte{
		"zeros":         make([]byte, 64<<10),
		"delimiters":    bytes.Repeat([]byte{agentDelimiter}, 64<<10),
		"open objects":  bytes.Repeat([]byte("\xff{\"a\": \""+strings.Repeat("x", 1000)), 64),
		"stale replies": bytes.Repeat([]byte("\xff{\"return\": 1}"), 4096),
		"whitespace":    append([]byte{agentDelimiter}, bytes.Repeat([]byte(" "), 64<<10)...),
	} {
		t.Run(name, func(t *testing.T) {
			client, server := net.Pipe()
			defer server.Close()
			a := NewAgent("/nonexistent/agent.sock", nil)
			a.conn, a.br = client, bufio.NewReader(client)
			var written atomic.Int64
			go func() {
				// Read the sync and whatever follows; flood until hung up.
				go func() { _, _ = io.Copy(io.Discard, server) }()
				for {
					n, err := server.Write(junk)
					written.Add(int64(n))
					if err != nil {
						return
					}
				}
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			err := a.Ping(ctx)
			runtime.ReadMemStats(&after)
			if err == nil || ctx.Err() != nil || !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "more than 1048576 bytes") {
				t.Fatalf("Ping = %v, want unavailable after %d bytes", err, maxAgentSkip)
			}
			// As the task service's caller sees it, through ttrpc: one line.
			if msg := errgrpc.ToNative(errgrpc.ToGRPC(err)).Error(); strings.Contains(msg, "\n") {
				t.Errorf("the error crosses ttrpc as more than one line: %q", msg)
			}
			a.mu.Lock()
			kept := a.conn != nil
			a.mu.Unlock()
			if kept {
				t.Error("the connection was kept")
			}
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > maxAgentSkip/8 {
				t.Errorf("the call allocated %d bytes while skipping %d", alloc, written.Load())
			}
			if w := written.Load(); w > maxAgentSkip+int64(len(junk))+8192 {
				t.Errorf("the peer wrote %d bytes before the call gave up", w)
			}
		})
	}
}
