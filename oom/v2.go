package oom

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

// inotifyBufSize holds several inotify events with the longest names.
const inotifyBufSize = 16 * (unix.SizeofInotifyEvent + unix.NAME_MAX + 1)

// v2 watches memory.events with inotify: the kernel raises IN_MODIFY on it
// when a counter changes. When the cgroup is removed the kernel raises
// nothing on the cgroup's directory or files, only IN_DELETE on the parent
// directory, so that is watched too.
type v2 struct {
	name   string   // the cgroup directory's name in its parent
	ino    *os.File // the inotify instance, non-blocking
	events *os.File // memory.events
	fileWD int32    // the watch on memory.events
	dirWD  int32    // the watch on the parent directory
}

// openV2 watches events, the open memory.events of dir, and returns its
// oom_kill count now.
func openV2(dir string, events *os.File) (_ source, _ uint64, retErr error) {
	defer func() {
		if retErr != nil {
			events.Close()
		}
	}()
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, 0, fmt.Errorf("create inotify instance: %w", err)
	}
	ino := os.NewFile(uintptr(fd), "inotify")
	defer func() {
		if retErr != nil {
			ino.Close()
		}
	}()
	path := filepath.Join(dir, eventsFile)
	fileWD, err := unix.InotifyAddWatch(fd, path, unix.IN_MODIFY|unix.IN_ATTRIB|unix.IN_DELETE_SELF)
	if err != nil {
		return nil, 0, fmt.Errorf("watch %s: %w", path, err)
	}
	parent := filepath.Dir(dir)
	dirWD, err := unix.InotifyAddWatch(fd, parent, unix.IN_DELETE|unix.IN_ONLYDIR)
	if err != nil {
		return nil, 0, fmt.Errorf("watch %s: %w", parent, err)
	}
	s := &v2{name: filepath.Base(dir), ino: ino, events: events, fileWD: int32(fileWD), dirWD: int32(dirWD)}
	n, err := s.read()
	if err != nil {
		return nil, 0, err
	}
	return s, n, nil
}

// run reads the counter after every batch of inotify events until one
// says the cgroup is gone, memory.events has no name left, or the read
// finds the cgroup gone.
func (s *v2) run(w *Watcher) error {
	buf := make([]byte, inotifyBufSize)
	for {
		w.hold()
		n, err := s.ino.Read(buf)
		if err != nil {
			return ended(err, "read inotify events")
		}
		events, gone := inotifyGone(buf[:n], s.fileWD, s.dirWD, s.name)
		gone = gone || s.unlinked()
		if w.hooks.batch != nil {
			w.hooks.batch(events, gone)
		}
		count, found, data, err := readCounter(s.events, killKey)
		w.observe(data)
		if err == nil && found {
			w.note(count)
		}
		if gone || removed(err) {
			return nil
		}
	}
}

// inotifyGone counts the inotify events in buf and reports whether they
// say the watched cgroup is gone: memory.events deleted, the watch on it
// or on the parent dropped, or the directory name deleted from the parent.
func inotifyGone(buf []byte, fileWD, dirWD int32, name string) (events int, gone bool) {
	for len(buf) >= unix.SizeofInotifyEvent {
		wd := int32(binary.NativeEndian.Uint32(buf[0:4]))
		mask := binary.NativeEndian.Uint32(buf[4:8])
		size := binary.NativeEndian.Uint32(buf[12:16])
		buf = buf[unix.SizeofInotifyEvent:]
		if uint64(size) > uint64(len(buf)) {
			break
		}
		evName, _, _ := bytes.Cut(buf[:size], []byte{0})
		buf = buf[size:]
		events++
		const dropped = unix.IN_IGNORED | unix.IN_UNMOUNT
		switch {
		case wd == fileWD && mask&(dropped|unix.IN_DELETE_SELF) != 0:
			gone = true
		case wd == dirWD && mask&dropped != 0:
			gone = true
		case wd == dirWD && mask&unix.IN_DELETE != 0 && string(evName) == name:
			gone = true
		}
	}
	return events, gone
}

// unlinked reports whether memory.events has been deleted while open;
// the kernel raises IN_DELETE_SELF only once it is closed.
func (s *v2) unlinked() bool {
	fi, err := s.events.Stat()
	if err != nil {
		return removed(err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && st.Nlink == 0
}

// read returns memory.events' oom_kill.
func (s *v2) read() (uint64, error) {
	n, found, _, err := readCounter(s.events, killKey)
	if err != nil {
		return 0, err
	}
	if !found {
		return 0, fmt.Errorf("%s has no %s counter", s.events.Name(), killKey)
	}
	return n, nil
}

// stop closes the inotify instance, which makes run return.
func (s *v2) stop() {
	s.ino.Close()
}

// close closes both files.
func (s *v2) close() error {
	return closeFiles(s.ino, s.events)
}
