package shim

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"
)

// memoryVM is a fakeVM whose guest reports its memory: line, or err, or
// nothing until ctx ends (a QMP that hangs).
type memoryVM struct {
	*fakeVM
	line string
	err  error
	hang bool
}

func (v *memoryVM) GuestMemory(ctx context.Context) (string, error) {
	if v.hang {
		<-ctx.Done()
		return "", ctx.Err()
	}
	return v.line, v.err
}

// The report lists the guests that report, in order, each bounded in
// time; VMs that cannot report (a pod sandbox) are left out.
func TestGuestMemoryReport(t *testing.T) {
	s, _, _, _ := newService(t)
	failed := errors.New("qmp: device not found")
	s.mu.Lock()
	s.tasks["c"] = &task{id: "c", vm: &memoryVM{fakeVM: newFakeVM(4242), line: "total=512.0MiB free=100.0MiB"}}
	s.tasks["a"] = &task{id: "a", vm: &memoryVM{fakeVM: newFakeVM(4242)}}
	s.tasks["b"] = &task{id: "b", vm: newFakeVM(4242)}
	s.tasks["d"] = &task{id: "d", vm: &memoryVM{fakeVM: newFakeVM(4242), err: failed}}
	s.tasks["e"] = &task{id: "e", vm: &memoryVM{fakeVM: newFakeVM(4242), hang: true}}
	s.mu.Unlock()
	t.Cleanup(func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, id := range []string{"a", "b", "c", "d", "e"} {
			delete(s.tasks, id)
		}
	})
	began := time.Now()
	got := s.guestMemory(context.Background())
	if took := time.Since(began); took > guestMemoryTimeout+time.Second {
		t.Errorf("the report took %v: a hung guest held it past its bound", took)
	}
	want := []guestMemoryReport{
		{id: "a", line: "none reported (no balloon, statistics off, or no balloon driver in the guest)"},
		{id: "c", line: "total=512.0MiB free=100.0MiB"},
		{id: "d", err: failed},
		{id: "e", err: context.DeadlineExceeded},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}
}
