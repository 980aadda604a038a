// Package regfiletest helps tests show that a planted file is never
// opened: it watches a directory for opens with inotify.
package regfiletest

import (
	"bytes"
	"errors"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// WatchOpens returns what reports the names in dir that were opened
// (inotify IN_OPEN) since WatchOpens was called, by any process; an O_PATH
// descriptor is no open. The watch ends with the test.
func WatchOpens(t testing.TB, dir string) func() []string {
	t.Helper()
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_OPEN); err != nil {
		t.Fatal(err)
	}
	return func() []string {
		var opened []string
		buf := make([]byte, 64<<10)
		for {
			n, err := unix.Read(fd, buf)
			if errors.Is(err, unix.EAGAIN) {
				return opened
			}
			if err != nil {
				t.Fatal(err)
			}
			for off := 0; off+unix.SizeofInotifyEvent <= n; {
				ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
				name := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
				if ev.Mask&unix.IN_OPEN != 0 {
					opened = append(opened, string(bytes.TrimRight(name, "\x00")))
				}
				off += unix.SizeofInotifyEvent + int(ev.Len)
			}
		}
	}
}
