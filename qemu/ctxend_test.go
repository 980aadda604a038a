package qemu

import (
	"context"
	"errors"
	"testing"
	"time"
)

// silentCall is a call to a peer that reads its command and never
// answers, as a QEMU or a guest agent stopped with SIGSTOP does.
type silentCall struct {
	call  func(context.Context) error // the call
	sent  func()                      // returns once the peer has the command
	after func(err error)             // checks the call's error and the client after it
}

// endsWithContext runs the subtests name/deadline and name/cancel. In
// each, start sets up a peer and a silentCall, and the call runs with a
// context that ends by its deadline or is cancelled once the peer has the
// command, so the call waits for a reply when its context ends. The call
// must then return, within 5 s, an error wrapping the context's; after
// checks the rest.
func endsWithContext(t *testing.T, name string, start func(t *testing.T) silentCall) {
	for _, how := range []string{"deadline", "cancel"} {
		t.Run(name+"/"+how, func(t *testing.T) {
			sc := start(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			want := context.Canceled
			if how == "deadline" {
				ctx, cancel = context.WithTimeout(ctx, 500*time.Millisecond)
				defer cancel()
				want = context.DeadlineExceeded
			}
			errc := make(chan error, 1)
			go func() { errc <- sc.call(ctx) }()
			sc.sent()
			if how == "cancel" {
				cancel()
			}
			select {
			case err := <-errc:
				if !errors.Is(err, want) {
					t.Errorf("error = %v, want %v", err, want)
				}
				sc.after(err)
			case <-time.After(5 * time.Second):
				t.Fatalf("%s without a reply outlived its context", name)
			}
		})
	}
}

// command is a request a peer read: a QMP command or a guest agent's.
type command interface{ command() string }

func (r peerRequest) command() string { return r.Execute }
func (r fakeRequest) command() string { return r.Execute }

// waitCommand waits until the peer has read a command and checks it is
// cmd.
func waitCommand[R command](t *testing.T, got <-chan R, cmd string) {
	t.Helper()
	select {
	case r := <-got:
		if r.command() != cmd {
			t.Fatalf("peer got %q, want %q", r.command(), cmd)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("peer never got %s", cmd)
	}
}
