package qemu

import (
	"encoding/json"
	"fmt"
	"sync"
	"time"
)

// IOPause is a disk request that failed on the host and made QEMU pause
// the VM (its werror/rerror action "stop", the default for a full host
// file system): the guest waits, its data consistent, until the VM is
// resumed and QEMU retries the request.
type IOPause struct {
	Node      string    // the block node or device
	Operation string    // "read" or "write"
	NoSpace   bool      // the host file system is full
	Reason    string    // the host's error, as QEMU words it
	At        time.Time // when QEMU reported it
}

// String says what paused the VM in one line.
func (p *IOPause) String() string {
	why := p.Reason
	if p.NoSpace && why == "" {
		why = "No space left on device"
	}
	if why == "" {
		why = "host i/o error"
	}
	return fmt.Sprintf("disk %s: %s failed: %s", p.Node, p.Operation, why)
}

// ioState is whether the VM is paused by a disk error; each change closes
// the channel handed out before it.
type ioState struct {
	mu      sync.Mutex
	pause   *IOPause
	changed chan struct{}
}

// get returns the pause, if any, and a channel closed at the next change.
func (s *ioState) get() (*IOPause, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.changed == nil {
		s.changed = make(chan struct{})
	}
	return s.pause, s.changed
}

// set records p (nil: running again) and signals the change, if it is one.
// A second error while paused keeps the first, which is the cause.
func (s *ioState) set(p *IOPause) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if (p == nil) == (s.pause == nil) {
		return
	}
	s.pause = p
	if s.changed != nil {
		close(s.changed)
	}
	s.changed = make(chan struct{})
}

// ioEvent applies a QMP event to the state: BLOCK_IO_ERROR with action
// "stop" pauses, RESUME (the vCPUs run again) clears.
func (s *ioState) ioEvent(ev Event) {
	switch ev.Name {
	case "BLOCK_IO_ERROR":
		var d faultEvent
		if err := json.Unmarshal(ev.Data, &d); err != nil || d.Action != "stop" {
			return
		}
		node := d.NodeName
		if node == "" {
			node = d.Device
		}
		s.set(&IOPause{Node: node, Operation: d.Operation, NoSpace: d.NoSpace, Reason: d.Reason, At: time.Now()})
	case "RESUME":
		s.set(nil)
	}
}

// IOPause returns the disk error that holds the VM paused, nil while none
// does, and a channel closed when that changes.
func (v *VM) IOPause() (*IOPause, <-chan struct{}) { return v.io.get() }
