package oom

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestParseCounter(t *testing.T) {
	for _, tc := range []struct {
		name      string
		data      string
		want      uint64
		wantFound bool
		wantErr   bool
	}{
		{name: "v2 memory.events", data: "low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n", want: 2, wantFound: true},
		{name: "v1 memory.oom_control", data: "oom_kill_disable 0\nunder_oom 0\noom_kill 7\n", want: 7, wantFound: true},
		{name: "v1 before 4.13", data: "oom_kill_disable 0\nunder_oom 1\n"},
		{name: "empty", data: ""},
		{name: "no final newline", data: "oom_kill 5", want: 5, wantFound: true},
		{name: "extra blanks", data: "  oom_kill\t5 \r\n", want: 5, wantFound: true},
		{name: "largest", data: "oom_kill 18446744073709551615\n", want: 1<<64 - 1, wantFound: true},
		{name: "longer key", data: "oom_kill_disable 1\n"},
		{name: "other lines unchecked", data: "garbage\n\x00\xff\noom_kill 1\n", want: 1, wantFound: true},
		{name: "overflow", data: "oom_kill 18446744073709551616\n", wantErr: true},
		{name: "negative", data: "oom_kill -1\n", wantErr: true},
		{name: "sign", data: "oom_kill +1\n", wantErr: true},
		{name: "hex", data: "oom_kill 0x1\n", wantErr: true},
		{name: "no value", data: "oom_kill\n", wantErr: true},
		{name: "two values", data: "oom_kill 1 2\n", wantErr: true},
		{name: "twice", data: "oom_kill 1\noom_kill 1\n", wantErr: true},
		{name: "long bad value", data: "oom_kill " + strings.Repeat("9x", 2000), wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, found, err := parseCounter([]byte(tc.data), killKey)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if err != nil {
				if msg := err.Error(); strings.Contains(msg, "\n") || len(msg) > 200 {
					t.Fatalf("error is not one short line: %q", msg)
				}
				return
			}
			if got != tc.want || found != tc.wantFound {
				t.Fatalf("got %d, %v; want %d, %v", got, found, tc.want, tc.wantFound)
			}
		})
	}
}

// inotifyEvent encodes one inotify event as the kernel does.
func inotifyEvent(wd int32, mask uint32, name string) []byte {
	size := 0
	if name != "" {
		size = (len(name) + 1 + 15) &^ 15
	}
	b := make([]byte, unix.SizeofInotifyEvent+size)
	binary.NativeEndian.PutUint32(b[0:4], uint32(wd))
	binary.NativeEndian.PutUint32(b[4:8], mask)
	binary.NativeEndian.PutUint32(b[12:16], uint32(size))
	copy(b[unix.SizeofInotifyEvent:], name)
	return b
}

func TestInotifyGone(t *testing.T) {
	const fileWD, dirWD = 1, 2
	for _, tc := range []struct {
		name string
		buf  []byte
		want bool
	}{
		{name: "modify", buf: inotifyEvent(fileWD, unix.IN_MODIFY, "")},
		{name: "file deleted", buf: inotifyEvent(fileWD, unix.IN_DELETE_SELF, ""), want: true},
		{name: "file watch dropped", buf: inotifyEvent(fileWD, unix.IN_IGNORED, ""), want: true},
		{name: "sibling deleted", buf: inotifyEvent(dirWD, unix.IN_DELETE|unix.IN_ISDIR, "pod-2.scope")},
		{name: "name prefix deleted", buf: inotifyEvent(dirWD, unix.IN_DELETE|unix.IN_ISDIR, "pod")},
		{name: "deleted", buf: inotifyEvent(dirWD, unix.IN_DELETE|unix.IN_ISDIR, "pod.scope"), want: true},
		{name: "deleted after others", buf: bytes.Join([][]byte{
			inotifyEvent(fileWD, unix.IN_MODIFY, ""),
			inotifyEvent(dirWD, unix.IN_DELETE|unix.IN_ISDIR, "x"),
			inotifyEvent(dirWD, unix.IN_DELETE|unix.IN_ISDIR, "pod.scope"),
		}, nil), want: true},
		{name: "parent watch dropped", buf: inotifyEvent(dirWD, unix.IN_IGNORED, ""), want: true},
		{name: "queue overflow", buf: inotifyEvent(-1, unix.IN_Q_OVERFLOW, "")},
		{name: "truncated", buf: inotifyEvent(dirWD, unix.IN_DELETE, "pod.scope")[:20]},
		{name: "empty", buf: nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, got := inotifyGone(tc.buf, fileWD, dirWD, "pod.scope"); got != tc.want {
				t.Fatalf("gone = %v, want %v", got, tc.want)
			}
		})
	}
}
