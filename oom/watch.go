// Package oom is the kernel's OOM killer as the shim meets it: it watches
// a memory cgroup and reports each time the killer acts in it, and sets
// how likely a process is to be its victim (oom_score_adj).
//
// On cgroup v2 it watches memory.events with inotify and reads its oom_kill
// counter. On cgroup v1 it registers an eventfd for memory.oom_control
// through cgroup.event_control and reads memory.oom_control's oom_kill
// counter (Linux 4.13 and later); where the kernel lacks that counter it
// counts the notifications instead.
//
// Events only wakes the caller; Killed says how many kills there were. A
// caller that must report an OOM kill before the exit of the process it
// hit keeps the count it has reported (zero for a cgroup it created) and,
// under one lock, compares it with Killed each time Events fires and once
// more after the process has been reaped, before it publishes the exit.
// The kernel raises its counter before it sends SIGKILL, so that last
// comparison sees every kill that ended the process.
package oom

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"
)

const (
	// eventsFile is the cgroup v2 file with the memory event counters.
	eventsFile = "memory.events"
	// oomControlFile is the cgroup v1 file with the OOM state and counter.
	oomControlFile = "memory.oom_control"
	// killKey is the counter of OOM kills in both files.
	killKey = "oom_kill"
)

// Watcher reports OOM kills in one memory cgroup.
type Watcher struct {
	dir    string
	src    source
	hooks  hooks
	events chan struct{} // capacity 1: a pending value stands for one or more kills
	done   chan struct{} // closed once the watch has ended and its fds are closed

	mu       sync.Mutex // guards count, ended, err and closeErr
	count    uint64     // the highest count read from the kernel
	ended    bool       // events is closed
	err      error      // what ended the watch, when it was not Close, the context or removal
	closeErr error      // from releasing the fds
}

// source is the part of a watch that differs between cgroup versions.
type source interface {
	// run waits for notifications and passes counts to w.note until the
	// cgroup is removed (nil) or stop is called (nil), or fails.
	run(w *Watcher) error
	// read returns the count as the kernel has it now.
	read() (uint64, error)
	// stop makes run return; it may be called any number of times, from
	// any goroutine.
	stop()
	// close releases every fd; it is called once, after run has returned.
	close() error
}

// hooks lets tests follow the watch loop; all fields may be nil.
type hooks struct {
	// read receives every content the loop reads from the counter file.
	read func(data []byte)
	// wait runs before each wait for notifications; one that blocks
	// makes the kernel's notifications pile up into one batch.
	wait func()
	// batch receives, on cgroup v2, each batch of inotify events: how
	// many there were and whether they said the cgroup is gone.
	batch func(events int, gone bool)
}

// Watch starts watching the memory cgroup whose directory is dir:
// /sys/fs/cgroup/memory/<path> on cgroup v1, /sys/fs/cgroup/<path> on v2.
// The version is told by the files present. The watch ends when ctx is
// done, when Close is called or when the cgroup is removed.
func Watch(ctx context.Context, dir string) (*Watcher, error) {
	return watch(ctx, dir, hooks{})
}

// watch is Watch with hooks for tests.
func watch(ctx context.Context, dir string, h hooks) (*Watcher, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("watch oom kills in %s: %w", dir, err)
	}
	dir = filepath.Clean(dir)
	src, n, err := open(dir)
	if err != nil {
		return nil, fmt.Errorf("watch oom kills in %s: %w", dir, err)
	}
	w := &Watcher{
		dir:    dir,
		src:    src,
		hooks:  h,
		events: make(chan struct{}, 1),
		done:   make(chan struct{}),
		count:  n,
	}
	detach := context.AfterFunc(ctx, src.stop)
	go w.run(detach)
	return w, nil
}

// open sets up the watch on whichever counter file dir has and returns
// the count at the start.
func open(dir string) (source, uint64, error) {
	f, err := os.Open(filepath.Join(dir, eventsFile))
	if err == nil {
		return openV2(dir, f)
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, 0, err
	}
	f, err = os.Open(filepath.Join(dir, oomControlFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, 0, fmt.Errorf("no %s or %s, not a memory cgroup: %w", eventsFile, oomControlFile, err)
	}
	if err != nil {
		return nil, 0, err
	}
	return openV1(dir, f)
}

// run is the watch's goroutine: it runs the source's loop, then releases
// everything and closes Events.
func (w *Watcher) run(detach func() bool) {
	err := w.src.run(w)
	detach()
	closeErr := w.src.close()
	w.mu.Lock()
	w.ended = true
	w.err = err
	w.closeErr = closeErr
	close(w.events)
	w.mu.Unlock()
	close(w.done)
}

// Events returns a channel that receives a value after the count Killed
// returns has risen. Values coalesce: one receive stands for one or more
// kills, and the watcher never waits for the reader. The channel is closed
// when the watch ends; Err then tells whether it failed.
func (w *Watcher) Events() <-chan struct{} {
	return w.events
}

// Killed returns the kernel's count of OOM kills in the cgroup (on v2 its
// subtree): memory.events oom_kill on v2, memory.oom_control oom_kill on
// v1, or, on v1 kernels without that counter (before 4.13), the number of
// OOM notifications since Watch. It reads the count now, and never returns
// less than before. On error it returns the last count seen.
func (w *Watcher) Killed() (uint64, error) {
	n, err := w.src.read()
	if err != nil {
		return w.note(0), fmt.Errorf("read oom kills of %s: %w", w.dir, err)
	}
	return w.note(n), nil
}

// Err returns why the watch failed, once Events is closed; it is nil when
// the watch ended because of Close, its context or the cgroup's removal.
func (w *Watcher) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// Close ends the watch, waits for its goroutine and closes its fds. It may
// be called more than once and concurrently with everything else.
func (w *Watcher) Close() error {
	w.src.stop()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closeErr != nil {
		return fmt.Errorf("close oom watch of %s: %w", w.dir, w.closeErr)
	}
	return nil
}

// note records a count read from the kernel, signals Events when it is
// higher than any before, and returns the highest count seen.
func (w *Watcher) note(n uint64) uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	if n <= w.count {
		return w.count
	}
	w.count = n
	if !w.ended {
		select {
		case w.events <- struct{}{}:
		default:
		}
	}
	return w.count
}

// current returns the highest count seen.
func (w *Watcher) current() uint64 {
	return w.note(0)
}

// hold runs the test hook before a wait for notifications.
func (w *Watcher) hold() {
	if w.hooks.wait != nil {
		w.hooks.wait()
	}
}

// observe passes what the loop read to the test hook.
func (w *Watcher) observe(data []byte) {
	if w.hooks.read != nil {
		w.hooks.read(data)
	}
}

// removed reports whether err from reading an open cgroup file means the
// cgroup is gone: kernfs answers ENODEV once its directory is removed.
func removed(err error) bool {
	return errors.Is(err, unix.ENODEV) || errors.Is(err, fs.ErrNotExist)
}

// closeFiles closes files, ignoring those closed already.
func closeFiles(files ...*os.File) error {
	var errs []error
	for _, f := range files {
		if err := f.Close(); err != nil && !errors.Is(err, os.ErrClosed) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
