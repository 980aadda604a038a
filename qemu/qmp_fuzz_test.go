package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net"
	"testing"
	"time"
)

// fuzzCallTimeout bounds each call a fuzz iteration makes: the peer
// may never answer, and most fuzzed peers do not. An answer that is there
// arrives in microseconds; a longer wait only slows the fuzzer down.
const fuzzCallTimeout = 5 * time.Millisecond

// fuzzHang is how long a fuzz iteration waits for anything that must end;
// the fuzzer itself does not notice an input that hangs.
const fuzzHang = 5 * time.Second

// qmpSeed is one FuzzQMPStream input: what QEMU sends first, then after
// each of the client's three commands (qmp_capabilities, query-status and
// query-name, ids 1 to 3).
type qmpSeed struct{ greeting, caps, status, extra string }

// qmpSeeds are valid and tricky FuzzQMPStream inputs.
func qmpSeeds() []qmpSeed {
	ok := `{"return": {}, "id": "1"}` + "\r\n"
	status := `{"return": {"status": "running", "singlestep": false, "running": true}, "id": "2"}` + "\r\n"
	name := `{"return": {"name": "vm"}, "id": "3"}` + "\r\n"
	ev := `{"timestamp": {"seconds": 1700000000, "microseconds": 123}, "event": "STOP"}` + "\r\n"
	return []qmpSeed{
		{greeting + "\r\n", ok, status, name},
		{greeting + "\r\n", ok, ev + status + ev, ev + `{"event": "SHUTDOWN", "data": {"guest": true, "reason": "guest-shutdown"}}` + name},
		{greeting + "\r\n", ok, `{"error": {"class": "GenericError", "desc": "nope"}, "id": "2"}`, `{"error": {"class": "CommandNotFound", "desc": "x"}, "id": "3"}`},
		{greeting + "\r\n", `{"error": {"class": "GenericError", "desc": "no caps"}, "id": "1"}`, "", ""},
		{greeting + ok, "", status + name, ""},
		{`{"return": {}}`, "", "", ""},
		{`{"QMP": null}`, ok, "", ""},
		{greeting, `{"return": {}, "id": 1}` + ok, `{"return": [], "id": "2"}`, `{"return": 5, "id": "3"}`},
		{greeting, ok, `{"timestamp": {"seconds": -1, "microseconds": 9223372036854775807}, "event": "X", "data": 7}` + status, `{"id": "3"}{"return": {}, "id": "3"}`},
		{greeting, ok, `{"return": {}, "id": "2"`, ""},
		{greeting, ok, "{\"event\": \"\xff\"}" + status, "]"},
		{"", "", "", ""},
		{"\x00", "", "", ""},
	}
}

// FuzzQMPStream plays a QMP peer that sends fuzzed bytes as its greeting
// and its answers to the client's commands, and checks that the client
// never hangs, hands out only named events, ends every call after Close
// with ErrClosed and closes its event channels and the connection.
func FuzzQMPStream(f *testing.F) {
	for _, s := range qmpSeeds() {
		f.Add([]byte(s.greeting), []byte(s.caps), []byte(s.status), []byte(s.extra))
	}
	f.Fuzz(func(t *testing.T, greet, caps, status, extra []byte) {
		conn, peerDone := fuzzQMPPeer([][]byte{greet, caps, status, extra})
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), fuzzCallTimeout)
		c, err := NewClient(ctx, conn)
		cancel()
		if err != nil {
			// NewClient closes conn on error, which ends the peer.
			waitFor(t, peerDone, "peer after NewClient failed")
			return
		}
		events, _ := c.Events()
		drained := make(chan struct{})
		go func() {
			defer close(drained)
			for ev := range events {
				if ev.Name == "" || (len(ev.Data) > 0 && !json.Valid(ev.Data)) {
					t.Errorf("event %q with data %q", ev.Name, ev.Data)
				}
			}
		}()
		ctx, cancel = context.WithTimeout(context.Background(), fuzzCallTimeout)
		_, _ = c.QueryStatus(ctx)
		cancel()
		ctx, cancel = context.WithTimeout(context.Background(), fuzzCallTimeout)
		var name map[string]any
		_ = c.Execute(ctx, "query-name", nil, &name)
		cancel()
		closed := make(chan struct{})
		go func() {
			defer close(closed)
			c.Close()
		}()
		waitFor(t, closed, "Close")
		waitFor(t, c.Done(), "Done after Close")
		waitFor(t, drained, "event channel to close")
		waitFor(t, peerDone, "peer after Close")
		if err := c.Execute(context.Background(), "stop", nil, nil); !errors.Is(err, ErrClosed) {
			t.Errorf("Execute after Close = %v, want ErrClosed", err)
		}
		if err := c.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			t.Errorf("second Close = %v", err)
		}
	})
}

// fuzzQMPPeer serves the client end of a pipe: it sends segs[0] at once
// and each further segment once the client has sent one more line (a
// command), then hangs up. The channel is closed when the peer is done.
func fuzzQMPPeer(segs [][]byte) (net.Conn, <-chan struct{}) {
	client, server := net.Pipe()
	lines := make(chan struct{}, len(segs))
	done := make(chan struct{})
	go func() {
		defer close(lines)
		br := bufio.NewReader(server)
		for {
			if _, err := br.ReadBytes('\n'); err != nil {
				return
			}
			lines <- struct{}{}
		}
	}()
	go func() {
		defer close(done)
		defer server.Close()
		for i, seg := range segs {
			if i > 0 {
				if _, ok := <-lines; !ok {
					return
				}
			}
			if _, err := server.Write(seg); err != nil {
				return
			}
		}
	}()
	return client, done
}

// waitFor fails t when ch is not closed within fuzzHang.
func waitFor(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(fuzzHang):
		t.Fatalf("hang: waited %v for %s", fuzzHang, what)
	}
}
