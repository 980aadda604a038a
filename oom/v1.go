package oom

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

const (
	// eventControlFile registers eventfds for v1 memory cgroup events.
	eventControlFile = "cgroup.event_control"
	// recheckFirst is how long after an OOM notification the v1 watch
	// looks again for the kill the kernel makes after notifying.
	recheckFirst = 10 * time.Millisecond
	// recheckLast is the longest pause between those looks; after it the
	// OOM is taken to have ended without a kill.
	recheckLast = 1280 * time.Millisecond
)

// v1 watches through the v1 memory controller's OOM notifier: the kernel
// signals an eventfd each time the cgroup runs out of memory, just before
// its OOM killer picks a victim, and once more when the cgroup is removed.
type v1 struct {
	dir     string
	efd     *os.File        // the registered eventfd, non-blocking
	rc      syscall.RawConn // efd's, to read it without blocking a thread
	control *os.File        // memory.oom_control
	kills   bool            // memory.oom_control has the oom_kill counter

	mu    sync.Mutex // guards notes, and reads of efd so none is lost in between
	notes uint64     // notifications read from efd, the count when !kills
}

// openV1 registers an eventfd for control, the open memory.oom_control of
// dir, and returns the count now.
func openV1(dir string, control *os.File) (_ source, _ uint64, retErr error) {
	defer func() {
		if retErr != nil {
			control.Close()
		}
	}()
	n, kills, _, err := readCounter(control, killKey)
	if err != nil {
		return nil, 0, err
	}
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, 0, fmt.Errorf("create eventfd: %w", err)
	}
	efd := os.NewFile(uintptr(fd), "eventfd")
	defer func() {
		if retErr != nil {
			efd.Close()
		}
	}()
	ctl, err := os.OpenFile(filepath.Join(dir, eventControlFile), os.O_WRONLY, 0)
	if err != nil {
		return nil, 0, fmt.Errorf("register oom notification: %w", err)
	}
	cfd, err := fdOf(control)
	if err == nil {
		_, err = fmt.Fprintf(ctl, "%d %d", fd, cfd)
	}
	if cerr := ctl.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, 0, fmt.Errorf("register oom notification: %w", err)
	}
	rc, err := efd.SyscallConn()
	if err != nil {
		return nil, 0, fmt.Errorf("register oom notification: %w", err)
	}
	s := &v1{dir: dir, efd: efd, rc: rc, control: control, kills: kills}
	if !kills {
		n = 0
	}
	return s, n, nil
}

// run waits on the eventfd. A notification comes before the kill, so
// when the counter has not risen yet it looks again after growing pauses.
func (s *v1) run(w *Watcher) error {
	var pause time.Duration // until the next look without a notification; 0 for none
	for {
		var deadline time.Time
		if pause > 0 {
			deadline = time.Now().Add(pause)
		}
		if err := s.efd.SetReadDeadline(deadline); err != nil {
			return ended(err, "set deadline on oom eventfd")
		}
		var notified bool
		var takeErr error
		err := s.rc.Read(func(fd uintptr) bool {
			notified, takeErr = s.take(int(fd))
			return notified || takeErr != nil
		})
		if err == nil {
			err = takeErr
		}
		if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			return ended(err, "read oom eventfd")
		}
		before := w.current()
		n, found, data, err := readCounter(s.control, killKey)
		w.observe(data)
		if removed(err) || s.gone() {
			return nil
		}
		if !s.kills {
			n, found = s.count(), true
		}
		if err == nil && found {
			n = w.note(n)
		}
		switch {
		case !s.kills || n > before:
			pause = 0
		case notified:
			pause = recheckFirst
		case pause < recheckLast:
			pause *= 2
		default:
			pause = 0
		}
	}
}

// take reads the eventfd at fd without waiting and adds the notifications
// it held to notes; it reports whether it held anything.
func (s *v1) take(fd int) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var buf [8]byte
	_, err := unix.Read(fd, buf[:])
	if errors.Is(err, unix.EAGAIN) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	n := binary.NativeEndian.Uint64(buf[:])
	if n > 0 && s.gone() {
		// The kernel signals once more when it removes the cgroup.
		n--
	}
	s.notes += n
	return true, nil
}

// count returns the notifications read so far.
func (s *v1) count() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.notes
}

// gone reports whether memory.oom_control is no longer in the directory,
// as after the cgroup's removal.
func (s *v1) gone() bool {
	_, err := os.Lstat(filepath.Join(s.dir, oomControlFile))
	return removed(err)
}

// read returns memory.oom_control's oom_kill, or, without it, the
// notifications so far, including those run has not read yet.
func (s *v1) read() (uint64, error) {
	if !s.kills {
		if err := s.drain(); err != nil {
			return 0, err
		}
		return s.count(), nil
	}
	n, found, _, err := readCounter(s.control, killKey)
	if err != nil {
		return 0, err
	}
	if !found {
		return 0, fmt.Errorf("%s has no %s counter", s.control.Name(), killKey)
	}
	return n, nil
}

// drain adds what the eventfd holds to notes without waiting.
func (s *v1) drain() error {
	var takeErr error
	err := s.rc.Control(func(fd uintptr) {
		_, takeErr = s.take(int(fd))
	})
	if err == nil {
		err = takeErr
	}
	if err != nil {
		return fmt.Errorf("read oom eventfd: %w", err)
	}
	return nil
}

// fdOf returns the descriptor of f; unlike f.Fd it leaves f's blocking
// mode alone.
func fdOf(f *os.File) (uintptr, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return 0, err
	}
	var fd uintptr
	if err := rc.Control(func(raw uintptr) { fd = raw }); err != nil {
		return 0, err
	}
	return fd, nil
}

// stop closes the eventfd, which makes run return and unregisters it.
func (s *v1) stop() {
	s.efd.Close()
}

// close closes both files.
func (s *v1) close() error {
	return closeFiles(s.efd, s.control)
}

// ended turns an error from the notification fd into run's result: nil
// when the fd was closed by stop.
func ended(err error, what string) error {
	if errors.Is(err, os.ErrClosed) {
		return nil
	}
	return fmt.Errorf("%s: %w", what, err)
}
