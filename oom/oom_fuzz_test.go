package oom

import (
	"bytes"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func FuzzParseCounter(f *testing.F) {
	f.Add([]byte("low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n"))
	f.Add([]byte("oom_kill_disable 0\nunder_oom 0\noom_kill 7\n"))
	f.Add([]byte("oom_kill 1\noom_kill 1\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		n, found, err := parseCounter(data, killKey)
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("error spans lines: %q", err)
			}
			return
		}
		if found && !bytes.Contains(data, []byte(strconv.FormatUint(n, 10))) {
			t.Fatalf("value %d is not in %q", n, data)
		}
		// One more key line must be taken exactly when none was there.
		more := append(append(bytes.Clone(data), '\n'), "oom_kill 1\n"...)
		n2, found2, err2 := parseCounter(more, killKey)
		if found && err2 == nil {
			t.Fatalf("a second key line in %q was not an error", more)
		}
		if !found && (err2 != nil || !found2 || n2 != 1) {
			t.Fatalf("%q: got %d, %v, %v; want 1", more, n2, found2, err2)
		}
	})
}

func FuzzInotifyGone(f *testing.F) {
	f.Add(inotifyEvent(2, unix.IN_DELETE|unix.IN_ISDIR, "pod.scope"))
	f.Add(append(inotifyEvent(1, unix.IN_MODIFY, ""), inotifyEvent(2, unix.IN_DELETE, "x")...))
	f.Fuzz(func(t *testing.T, buf []byte) {
		inotifyGone(buf, 1, 2, "pod.scope")
	})
}
