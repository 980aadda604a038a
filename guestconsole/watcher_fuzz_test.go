package guestconsole

import (
	"bytes"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"
)

// FuzzWatcher feeds a watcher any console output, whole and split at a
// point: it must not panic, both ways must agree, a reason must be one
// short line of printable text, and a verdict needs one of the kernels'
// lines in the input.
func FuzzWatcher(f *testing.F) {
	f.Add([]byte("[    1.234567] Kernel panic - not syncing: VFS: Unable to mount root fs on unknown-block(0,0)\r\n"), uint(17))
	f.Add([]byte("[    1.236480][    T1] ---[ end Kernel panic - not syncing: Fatal exception ]---\n"), uint(3))
	f.Add([]byte("vm login: \r[   41.207733] reboot: System halted\r\n"), uint(11))
	f.Add([]byte("panic: page fault\r\ncpuid = 1; apic id = 01\r\ntime = 1\r\n"), uint(20))
	f.Add([]byte("panic: runtime error\n\ngoroutine 1 [running]:\n"), uint(0))
	f.Add([]byte("\x1b[0;32m[    2.000000] Kernel panic - not syncing: \xff\x00\t\u202e\n"), uint(40))
	f.Fuzz(func(t *testing.T, data []byte, split uint) {
		whole := feed(t, data, func() int { return len(data) })
		at := int(split % uint(len(data)+1))
		first := true
		parts := feed(t, data, func() int {
			if first {
				first = false
				return at
			}
			return len(data)
		})
		if parts != whole {
			t.Fatalf("split at %d: %+v; whole: %+v", at, parts, whole)
		}
		if whole.kt < 0 || whole.kt >= 1e8*time.Second {
			t.Fatalf("KernelTime() = %v", whole.kt)
		}
		if !whole.dead {
			return
		}
		r := whole.reason
		if len(r) > maxReason || !utf8.ValidString(r) || strings.IndexFunc(r, func(c rune) bool { return !unicode.IsPrint(c) }) >= 0 {
			t.Fatalf("reason %q is not one short line of printable text", r)
		}
		if !bytes.Contains(data, []byte(linuxPanic)) && !bytes.Contains(data, []byte(linuxTrailer)) &&
			!bytes.Contains(data, []byte(linuxHalted)) && !(bytes.Contains(data, []byte(bsdPanic)) && bytes.Contains(data, []byte(bsdCPUID))) {
			t.Fatalf("verdict %q from %q, which has no kernel's line", r, data)
		}
	})
}
