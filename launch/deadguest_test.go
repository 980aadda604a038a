package launch

import (
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/log"

	"github.com/vmshim/vmshim/guestconsole"
)

// TestDeathWatchResets finds a reset loop in resetLoop resets within
// resetWindow, and not in resets spread wider.
func TestDeathWatchResets(t *testing.T) {
	for _, tc := range []struct {
		name  string
		every time.Duration
		n     int
		dead  bool
	}{
		{name: "one reboot", every: time.Second, n: 1},
		{name: "four quick", every: time.Second, n: resetLoop - 1},
		{name: "five quick", every: time.Second, n: resetLoop, dead: true},
		{name: "five within the window", every: resetWindow / (resetLoop - 1), n: resetLoop, dead: true},
		{name: "spread out", every: resetWindow/(resetLoop-1) + time.Second, n: 3 * resetLoop},
		{name: "many quick", every: 100 * time.Millisecond, n: 50, dead: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newDeathWatch(log.L)
			d.delay = time.Hour
			now := time.Unix(1000, 0)
			d.now = func() time.Time { return now }
			for i := 0; i < tc.n; i++ {
				d.reset("guest-reset")
				now = now.Add(tc.every)
			}
			d.stop()
			got := d.verdict()
			if (got != "") != tc.dead {
				t.Fatalf("verdict %q, want dead %v", got, tc.dead)
			}
			if tc.dead && !strings.HasPrefix(got, "reset loop: the guest reset 5 times in ") {
				t.Errorf("verdict %q", got)
			}
		})
	}
}

// TestDeathWatchKills stops QEMU once, a delay after the first verdict,
// which later ones do not change; stop cancels a pending kill.
func TestDeathWatchKills(t *testing.T) {
	d := newDeathWatch(log.L)
	d.delay = time.Millisecond
	kills := make(chan struct{}, 2)
	d.setKill(func() error { kills <- struct{}{}; return nil })
	d.dead("kernel panic: first")
	d.dead("the guest halted: second")
	select {
	case <-kills:
	case <-time.After(time.Minute):
		t.Fatal("no kill a minute after the verdict")
	}
	select {
	case <-kills:
		t.Error("killed twice")
	case <-time.After(50 * time.Millisecond):
	}
	if got := d.verdict(); got != "kernel panic: first" {
		t.Errorf("verdict %q, want the first", got)
	}

	e := newDeathWatch(log.L)
	e.delay = time.Hour
	e.setKill(func() error { t.Error("a stopped watch killed"); return nil })
	e.dead("kernel panic: x")
	e.stop()
	if e.timer.Stop() {
		t.Error("stop left the kill pending")
	}
}

// TestDeathWatchExitStatus: a dead guest's task exits deadStatus, unless
// QEMU exited non-zero by itself (pvpanic).
func TestDeathWatchExitStatus(t *testing.T) {
	var none *deathWatch
	if got := none.exitStatus(137); got != 137 {
		t.Errorf("no watch: %d", got)
	}
	d := newDeathWatch(log.L)
	for _, code := range []int{0, 1, 137, -1} {
		if got := d.exitStatus(code); got != code {
			t.Errorf("alive, qemu %d: %d", code, got)
		}
	}
	d.delay = time.Hour
	d.dead("kernel panic: x")
	d.stop()
	for code, want := range map[int]int{0: deadStatus, 137: deadStatus, 143: deadStatus, 1: 1, 2: 2, -1: -1} {
		if got := d.exitStatus(code); got != want {
			t.Errorf("dead, qemu %d: %d, want %d", code, got, want)
		}
	}
}

// TestWatchedConsole carries the guest's output through the watcher,
// puts the shim's notes on lines of their own, ends with the final line
// once the guest's end closes, and writes to the guest.
func TestWatchedConsole(t *testing.T) {
	shimEnd, guestEnd := net.Pipe()
	var seen atomic.Int32
	final := "the guest is dead, its vm stopped: kernel panic: x"
	c := newWatchedConsole(shimEnd, guestconsole.New(), func(*guestconsole.Watcher) { seen.Add(1) }, func() string { return final })
	out := make(chan string)
	go func() {
		b, _ := io.ReadAll(c)
		out <- string(b)
	}()
	go func() {
		b := make([]byte, 5)
		if _, err := io.ReadFull(guestEnd, b); err != nil || string(b) != "hello" {
			t.Errorf("the guest read %q, %v", b, err)
		}
		_, _ = guestEnd.Write([]byte("[    0.100000] booting"))
		c.note("waiting to boot")
		_, _ = guestEnd.Write([]byte(" on\r\n[    2.500000] Kernel panic - not syncing: x\r\n"))
		c.note("between lines")
		guestEnd.Close()
	}()
	if _, err := c.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	got := <-out
	want := "[    0.100000] booting\r\nvmshim: waiting to boot\r\n on\r\n[    2.500000] Kernel panic - not syncing: x\r\n" +
		"vmshim: between lines\r\nvmshim: " + final + "\r\n"
	if got != want {
		t.Errorf("console:\n%q\nwant\n%q", got, want)
	}
	if seen.Load() != 2 {
		t.Errorf("seen told %d times, want 2", seen.Load())
	}
	c.Close()
}

// TestOnConsole tells firstOutput of the first chunk only, and death of
// the watcher's verdict once it has one.
func TestOnConsole(t *testing.T) {
	d := newDeathWatch(log.L)
	d.delay = time.Hour // never kills within the test
	d.setKill(func() error { t.Error("killed"); return nil })
	defer d.stop()
	var firsts atomic.Int32
	seen := onConsole(d, nil, func() { firsts.Add(1) })
	w := guestconsole.New()
	for _, chunk := range []string{
		"[    0.100000] Linux version 6.1.0\r\n",
		"[    1.000000] Kernel panic - not syncing: x\r\n",
		"[    1.000001] CPU: 0 PID: 1 Comm: swapper/0 Not tainted\r\n",
	} {
		if got := d.verdict(); got != "" {
			t.Fatalf("verdict %q before the panic's report", got)
		}
		_, _ = w.Write([]byte(chunk))
		seen(w)
	}
	if got := d.verdict(); got != "kernel panic: x" {
		t.Errorf("verdict %q, want the panic's", got)
	}
	if n := firsts.Load(); n != 1 {
		t.Errorf("firstOutput called %d times, want once", n)
	}
	onConsole(d, nil, nil)(w) // no firstOutput: nothing to call
}
