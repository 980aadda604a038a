package diskcache

import (
	"fmt"
	"time"
)

// Progress receives human lines for the container's log (kubectl logs
// shows them): start, resume, progress at most about once a second,
// verification, decompression and completion.
type Progress func(line string)

// progressEvery is the least time between two progress lines of one step.
const progressEvery = time.Second

// say sends one line to p, if p is not nil.
func (p Progress) say(format string, args ...any) {
	if p != nil {
		p("vmshim: " + oneLine(fmt.Sprintf(format, args...)))
	}
}

// meter is an io.Writer that counts bytes and reports them to a Progress
// at most every progressEvery: "<verb> <url>: 12.0 MiB of 96.0 MiB (12%),
// 3.4 MiB/s".
type meter struct {
	progress Progress
	verb     string // "downloading", "decompressing"
	url      string // redacted
	total    int64  // -1 if unknown
	done     int64
	base     int64 // done when the meter started, for the rate
	start    time.Time
	last     time.Time
}

// newMeter returns a meter that starts at done bytes of total.
func newMeter(p Progress, verb, url string, done, total int64) *meter {
	now := time.Now()
	return &meter{progress: p, verb: verb, url: url, total: total, done: done, base: done, start: now, last: now}
}

// Write counts p; it never fails.
func (m *meter) Write(p []byte) (int, error) {
	m.done += int64(len(p))
	if m.progress != nil {
		if now := time.Now(); now.Sub(m.last) >= progressEvery {
			m.last = now
			m.progress.say("%s %s: %s", m.verb, m.url, m.status(now))
		}
	}
	return len(p), nil
}

// status is the progress text: bytes done, of total, percent and rate.
func (m *meter) status(now time.Time) string {
	s := humanBytes(m.done)
	if m.total > 0 {
		s += fmt.Sprintf(" of %s (%d%%)", humanBytes(m.total), m.done*100/m.total)
	}
	if secs := now.Sub(m.start).Seconds(); secs > 0 {
		s += fmt.Sprintf(", %s/s", humanBytes(int64(float64(m.done-m.base)/secs)))
	}
	return s
}

// humanBytes formats n bytes with a binary unit: "512 B", "12.0 MiB".
func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTP"[exp])
}
