package qemu

import (
	"encoding/json"
	"testing"
)

// TestIOPauseEvents checks that a disk error with action stop pauses, a
// second one keeps the first as the cause, RESUME clears, other actions
// and bad data change nothing, and each change closes the channel given
// before it, and only a change does.
func TestIOPauseEvents(t *testing.T) {
	ev := func(name, data string) Event { return Event{Name: name, Data: json.RawMessage(data)} }
	var s ioState
	p, ch := s.get()
	if p != nil {
		t.Fatalf("paused from the start: %v", p)
	}
	for _, e := range []Event{
		ev("BLOCK_IO_ERROR", `{"device": "", "node-name": "root", "operation": "write", "action": "report", "nospace": true}`),
		ev("BLOCK_IO_ERROR", `{"device": "root", "operation": "write", "action": "stop",`),
		ev("BLOCK_IO_ERROR", ``),
		ev("RESUME", ``),
		ev("STOP", ``),
	} {
		s.ioEvent(e)
	}
	select {
	case <-ch:
		t.Fatal("no change signalled one")
	default:
	}
	s.ioEvent(ev("BLOCK_IO_ERROR", `{"device": "", "node-name": "root", "operation": "write", "action": "stop", "nospace": true, "reason": "No space left on device"}`))
	<-ch
	p, ch = s.get()
	if p == nil || p.String() != "disk root: write failed: No space left on device" || !p.NoSpace || p.At.IsZero() {
		t.Fatalf("pause = %+v", p)
	}
	s.ioEvent(ev("BLOCK_IO_ERROR", `{"device": "seed", "operation": "read", "action": "stop", "reason": "Input/output error"}`))
	if q, _ := s.get(); q != p {
		t.Errorf("a second error replaced the cause: %v", q)
	}
	select {
	case <-ch:
		t.Fatal("a second error while paused signalled a change")
	default:
	}
	s.ioEvent(ev("RESUME", ``))
	<-ch
	if p, _ := s.get(); p != nil {
		t.Fatalf("still paused after RESUME: %v", p)
	}
}

// TestIOPauseString checks the one-line cause when QEMU leaves out the
// reason.
func TestIOPauseString(t *testing.T) {
	for _, tc := range []struct {
		p    IOPause
		want string
	}{
		{IOPause{Node: "root", Operation: "write", NoSpace: true}, "disk root: write failed: No space left on device"},
		{IOPause{Node: "blk0", Operation: "read"}, "disk blk0: read failed: host i/o error"},
	} {
		if got := tc.p.String(); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.p, got, tc.want)
		}
	}
}
