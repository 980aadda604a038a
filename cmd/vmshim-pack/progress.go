package main

import (
	"fmt"
	"io"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// progressMode says how packing reports the input bytes it has read.
type progressMode int

// Progress modes; the zero value reports nothing.
const (
	progressNone  progressMode = iota // nothing
	progressLive                      // one line, redrawn at most 4 times a second
	progressPlain                     // one line at every 10%
)

// liveInterval is the shortest time between two redraws of the live line.
const liveInterval = 250 * time.Millisecond

// parseProgressMode reads a --progress value. "auto" is live when stderr is
// a terminal and nothing otherwise.
func parseProgressMode(s string, terminal bool) (progressMode, error) {
	switch s {
	case "auto":
		if terminal {
			return progressLive, nil
		}
		return progressNone, nil
	case "plain":
		return progressPlain, nil
	case "none":
		return progressNone, nil
	}
	return progressNone, fmt.Errorf("progress %q is not auto, plain or none: %w", s, errdefs.ErrInvalidArgument)
}

// isTerminal reports whether fd is a terminal.
func isTerminal(fd uintptr) bool {
	_, err := unix.IoctlGetTermios(int(fd), unix.TCGETS)
	return err == nil
}

// progressOptions say where and how progress is reported.
type progressOptions struct {
	Mode progressMode
	Out  io.Writer        // stderr in the command
	Now  func() time.Time // clock; time.Now when nil
}

// progress reports bytes read out of a known total. A nil *progress
// reports nothing, so callers need not check the mode. It is used from one
// goroutine.
type progress struct {
	mode  progressMode
	w     io.Writer
	now   func() time.Time
	name  string
	total int64

	start  time.Time
	last   time.Time // of the last live redraw
	done   int64
	step   int  // last 10% step printed in plain mode (1 is 10%)
	drawn  bool // a live line is on screen without its newline
	closed bool
}

// newProgress starts reporting on name, total bytes long; nil when opts
// ask for nothing.
func newProgress(opts progressOptions, name string, total int64) *progress {
	if opts.Mode == progressNone || opts.Out == nil {
		return nil
	}
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	return &progress{mode: opts.Mode, w: opts.Out, now: now, name: name, total: total, start: now()}
}

// add records n more bytes read.
func (p *progress) add(n int64) {
	if p == nil || n <= 0 {
		return
	}
	p.done += n
	switch p.mode {
	case progressLive:
		if t := p.now(); !p.drawn || t.Sub(p.last) >= liveInterval {
			p.last = t
			p.draw(t)
		}
	case progressPlain:
		if s := p.percent() / 10; s > p.step {
			p.step = s
			fmt.Fprintln(p.w, p.line(p.now()))
		}
	}
}

// finish prints the final state and ends the live line.
func (p *progress) finish() {
	if p == nil || p.closed {
		return
	}
	p.closed = true
	t := p.now()
	switch p.mode {
	case progressLive:
		p.draw(t)
		fmt.Fprintln(p.w)
		p.drawn = false
	case progressPlain:
		if p.percent()/10 > p.step {
			fmt.Fprintln(p.w, p.line(t))
		}
	}
}

// note prints one line of its own, after any live line.
func (p *progress) note(format string, args ...any) {
	if p == nil {
		return
	}
	if p.drawn {
		fmt.Fprintln(p.w)
		p.drawn = false
	}
	fmt.Fprintf(p.w, format+"\n", args...)
}

// draw redraws the live line in place.
func (p *progress) draw(t time.Time) {
	fmt.Fprintf(p.w, "\r%s\x1b[K", p.line(t))
	p.drawn = true
}

// percent is how much of the total is done, 0 to 100.
func (p *progress) percent() int {
	if p.total <= 0 || p.done >= p.total {
		return 100
	}
	return int(p.done * 100 / p.total)
}

// line is the progress line at time t.
func (p *progress) line(t time.Time) string {
	return formatProgress(p.name, p.done, p.total, t.Sub(p.start))
}

// formatProgress renders "packing NAME  DONE / TOTAL  PCT%  RATE"; the
// rate is left out until some time has passed.
func formatProgress(name string, done, total int64, elapsed time.Duration) string {
	pct := 100
	if total > 0 && done < total {
		pct = int(done * 100 / total)
	}
	s := fmt.Sprintf("packing %s  %s / %s  %d%%", name, formatBytes(done), formatBytes(total), pct)
	if elapsed > 0 {
		s += "  " + formatRate(float64(done)/elapsed.Seconds())
	}
	return s
}

// scaleBytes returns v in the largest binary unit that keeps it at least 1.
func scaleBytes(v float64) (float64, string) {
	byteUnits := [...]string{"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}
	i := 0
	for v >= 1024 && i < len(byteUnits)-1 {
		v /= 1024
		i++
	}
	return v, byteUnits[i]
}

// formatBytes renders a size with one decimal ("1.2 GiB"), bytes whole.
func formatBytes(n int64) string {
	v, unit := scaleBytes(float64(n))
	if unit == "B" {
		return fmt.Sprintf("%d B", n)
	}
	return fmt.Sprintf("%.1f %s", v, unit)
}

// formatRate renders bytes per second, whole from 10 up ("85 MiB/s"),
// with one decimal below ("3.4 MiB/s").
func formatRate(perSec float64) string {
	v, unit := scaleBytes(perSec)
	if v >= 10 || unit == "B" {
		return fmt.Sprintf("%.0f %s/s", v, unit)
	}
	return fmt.Sprintf("%.1f %s/s", v, unit)
}

// progressReader counts the bytes read through it into a progress.
type progressReader struct {
	r io.Reader
	p *progress
}

func (r progressReader) Read(b []byte) (int, error) {
	n, err := r.r.Read(b)
	r.p.add(int64(n))
	return n, err
}
