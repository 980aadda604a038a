package launch

import (
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/containerd/log"

	"github.com/vmshim/vmshim/guestconsole"
)

// deadKill is how long a guest found dead keeps running before the shim
// stops it: time for the rest of a panic's report to reach the log, and
// for pvpanic, when the guest loaded it, to end QEMU first.
const deadKill = 2 * time.Second

// Resets of the guest that make a reset loop: resetLoop of them within
// resetWindow. A triple fault is a reset under QEMU, so a guest that
// faults as it boots resets over and over.
const (
	resetLoop   = 5
	resetWindow = time.Minute
)

// deadStatus is the exit status of a task whose guest the shim found
// dead and stopped.
const deadStatus = 1

// deathWatch ends a VM whose guest is dead when QEMU would not: a kernel
// panic or a halt its console shows (guestconsole), and a reset loop
// QMP reports. It stops QEMU, and the task then exits with deadStatus
// and the reason as its log's last line.
type deathWatch struct {
	logger *log.Entry
	now    func() time.Time
	delay  time.Duration // deadKill, but in tests

	mu     sync.Mutex // guards the fields below
	kill   func() error
	reason string      // why the guest is dead; "" while it lives
	resets []time.Time // the guest's latest resets, at most resetLoop
	timer  *time.Timer // stops QEMU; nil until the guest is dead
}

// newDeathWatch returns a watch that stops QEMU with kill once it found
// the guest dead; kill is set once QEMU runs (setKill).
func newDeathWatch(logger *log.Entry) *deathWatch {
	return &deathWatch{logger: logger, now: time.Now, delay: deadKill}
}

// setKill names how to stop QEMU.
func (d *deathWatch) setKill(kill func() error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.kill = kill
}

// reset counts a reset the guest caused (qemu.LaunchConfig.GuestReset).
func (d *deathWatch) reset(cause string) {
	d.mu.Lock()
	now := d.now()
	d.resets = append(d.resets, now)
	if len(d.resets) > resetLoop {
		d.resets = d.resets[1:]
	}
	loop := len(d.resets) == resetLoop && now.Sub(d.resets[0]) <= resetWindow
	first := d.resets[0]
	d.mu.Unlock()
	d.logger.WithField("reason", cause).Info("guest reset")
	if loop {
		d.dead(fmt.Sprintf("reset loop: the guest reset %d times in %.0f s (last: %s)", resetLoop, now.Sub(first).Seconds(), cause))
	}
}

// dead records that the guest is dead, for the first reason given, and
// stops QEMU deadKill later.
func (d *deathWatch) dead(reason string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.reason != "" {
		return
	}
	d.reason = reason
	d.logger.WithField("reason", reason).Error("guest is dead, stopping its vm")
	d.timer = time.AfterFunc(d.delay, func() {
		d.mu.Lock()
		kill := d.kill
		d.mu.Unlock()
		if kill != nil {
			_ = kill()
		}
	})
}

// verdict is why the guest is dead, or "".
func (d *deathWatch) verdict() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.reason
}

// stop cancels a pending stop of QEMU: it has exited.
func (d *deathWatch) stop() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.timer != nil {
		d.timer.Stop()
	}
}

// exitStatus is the task's exit status for QEMU's code: deadStatus once
// the guest was found dead, unless QEMU itself exited non-zero for it,
// as pvpanic makes it do.
func (d *deathWatch) exitStatus(code int) int {
	if d == nil {
		return code
	}
	if d.verdict() == "" || (code != 0 && code < 128) {
		return code
	}
	return deadStatus
}

// watchedConsole is the guest's serial console as the task reads it:
// the guest's output, which a guestconsole.Watcher reads too, with the
// shim's own lines ("vmshim: ...") between the guest's. Writes go to the
// guest.
type watchedConsole struct {
	net.Conn // the shim's end of the serial port
	r        *io.PipeReader

	// seen is told of each chunk of the guest's output, after watcher.
	seen    func(*guestconsole.Watcher)
	watcher *guestconsole.Watcher

	mu        sync.Mutex // orders writes into w; guards lineStart
	w         *io.PipeWriter
	lineStart bool          // the last byte written was a newline
	final     func() string // the line written once the guest's output ends
}

// newWatchedConsole starts copying the guest's output from conn to the
// console it returns, through watcher; seen is called after each chunk
// and final gives the line, if any, that ends the output.
func newWatchedConsole(conn net.Conn, watcher *guestconsole.Watcher, seen func(*guestconsole.Watcher), final func() string) *watchedConsole {
	r, w := io.Pipe()
	c := &watchedConsole{Conn: conn, r: r, w: w, watcher: watcher, seen: seen, final: final, lineStart: true}
	go c.pump()
	return c
}

// Read reads the guest's output and the shim's lines.
func (c *watchedConsole) Read(p []byte) (int, error) { return c.r.Read(p) }

// Close closes both the reading side and the serial port.
func (c *watchedConsole) Close() error {
	c.r.Close()
	return c.Conn.Close()
}

// pump copies the guest's output until the serial port ends, then adds
// the final line and ends the output.
func (c *watchedConsole) pump() {
	b := make([]byte, 32<<10)
	for {
		n, err := c.Conn.Read(b)
		if n > 0 {
			_, _ = c.watcher.Write(b[:n])
			c.seen(c.watcher)
			c.mu.Lock()
			_, _ = c.w.Write(b[:n])
			c.lineStart = b[n-1] == '\n'
			c.mu.Unlock()
		}
		if err != nil {
			if line := c.final(); line != "" {
				c.note(line)
			}
			c.w.Close()
			return
		}
	}
}

// note writes one line of the shim's into the output, on a line of its
// own. It may wait for the task to read what came before.
func (c *watchedConsole) note(line string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := "vmshim: " + line + "\r\n"
	if !c.lineStart {
		s = "\r\n" + s
	}
	if _, err := io.WriteString(c.w, s); err == nil {
		c.lineStart = true
	}
}
