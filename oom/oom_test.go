package oom

import (
	"context"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

const (
	// waitTimeout bounds how long a test waits for the watcher.
	waitTimeout = 30 * time.Second
	// leakTimeout bounds how long a test waits for goroutines and fds to go.
	leakTimeout = 5 * time.Second
)

// TestMain runs the tests, or, in the children the real OOM tests start,
// the allocation that gets one killed or the keeper that waits.
func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		allocate()
		return
	}
	if os.Getenv(keeperEnv) != "" {
		keep()
		return
	}
	// Start the runtime's poller now, so its fds are not taken for leaks.
	r, w, err := os.Pipe()
	if err == nil {
		r.Close()
		w.Close()
	}
	os.Exit(m.Run())
}

// leakCheck fails t if, after t's other cleanups, goroutines or fds
// remain that were not there when it was called. Call it first.
func leakCheck(t *testing.T) {
	t.Helper()
	goroutines, fds := runtime.NumGoroutine(), openFDs(t)
	t.Cleanup(func() {
		deadline := time.Now().Add(leakTimeout)
		for {
			g, f := runtime.NumGoroutine(), openFDs(t)
			if g <= goroutines && f <= fds {
				return
			}
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<20)
				buf = buf[:runtime.Stack(buf, true)]
				t.Errorf("leak: %d goroutines (%d before), %d fds (%d before)\n%s", g, goroutines, f, fds, buf)
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}

// openFDs counts the process's open file descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatalf("list fds: %v", err)
	}
	return len(entries)
}

// startWatch watches dir with a hook that records reads, and closes the
// watcher when t ends.
func startWatch(t *testing.T, dir string) (*Watcher, *reads) {
	t.Helper()
	r := &reads{ch: make(chan string, 4096)}
	w, err := watch(context.Background(), dir, hooks{read: r.hook})
	if err != nil {
		t.Fatalf("watch: %v", err)
	}
	t.Cleanup(func() {
		if err := w.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return w, r
}

// reads collects what the watch loop read from the counter file.
type reads struct {
	ch chan string
}

// hook is the watcher's read hook.
func (r *reads) hook(data []byte) {
	select {
	case r.ch <- string(data):
	default:
	}
}

// waitFor waits until the loop has read content containing want.
func (r *reads) waitFor(t *testing.T, want string) {
	t.Helper()
	timeout := time.After(waitTimeout)
	for {
		select {
		case got := <-r.ch:
			if strings.Contains(got, want) {
				return
			}
		case <-timeout:
			t.Fatalf("the watcher never read %q", want)
		}
	}
}

// waitEvent waits for a value on w's Events.
func waitEvent(t *testing.T, w *Watcher) {
	t.Helper()
	select {
	case _, ok := <-w.Events():
		if !ok {
			t.Fatalf("events closed before an oom event (err %v)", w.Err())
		}
	case <-time.After(waitTimeout):
		t.Fatal("no oom event")
	}
}

// noEvent fails t if a value is waiting on w's Events.
func noEvent(t *testing.T, w *Watcher) {
	t.Helper()
	select {
	case _, ok := <-w.Events():
		t.Fatalf("unexpected event (open %v)", ok)
	default:
	}
}

// waitEnd waits for w's Events to be closed, taking any values before.
func waitEnd(t *testing.T, w *Watcher) {
	t.Helper()
	timeout := time.After(waitTimeout)
	for {
		select {
		case _, ok := <-w.Events():
			if !ok {
				return
			}
		case <-timeout:
			t.Fatal("the watch did not end")
		}
	}
}

// wantKilled checks w.Killed.
func wantKilled(t *testing.T, w *Watcher, want uint64) {
	t.Helper()
	got, err := w.Killed()
	if err != nil {
		t.Fatalf("killed: %v", err)
	}
	if got != want {
		t.Fatalf("killed = %d, want %d", got, want)
	}
}
