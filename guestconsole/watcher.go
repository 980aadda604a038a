package guestconsole

import (
	"bytes"
	"sync"
	"time"
)

// maxLine is how many bytes of a line a watcher keeps; the rest of a
// longer line is ignored.
const maxLine = 1024

// Watcher reads a guest's console output and keeps the verdict and the
// kernel time it shows. New makes one; its methods may be called from
// many goroutines.
type Watcher struct {
	mu        sync.Mutex    // guards the fields below
	line      [maxLine]byte // the start of the line being written
	n         int           // bytes of line held
	cr        bool          // a '\r' came after them: more text starts the line over
	reason    string        // the verdict; "" while the guest is not known dead
	linuxWhy  string        // the reason a Linux panic line gives, awaiting the rest of its report
	linuxLeft int           // lines left for that report to begin; 0 when none awaits
	bsdWhy    string        // the reason a FreeBSD "panic: " line gives, awaiting its cpuid line
	bsdLeft   int           // lines left for that cpuid line to come; 0 when none awaits
	kt        time.Duration // the largest kernel timestamp seen
}

// New returns a watcher that has seen no output.
func New() *Watcher {
	return &Watcher{}
}

// Write feeds console output, in chunks of any size and content, to the
// watcher. It never fails and never waits for anything but the watcher's
// lock, which no method holds for long.
func (w *Watcher) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for rest := p; len(rest) > 0; {
		i := bytes.IndexByte(rest, '\n')
		if i < 0 {
			w.add(rest)
			break
		}
		w.add(rest[:i])
		w.endLine()
		rest = rest[i+1:]
	}
	return len(p), nil
}

// Dead returns the reason the console showed the guest dead, a line of
// printable text, and true; or "", false while it has shown nothing of
// the kind.
func (w *Watcher) Dead() (reason string, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.reason, w.reason != ""
}

// KernelTime returns the largest Linux printk timestamp seen at the start
// of a line, or 0 before any.
func (w *Watcher) KernelTime() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.kt
}

// add adds b, with no '\n' in it, to the line being written; a '\r' ends
// what is held as soon as more text follows it.
func (w *Watcher) add(b []byte) {
	for len(b) > 0 {
		seg := b
		i := bytes.IndexByte(b, '\r')
		if i >= 0 {
			seg, b = b[:i], b[i+1:]
		} else {
			b = nil
		}
		if len(seg) > 0 {
			if w.cr {
				w.n, w.cr = 0, false
			}
			w.n += copy(w.line[w.n:], seg)
		}
		if i >= 0 {
			w.cr = true
		}
	}
}

// endLine reads the line held, which a '\n' has ended, and starts the next.
func (w *Watcher) endLine() {
	line := lineStart(w.line[:w.n])
	w.n, w.cr = 0, false
	if t, ok := kernelTime(line); ok && t > w.kt {
		w.kt = t
	}
	if w.reason != "" {
		return
	}
	msg := message(line)
	if reason, trailer, ok := linuxVerdict(msg); ok {
		if trailer && w.linuxLeft > 0 {
			reason = w.linuxWhy
		}
		w.die(reason)
		return
	}
	if w.linuxLeft > 0 {
		if isPanicReport(msg) {
			w.die(w.linuxWhy)
			return
		}
		w.linuxLeft--
	}
	if m, ok := bytes.CutPrefix(msg, []byte(linuxPanic)); ok && w.linuxLeft == 0 {
		w.linuxWhy, w.linuxLeft = reasonPanic(m), linuxWindow
	}
	if w.bsdLeft > 0 {
		if isCPUID(line) {
			w.die(w.bsdWhy)
			return
		}
		w.bsdLeft--
	}
	if m, ok := bytes.CutPrefix(line, []byte(bsdPanic)); ok {
		w.bsdWhy, w.bsdLeft = reasonPanic(m), bsdWindow
	}
}

// die sets the verdict.
func (w *Watcher) die(reason string) {
	w.reason = reason
	w.linuxWhy, w.linuxLeft, w.bsdWhy, w.bsdLeft = "", 0, "", 0
}
