package guestconsole

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// result is what a watcher concluded from its input.
type result struct {
	reason string
	dead   bool
	kt     time.Duration
}

// feed writes in to a new watcher in chunks whose sizes size returns, and
// returns what the watcher concluded.
func feed(t testing.TB, in []byte, size func() int) result {
	t.Helper()
	w := New()
	for len(in) > 0 {
		n := min(max(size(), 1), len(in))
		if got, err := w.Write(in[:n]); got != n || err != nil {
			t.Fatalf("Write of %d bytes = %d, %v", n, got, err)
		}
		in = in[n:]
	}
	reason, dead := w.Dead()
	return result{reason, dead, w.KernelTime()}
}

// feedAll feeds in whole, byte by byte, split at every point when it is
// short, and in random chunks, checks each gives the same result, and
// returns it.
func feedAll(t *testing.T, in []byte) result {
	t.Helper()
	want := feed(t, in, func() int { return len(in) })
	check := func(how string, got result) {
		t.Helper()
		if got != want {
			t.Fatalf("fed %s: %+v; fed whole: %+v", how, got, want)
		}
	}
	check("byte by byte", feed(t, in, func() int { return 1 }))
	if len(in) <= 512 {
		for i := 1; i < len(in); i++ {
			first := true
			check("split", feed(t, in, func() int {
				if first {
					first = false
					return i
				}
				return len(in)
			}))
		}
	}
	for seed := range uint64(4) {
		r := rand.New(rand.NewPCG(seed, 0))
		check("in random chunks", feed(t, in, func() int { return 1 + r.IntN(300) }))
	}
	return want
}

func TestLines(t *testing.T) {
	const (
		vfs  = "kernel panic: VFS: Unable to mount root fs on unknown-block(0,0)"
		halt = "the guest halted: reboot: System halted"
		// report is the line after a Linux panic line: dump_stack's first.
		report = "[    2.400000] CPU: 0 PID: 1 Comm: swapper/0 Not tainted 6.1.0-28-amd64 #1  Debian 6.1.119-1\n"
	)
	for _, tc := range []struct {
		name string
		in   string
		want string // the reason; "" for none
	}{
		// Linux's panic line, after a printk prefix or at column 0, and the
		// rest of its report.
		{"init killed", "[    2.345678] Kernel panic - not syncing: Attempted to kill init! exitcode=0x00000100\n" + report, "kernel panic: Attempted to kill init! exitcode=0x00000100"},
		{"vfs", "[    1.234567] Kernel panic - not syncing: VFS: Unable to mount root fs on unknown-block(0,0)\n" + report, vfs},
		{"io-apic", "[    0.412345] Kernel panic - not syncing: IO-APIC + timer doesn't work!  Boot with apic=debug and send a report.  Then try booting with the 'noapic' option.\n" + report,
			"kernel panic: IO-APIC + timer doesn't work!  Boot with apic=debug and send a report.  Then try booting with the 'noapic' option."},
		{"short timestamp", "[    2.1] Kernel panic - not syncing: sysrq triggered crash\n" + report, "kernel panic: sysrq triggered crash"},
		{"fatal exception", "[   12.404890] Kernel panic - not syncing: Fatal exception\n" + report, "kernel panic: Fatal exception"},
		{"crlf", "[    1.234567] Kernel panic - not syncing: VFS: Unable to mount root fs on unknown-block(0,0)\r\n" + report, vfs},
		{"no timestamp", "Kernel panic - not syncing: VFS: Unable to mount root fs on unknown-block(0,0)\n" + report, vfs},
		{"no timestamp crlf", "Kernel panic - not syncing: VFS: Unable to mount root fs on unknown-block(0,0)\r\n" + report, vfs},
		{"caller id", "[    1.234567][    T1] Kernel panic - not syncing: VFS: Unable to mount root fs on unknown-block(0,0)\n" + report, vfs},
		{"cpu caller id", "[    5.000000][    C0] Kernel panic - not syncing: softlockup: hung tasks\n" + report, "kernel panic: softlockup: hung tasks"},
		{"caller id spaced", "[    1.234567] [    T1] Kernel panic - not syncing: VFS: Unable to mount root fs on unknown-block(0,0)\n" + report, vfs},
		{"caller id alone", "[     T1] Kernel panic - not syncing: VFS: Unable to mount root fs on unknown-block(0,0)\n" + report, vfs},
		{"large timestamp", "[123456.789012] Kernel panic - not syncing: hung_task: blocked tasks\n" + report, "kernel panic: hung_task: blocked tasks"},
		{"empty message", "[    1.000000] Kernel panic - not syncing: \n" + report, "kernel panic"},
		{"after other lines", "[    1.0] a\nb\n[    1.1] Kernel panic - not syncing: x\n[    1.2] CPU: 0 PID: 1 Comm: swapper/0 Not tainted 6.1.0-28-amd64 #1\n", "kernel panic: x"},
		{"after a status line ending in cr", "[  *** ] A start job is running for /dev/vdb (5s / 1min 30s)\r[   12.345678] Kernel panic - not syncing: Out of memory and no killable processes...\r\n" + report,
			"kernel panic: Out of memory and no killable processes..."},
		{"after escapes", "\x1b[0m\x1b[K[    1.234567] Kernel panic - not syncing: x\n" + report, "kernel panic: x"},
		{"control characters dropped", "Kernel panic - not syncing: a\x00b\x1b[1mc\x7f\td\xff\xfee\u2028f\u202eg\n" + report, "kernel panic: ab[1mc defg"},
		{"unicode kept", "Kernel panic - not syncing: été ✓\n" + report, "kernel panic: été ✓"},

		// The panic line alone is not enough: the rest of the report confirms it.
		{"report uid", "[    1.0] Kernel panic - not syncing: x\n[    1.0] CPU: 1 UID: 0 PID: 1 Comm: swapper/0 Not tainted 6.12.0 #1\n", "kernel panic: x"},
		{"report offset", "[   12.404890] Kernel panic - not syncing: Fatal exception\n[   12.405000] Kernel Offset: 0x2a000000 from 0xffffffff81000000 (relocation range: 0xffffffff80000000-0xffffffffbfffffff)\n", "kernel panic: Fatal exception"},
		{"report offset disabled", "Kernel panic - not syncing: Fatal exception\nKernel Offset: disabled\n", "kernel panic: Fatal exception"},
		{"report nmi", "[    5.0][    C1] Kernel panic - not syncing: softlockup: hung tasks\n[    5.0][    C1] Shutting down cpus with NMI\n", "kernel panic: softlockup: hung tasks"},
		{"report later", "[    1.0] Kernel panic - not syncing: x\n[    1.0] a\n[    1.0] b\n[    1.0] CPU: 0 PID: 1 Comm: init Not tainted\n", "kernel panic: x"},
		{"trailer confirms", "[    1.0] Kernel panic - not syncing: x\n[    1.1] ---[ end Kernel panic - not syncing: x ]---\n", "kernel panic: x"},
		{"panic line alone", "[    1.0] Kernel panic - not syncing: x\n", ""},
		{"quoted into kmsg", "[   12.300000] Kernel panic - not syncing: test\n[   12.400000] eth0: link up\n[   13.000000] random: crng init done\n", ""},
		{"report too late", "[    1.0] Kernel panic - not syncing: x\n" + strings.Repeat("[    1.0] a\n", linuxWindow) + "[    1.0] CPU: 0 PID: 1 Comm: init\n", ""},
		{"report of another kind", "[    1.0] Kernel panic - not syncing: x\n[    1.0] CPU: 0: something else\n[    1.0] CPU: x PID: 1 Comm: init\n[    1.0] systemd: CPU: 0 PID: 1 Comm: init\n", ""},
		{"report before", "[    1.0] CPU: 0 PID: 1 Comm: init\n[    1.0] Kernel panic - not syncing: x\n", ""},
		{"cpu line alone", "[    1.0] CPU: 0 PID: 1 Comm: swapper/0 Not tainted 6.1.0-28-amd64 #1\n", ""},

		// Its trailer, alone when the panic line was missed.
		{"trailer", "[    1.236480] ---[ end Kernel panic - not syncing: VFS: Unable to mount root fs on unknown-block(0,0) ]---\n", vfs},
		{"trailer no timestamp", "---[ end Kernel panic - not syncing: VFS: Unable to mount root fs on unknown-block(0,0) ]---\r\n", vfs},
		{"trailer after a prompt", "vm login: [    1.234567] Kernel panic - not syncing: Attempted to kill init! exitcode=0x00000100\n[    1.240000] ---[ end Kernel panic - not syncing: Attempted to kill init! exitcode=0x00000100 ]---\n",
			"kernel panic: Attempted to kill init! exitcode=0x00000100"},
		{"trailer without its end", "[    1.2] ---[ end Kernel panic - not syncing: Fatal exc\n", "kernel panic: Fatal exc"},
		{"first verdict stands", "[    1.0] Kernel panic - not syncing: first\n[    1.1] ---[ end Kernel panic - not syncing: second ]---\n[    1.2] reboot: System halted\n", "kernel panic: first"},

		// Only mentions.
		{"systemd", "[    3.456789] systemd[1]: previous boot ended with Kernel panic - not syncing: foo\n", ""},
		{"prompt", "root@vm:~# echo \"Kernel panic - not syncing\"\n", ""},
		{"prompt with colon", "root@vm:~# echo 'Kernel panic - not syncing: test'\n", ""},
		{"audit", "[  5.0] audit: type=1400 audit(1707000000.212:2): comm=\"Kernel panic - not syncing: x\"\n", ""},
		{"journal", "Feb 03 10:11:12 vm kernel: Kernel panic - not syncing: Fatal exception\n", ""},
		{"leading text", "x Kernel panic - not syncing: Fatal exception\n", ""},
		{"leading space", " Kernel panic - not syncing: Fatal exception\n", ""},
		{"leading nul", "\x00Kernel panic - not syncing: Fatal exception\n", ""},
		{"two spaces after timestamp", "[    1.000000]  Kernel panic - not syncing: Fatal exception\n", ""},
		{"no space after timestamp", "[    1.000000]Kernel panic - not syncing: Fatal exception\n", ""},
		{"tab after timestamp", "[    1.000000]\tKernel panic - not syncing: Fatal exception\n", ""},
		{"bad timestamp", "[    1.00x000] Kernel panic - not syncing: Fatal exception\n", ""},
		{"not a timestamp", "[1] Kernel panic - not syncing: Fatal exception\n", ""},
		{"syslog level", "<0>Kernel panic - not syncing: Fatal exception\n", ""},
		{"no colon", "[    1.000000] Kernel panic - not syncing\n", ""},
		{"no space after colon", "[    1.000000] Kernel panic - not syncing:Fatal exception\n", ""},
		{"lower case", "[    1.000000] kernel panic - not syncing: Fatal exception\n", ""},
		{"no newline yet", "[    1.000000] Kernel panic - not syncing: Fatal exception", ""},
		{"cr is no newline", "[    1.000000] Kernel panic - not syncing: Fatal exception\r", ""},
		{"overwritten by cr", "Kernel panic - not syncing: x\rfoo\n", ""},
		{"unknown escape", "\x1b[2CKernel panic - not syncing: x\n", ""},
		{"command line", "[    0.000000] Kernel command line: console=ttyS0 panic=0 oops=panic\n", ""},
		{"oops trailer", "[   12.404080] ---[ end trace 0000000000000000 ]---\n", ""},
		{"oops", "[   12.401963] Oops: 0010 [#1] PREEMPT SMP NOPTI\n", ""},
		{"trailer mentioned", "[    3.0] x: ---[ end Kernel panic - not syncing: x ]---\n", ""},
		{"trailer indented", "  ---[ end Kernel panic - not syncing: x ]---\n", ""},
		{"rebooting", "[   10.000000] Rebooting in 10 seconds..\n", ""},

		// Halts.
		{"halted", "[   41.207733] reboot: System halted\n", halt},
		{"halted crlf", "[   41.207733] reboot: System halted\r\n", halt},
		{"halted no timestamp", "reboot: System halted\n", halt},
		{"halted caller id", "[   41.207733][    T1] reboot: System halted\n", halt},
		{"halted trailing space", "[   41.207733] reboot: System halted \n", halt},
		{"power down", "[   57.790122] reboot: Power down\n", ""},
		{"restarting", "[   57.790122] reboot: Restarting system\n", ""},
		{"halted more", "[   41.207733] reboot: System halted now\n", ""},
		{"halted mentioned", "[   41.207733] systemd-shutdown[1]: reboot: System halted\n", ""},
		{"halted echoed", "root@vm:~# echo reboot: System halted\n", ""},

		// FreeBSD's panic, confirmed by its cpuid line.
		{"freebsd", "panic: Going nowhere without my init!\ncpuid = 0\ntime = 1\n", "kernel panic: Going nowhere without my init!"},
		{"freebsd crlf", "panic: page fault\r\ncpuid = 1\r\n", "kernel panic: page fault"},
		{"freebsd later", "panic: page fault\nx\ny\ncpuid = 12\n", "kernel panic: page fault"},
		{"freebsd apic", "panic: page fault\ncpuid = 1; apic id = 01\n", "kernel panic: page fault"},
		{"freebsd second panic", "panic: a\npanic: b\ncpuid = 0\n", "kernel panic: b"},
		{"freebsd no message", "panic: \ncpuid = 0\n", "kernel panic"},
		{"freebsd too late", "panic: page fault\nx\ny\nz\ncpuid = 1\n", ""},
		{"freebsd before", "cpuid = 1\npanic: page fault\n", ""},
		{"freebsd lone", "panic: page fault\n", ""},
		{"freebsd lone then more", "panic: page fault\ntime = 1\nKDB: stack backtrace:\n", ""},
		{"freebsd bad cpuid", "panic: page fault\ncpuid = x\n", ""},
		{"freebsd cpuid no digits", "panic: page fault\ncpuid = \n", ""},
		{"freebsd cpuid more", "panic: page fault\ncpuid = 1 2\n", ""},
		{"freebsd cpuid indented", "panic: page fault\n cpuid = 1\n", ""},
		{"freebsd indented", " panic: page fault\ncpuid = 1\n", ""},
		{"freebsd timestamp", "[    1.000000] panic: page fault\ncpuid = 1\n", ""},
		{"freebsd no space", "panic:page fault\ncpuid = 1\n", ""},
		{"go panic", "panic: runtime error: index out of range [5] with length 3\n\ngoroutine 1 [running]:\nmain.main()\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := feedAll(t, []byte(tc.in))
			if got.reason != tc.want || got.dead != (tc.want != "") {
				t.Fatalf("Dead() = %q, %v; want %q", got.reason, got.dead, tc.want)
			}
		})
	}
}

func TestKernelTime(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		want time.Duration
	}{
		{"none", "", 0},
		{"one", "[    2.345678] virtio_net virtio1 enp0s2: renamed from eth0\n", 2345678 * time.Microsecond},
		{"crlf", "[    2.345678] x\r\n", 2345678 * time.Microsecond},
		{"zero", "[    0.000000] Linux version 6.1.0-18-amd64\n", 0},
		{"caller id", "[    3.000001][    T1] Run /init as init process\n", 3000001 * time.Microsecond},
		{"no text", "[    4.000000]\n", 4 * time.Second},
		{"no spaces", "[12.500000] x\n", 12500 * time.Millisecond},
		{"largest", "[99999999.999999] x\n", 99999999999999 * time.Microsecond},
		{"the largest seen", "[    5.000000] a\n[    3.000000] b\n", 5 * time.Second},
		{"after a reboot", "[   30.000000] reboot: Restarting system\n[    0.000000] Linux version\n[    1.000000] x\n", 30 * time.Second},
		{"after cr", "foo\r[    4.000000] bar\n", 4 * time.Second},
		{"after escapes", "\x1b[0;32m[    4.000000] bar\n", 4 * time.Second},
		{"line not ended", "[    4.000000] bar", 0},
		{"line ended", "[    4.000000] bar\n", 4 * time.Second},
		{"short fraction", "[    2.1] x\n", 0},
		{"long fraction", "[    2.1234567] x\n", 0},
		{"too large", "[100000000.000000] x\n", 0},
		{"garbage in seconds", "[   -1.000000] x\n", 0},
		{"no seconds", "[     .000000] x\n", 0},
		{"unterminated", "[    1.000000 x\n", 0},
		{"tab", "[\t1.000000] x\n", 0},
		{"not at line start", "x [    5.000000] y\n", 0},
		{"caller id first", "[    T1][    5.000000] y\n", 0},
		{"systemd status", "[\x1b[0;32m  OK  \x1b[0m] Started foo\n", 0},
		{"after a long line", strings.Repeat("x", 5000) + "\n[    6.000000] x\n", 6 * time.Second},
		{"past a long line's start", strings.Repeat("x", 5000) + "[    6.000000] x\n", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := feedAll(t, []byte(tc.in)); got.kt != tc.want {
				t.Fatalf("KernelTime() = %v, want %v", got.kt, tc.want)
			}
		})
	}
}

// readLog reads the console log name in testdata, with the line ends the
// guest's serial port has ("\r\n") when crlf is set.
func readLog(t testing.TB, name string, crlf bool) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	if crlf {
		b = bytes.ReplaceAll(b, []byte("\n"), []byte("\r\n"))
	}
	return b
}

func TestLogs(t *testing.T) {
	for _, tc := range []struct {
		name string
		want string
		kt   time.Duration
	}{
		{"boot-debian.log", "", 2612764 * time.Microsecond},
		{"panic-vfs.log", "kernel panic: VFS: Unable to mount root fs on unknown-block(0,0)", 1236480 * time.Microsecond},
		{"panic-init.log", "kernel panic: Attempted to kill init! exitcode=0x00000100", 2347502 * time.Microsecond},
		{"oops-fatal.log", "kernel panic: Fatal exception", 12405602 * time.Microsecond},
		{"freebsd-panic.log", "kernel panic: page fault", 0},
		{"halt.log", "the guest halted: reboot: System halted", 41207733 * time.Microsecond},
		{"halt-systemd.log", "the guest halted: reboot: System halted", 57790122 * time.Microsecond},
		{"poweroff.log", "", 57790122 * time.Microsecond},
		{"go-panic.log", "", 0},
	} {
		for _, crlf := range []bool{false, true} {
			got := feedAll(t, readLog(t, tc.name, crlf))
			if got.reason != tc.want || got.kt != tc.kt {
				t.Errorf("%s (crlf %v): Dead() = %q, KernelTime() = %v; want %q, %v", tc.name, crlf, got.reason, got.kt, tc.want, tc.kt)
			}
		}
	}
}

func TestBootThenPanic(t *testing.T) {
	in := append(readLog(t, "boot-debian.log", true), readLog(t, "panic-init.log", true)...)
	got := feedAll(t, in)
	if want := "kernel panic: Attempted to kill init! exitcode=0x00000100"; got.reason != want {
		t.Fatalf("Dead() = %q, want %q", got.reason, want)
	}
}

func TestLongLines(t *testing.T) {
	const (
		panicLine = "[    1.000000] Kernel panic - not syncing: x\n"
		report    = "[    1.000000] CPU: 0 PID: 1 Comm: swapper/0 Not tainted 6.1.0-28-amd64 #1\n"
	)
	for _, tc := range []struct {
		name string
		in   []byte
		want string
	}{
		{"long line, then a panic", []byte(strings.Repeat("y", 3*maxLine) + "\n" + panicLine + report), "kernel panic: x"},
		{"a panic far into a line", []byte(strings.Repeat("y", 3*maxLine) + panicLine), ""},
		{"a panic after the kept bytes", []byte(strings.Repeat("y", maxLine) + panicLine), ""},
		{"a panic after a cr", []byte(strings.Repeat("y", 5*maxLine) + "\r" + panicLine + report), "kernel panic: x"},
		{"a panic line of the bytes kept", []byte(panicLine[:len(panicLine)-2] + strings.Repeat("z", maxLine-len(panicLine)+2) + "\n" + report),
			"kernel panic: " + strings.Repeat("z", maxMessage) + ellipsis},
		{"a panic line longer", []byte(panicLine[:len(panicLine)-2] + strings.Repeat("z", maxLine) + "\n" + report),
			"kernel panic: " + strings.Repeat("z", maxMessage) + ellipsis},
		{"a long message", []byte("[    1.000000] Kernel panic - not syncing: " + strings.Repeat("é", 3*maxLine) + "\n" + report),
			"kernel panic: " + strings.Repeat("é", maxMessage/2) + ellipsis},
		{"a long trailer", []byte("[    1.000000] ---[ end Kernel panic - not syncing: " + strings.Repeat("z", 3*maxLine) + " ]---\n"),
			"kernel panic: " + strings.Repeat("z", maxMessage) + ellipsis},
		{"nul bytes", bytes.Repeat([]byte{0}, 3*maxLine), ""},
		{"invalid utf-8", bytes.Repeat([]byte{0xff, 0xfe, '\n', 0xc3}, maxLine), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := feedAll(t, tc.in)
			if got.reason != tc.want {
				t.Fatalf("Dead() = %q, want %q", got.reason, tc.want)
			}
			if len(got.reason) > maxReason {
				t.Fatalf("reason of %d bytes, more than %d", len(got.reason), maxReason)
			}
		})
	}
}

// TestFlood floods a watcher with 10 MiB on one line: it keeps none of it
// beyond its line buffer, allocates nothing, and finds no verdict until a
// newline ends the line and a panic line follows.
func TestFlood(t *testing.T) {
	flood := make([]byte, 10<<20)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range flood {
		flood[i] = byte(r.Uint32())
		if flood[i] == '\n' {
			flood[i] = 0
		}
	}
	copy(flood, "Kernel panic - not syncing") // no colon: only a mention
	w := New()
	for _, chunk := range [][]byte{flood, flood[:1], flood[:4096]} {
		if allocs := testing.AllocsPerRun(3, func() { _, _ = w.Write(chunk) }); allocs != 0 {
			t.Fatalf("Write of %d bytes allocates %v times", len(chunk), allocs)
		}
	}
	if reason, ok := w.Dead(); ok {
		t.Fatalf("Dead() = %q after a flood", reason)
	}
	_, _ = w.Write([]byte("\n[    1.000000] Kernel panic - not syncing: x\n[    1.000000] CPU: 0 PID: 1 Comm: init Not tainted\n"))
	if reason, _ := w.Dead(); reason != "kernel panic: x" {
		t.Fatalf("Dead() = %q after the flood and a panic", reason)
	}
}

func TestWriteAllocs(t *testing.T) {
	in := readLog(t, "boot-debian.log", true)
	w := New()
	if allocs := testing.AllocsPerRun(10, func() { _, _ = w.Write(in) }); allocs != 0 {
		t.Fatalf("Write of a boot log allocates %v times", allocs)
	}
}

func TestDeadOnceReported(t *testing.T) {
	w := New()
	dead := func() bool { _, ok := w.Dead(); return ok }
	_, _ = w.Write([]byte("[    1.000000] Kernel panic - not syncing: x"))
	if dead() {
		t.Fatal("dead before the panic line ended")
	}
	_, _ = w.Write([]byte("\r\n"))
	if dead() {
		t.Fatal("dead before the rest of the panic's report")
	}
	_, _ = w.Write([]byte("[    1.000000] CPU: 0 PID: 1 Comm: swapper/0 Not tainted\r\n"))
	if !dead() {
		t.Fatal("not dead after a panic line and its report")
	}
	_, _ = w.Write([]byte("[    1.000001] reboot: System halted\n"))
	if reason, ok := w.Dead(); reason != "kernel panic: x" || !ok {
		t.Fatalf("Dead() = %q, %v; want the first verdict", reason, ok)
	}
}

func TestKernelTimeGrows(t *testing.T) {
	w := New()
	_, _ = w.Write([]byte("[    1.999999] a\n[    2.100000] b"))
	if got := w.KernelTime(); got != 1999999*time.Microsecond {
		t.Fatalf("KernelTime() = %v before the second line ended", got)
	}
	_, _ = w.Write([]byte("\n[    0.500000] an earlier stamp\n"))
	if got := w.KernelTime(); got != 2100*time.Millisecond {
		t.Fatalf("KernelTime() = %v, want the largest stamp, 2.1s", got)
	}
}

// TestConcurrent writes and reads from many goroutines, for the race
// detector. Each write is a whole line, so the lines stay whole.
func TestConcurrent(t *testing.T) {
	lines := bytes.SplitAfter(readLog(t, "boot-debian.log", true), []byte("\n"))
	w := New()
	var writers, readers sync.WaitGroup
	for range 2 {
		writers.Go(func() {
			for _, l := range lines {
				_, _ = w.Write(l)
			}
		})
	}
	done := make(chan struct{})
	for range 2 {
		readers.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				_, _ = w.Dead()
				_ = w.KernelTime()
			}
		})
	}
	writers.Wait()
	_, _ = w.Write([]byte("reboot: System halted\n"))
	close(done)
	readers.Wait()
	if reason, _ := w.Dead(); reason != "the guest halted: reboot: System halted" {
		t.Fatalf("Dead() = %q", reason)
	}
}

func BenchmarkWrite(b *testing.B) {
	in := readLog(b, "boot-debian.log", true)
	w := New()
	b.SetBytes(int64(len(in)))
	b.ReportAllocs()
	for b.Loop() {
		for i := 0; i < len(in); i += 4096 {
			_, _ = w.Write(in[i:min(i+4096, len(in))])
		}
	}
}
