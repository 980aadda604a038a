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
	"reflect"
	"strings"
	"testing"
)

// agentReplySeeds are FuzzAgentReply inputs: the call (by op), what the
// agent sent before the sync answer, and its reply to the command.
func agentReplySeeds() []struct {
	op           uint8
	stale, reply string
} {
	return []struct {
		op           uint8
		stale, reply string
	}{
		{0, "", `{"return": {}}`},
		{1, "", `{"return": {"pid": 4242}}` + "\n"},
		{1, "", `{"return": {}}`},
		{2, "", `{"return": {"exited": true, "exitcode": 3, "out-data": "aGkK", "err-data": "", "out-truncated": true}}`},
		{2, "", `{"return": {"exited": true, "signal": 9}}`},
		{2, "", `{"return": {"exited": false}}`},
		{2, "", `{"return": {"exited": true, "out-data": "not base64!"}}`},
		{2, "", `{"return": {"exited": true, "exitcode": 9223372036854775807, "signal": 9223372036854775807}}`},
		{0, "", `{"error": {"class": "CommandNotFound", "desc": "no"}}`},
		{0, "", `{"error": null, "return": null}`},
		{0, "", `{}`},
		{0, "", `[]`},
		{0, "", "{\"return\": {}\xff}"},
		{0, "", `{"return": {"s": "}{\"\\"}}`},
		{0, "", `{"return": `},
		{0, staleOutput, `{"return": {}}`},
		{1, "\xff{\"a\": \"\\", `{"return": {"pid": 1}}`},
		{2, "\xff{]\xff[\xff\xff  \xff{\"return\": 1}", `{"return": {"exited": true}}`},
	}
}

// FuzzAgentReply plays a guest agent that sends fuzzed bytes before it
// answers the sync and as its reply to a command; the guest is not to be
// trusted. A call must end, come out the same whatever stale output came
// before the sync, and keep the connection only when the stream is still
// in step.
func FuzzAgentReply(f *testing.F) {
	for _, s := range agentReplySeeds() {
		f.Add(s.op, []byte(s.stale), []byte(s.reply))
	}
	f.Fuzz(func(t *testing.T, op uint8, stale, reply []byte) {
		got := fuzzAgentCall(t, op, stale, reply)
		if len(stale) == 0 {
			return
		}
		if want := fuzzAgentCall(t, op, nil, reply); !reflect.DeepEqual(got, want) {
			t.Fatalf("stale output %q changes the outcome: %+v, without it %+v", stale, got, want)
		}
	})
}

// agentOutcome is what a call gave, comparable across runs.
type agentOutcome struct {
	Err    string
	Result any
	Kept   bool // the connection is kept for the next call
}

// fuzzAgentCall makes call op through an Agent on a pipe to a peer that
// sends stale and the sync answer, then reply, then hangs up.
func fuzzAgentCall(t *testing.T, op uint8, stale, reply []byte) agentOutcome {
	t.Helper()
	client, server := net.Pipe()
	a := NewAgent("/nonexistent/agent.sock", nil)
	a.conn, a.br = client, bufio.NewReader(client)
	peerDone := make(chan struct{})
	cmds := make(chan string, 1)
	go func() {
		defer close(peerDone)
		defer server.Close()
		fuzzAgentPeer(server, stale, reply, cmds)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), fuzzHang)
	defer cancel()
	var out agentOutcome
	var err error
	switch op % 3 {
	case 0:
		err = a.Ping(ctx)
	case 1:
		var pid int
		pid, err = a.Exec(ctx, GuestCommand{Path: "/bin/true"})
		out.Result = pid
	case 2:
		var st GuestExecStatus
		st, err = a.ExecStatus(ctx, 7)
		out.Result = st
		if st.Signal != 0 && st.ExitCode != 128+st.Signal {
			t.Errorf("signal %d with exit code %d", st.Signal, st.ExitCode)
		}
	}
	if ctx.Err() != nil {
		t.Fatalf("hang: the call did not end within %v: %v", fuzzHang, err)
	}
	a.mu.Lock()
	out.Kept = a.conn != nil
	a.mu.Unlock()
	var aerr *AgentError
	switch {
	case err == nil && !out.Kept:
		t.Errorf("a call that succeeded dropped the connection")
	case errors.As(err, &aerr) && !out.Kept:
		t.Errorf("an error reply (%v) dropped the connection", err)
	}
	if err != nil {
		out.Err = err.Error()
		out.Result = nil
	}
	if err := a.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	waitFor(t, peerDone, "agent peer")
	select {
	case cmd := <-cmds:
		if want := []string{"guest-ping", "guest-exec", "guest-exec-status"}[op%3]; cmd != want {
			t.Errorf("agent got %q, want %q", cmd, want)
		}
	default:
		t.Errorf("the command never reached the agent")
	}
	return out
}

// fuzzAgentPeer answers the sync request on conn with stale, a delimiter
// and the sync's id, reports the command that follows and sends reply.
func fuzzAgentPeer(conn net.Conn, stale, reply []byte, cmds chan<- string) {
	lines := make(chan []byte, 2)
	go func() {
		defer close(lines)
		br := bufio.NewReader(conn)
		for range 2 {
			line, err := br.ReadBytes('\n')
			if err != nil {
				return
			}
			lines <- line
		}
		_, _ = io.Copy(io.Discard, br)
	}()
	line, ok := <-lines
	if !ok {
		return
	}
	var sync struct {
		Execute   string `json:"execute"`
		Arguments struct {
			ID int64 `json:"id"`
		} `json:"arguments"`
	}
	if json.Unmarshal(bytes.TrimPrefix(line, []byte{agentDelimiter}), &sync) != nil || sync.Execute != "guest-sync-delimited" {
		return
	}
	answer := fmt.Appendf(append(append([]byte(nil), stale...), agentDelimiter), `{"return": %d}`, sync.Arguments.ID)
	if _, err := conn.Write(answer); err != nil {
		return
	}
	if line, ok = <-lines; !ok {
		return
	}
	var cmd fakeRequest
	if json.Unmarshal(line, &cmd) == nil {
		cmds <- cmd.Execute
	}
	_, _ = conn.Write(reply)
}

// agentReadObjectSeeds are FuzzAgentReadObject inputs: objects with
// nesting, escapes and delimiters in odd places, and what is not an object.
func agentReadObjectSeeds() []string {
	return []string{
		" \r\n{\"a\": {\"b\": [1, {}]}}{\"next\": 1}", `{"s": "}{\"\\"}tail`, "{\"a\": 1\xff{}", "\n\xff", "[1]", `{"a": `,
		`{"a": "\u00ff\"\\\/"}`, `{"a": [}`, `{]`, "{\"a\": \"\x80\xfe\"}", `{"a":1}}`, "\t{}", staleOutput,
	}
}

// FuzzAgentReadObject checks the byte-by-byte reader of agent replies
// against encoding/json: whenever the input starts with a JSON object
// without a delimiter byte in it, readObject returns exactly that object
// and consumes nothing after it.
func FuzzAgentReadObject(f *testing.F) {
	for _, s := range agentReadObjectSeeds() {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		src := bytes.NewReader(data)
		br := bufio.NewReader(src)
		raw, n, err := readObject(br, maxAgentReply, nil)
		body := bytes.TrimLeft(data, " \t\r\n")
		if consumed := len(data) - src.Len() - br.Buffered(); consumed != n {
			t.Fatalf("readObject(%q) consumed %d bytes, says %d", data, consumed, n)
		}
		if err == nil {
			if !bytes.HasPrefix(body, raw) || len(raw) < 2 || raw[0] != '{' || bytes.IndexByte(raw, agentDelimiter) >= 0 {
				t.Fatalf("readObject(%q) = %q", data, raw)
			}
			if n != len(data)-len(body)+len(raw) {
				t.Fatalf("readObject(%q) consumed %d bytes for %q", data, n, raw)
			}
		}
		// Under a smaller bound, the same object or errTooLarge having
		// consumed no more than the bound.
		if max := len(data) / 2; max > 0 {
			br := bufio.NewReader(bytes.NewReader(data))
			sraw, sn, serr := readObject(br, max, nil)
			switch {
			case errors.Is(serr, errTooLarge):
				if sn != max {
					t.Fatalf("readObject(%q, %d) consumed %d bytes past its bound", data, max, sn)
				}
			case serr == nil && (err != nil || !bytes.Equal(sraw, raw)), serr != nil && err == nil:
				t.Fatalf("readObject(%q, %d) = %q, %v; without the bound %q, %v", data, max, sraw, serr, raw, err)
			}
		}
		if len(body) == 0 || body[0] != '{' {
			return
		}
		dec := json.NewDecoder(bytes.NewReader(body))
		var obj json.RawMessage
		if dec.Decode(&obj) != nil || bytes.IndexByte(obj, agentDelimiter) >= 0 {
			return
		}
		if err != nil || !bytes.Equal(raw, obj) {
			t.Fatalf("readObject(%q) = %q, %v; encoding/json reads the object %q", data, raw, err, obj)
		}
	})
}

// agentSyncSeeds are FuzzAgentSync inputs: what the port carries before
// the answer to a sync.
func agentSyncSeeds() []string {
	return []string{
		"", "\x00\x00\x00", staleOutput, "\xff{\"return\": 12}\n", "\xff{\"a\": \"", "\xff{\"return\": 42", "\xff{]", "\xff\xff  \xff[",
		"\xff{\"s\": \"" + strings.Repeat("x", 2*maxSyncReply) + "\"}", "\xff" + strings.Repeat(" ", 2*maxSyncReply),
		"\xff{\"return\": 42}", "\xff\xff{\"return\": 42}",
	}
}

// FuzzAgentSync plays a port that carries fuzzed bytes, then the answer
// to the sync: awaitSync must find an answer that comes within its bound
// of skipped bytes (the fuzzed bytes may hold one, or be cut anywhere) and
// read nothing past it; more than the bound fails with errSkipLimit having
// read no more than the bound, a reader's buffer and one sync answer.
func FuzzAgentSync(f *testing.F) {
	for _, s := range agentSyncSeeds() {
		f.Add([]byte(s), uint32(0))
	}
	f.Add([]byte("\x00"), uint32(maxAgentSkip+1))
	f.Add([]byte("\xff{\"a\": 1}"), uint32(maxAgentSkip))
	f.Fuzz(func(t *testing.T, junk []byte, pad uint32) {
		const id = 42
		pad %= 2 * maxAgentSkip
		answer := []byte("\xff{\"return\": 42}")
		stream := io.MultiReader(bytes.NewReader(junk), io.LimitReader(zeros{}, int64(pad)), bytes.NewReader(answer))
		total := len(junk) + int(pad) + len(answer)
		cr := &countingReader{r: stream}
		br := bufio.NewReader(cr)
		err := awaitSync(br, id)
		consumed := cr.n - br.Buffered()
		const slack = 4096 + maxSyncReply
		switch {
		case err == nil:
			if consumed > total {
				t.Fatalf("read %d bytes of %d", consumed, total)
			}
		case errors.Is(err, errSkipLimit):
			if total <= maxAgentSkip {
				t.Fatalf("gave up on %d bytes, under the bound", total)
			}
			if consumed > maxAgentSkip+slack {
				t.Fatalf("read %d bytes before giving up", consumed)
			}
		default:
			if total <= maxAgentSkip {
				t.Fatalf("awaitSync(%q + %d zeros) = %v", junk, pad, err)
			}
		}
	})
}

// zeros is an endless stream of zero bytes, as from /dev/zero.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// countingReader counts what is read through it.
type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}
