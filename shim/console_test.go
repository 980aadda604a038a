package shim

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/v2/core/runtime"
)

func readAll(t *testing.T, r *ring, n int) []byte {
	t.Helper()
	got := make([]byte, 0, n)
	b := make([]byte, n)
	for len(got) < n {
		k, err := r.Read(b)
		got = append(got, b[:k]...)
		if err != nil {
			t.Fatalf("read after %d bytes: %v", len(got), err)
		}
	}
	return got
}

func TestRingDropsOldest(t *testing.T) {
	r := newRing(8)
	for _, s := range []string{"abcdef", "ghijk"} {
		if n, err := r.Write([]byte(s)); n != len(s) || err != nil {
			t.Fatalf("write %q: %d, %v", s, n, err)
		}
	}
	if got := r.Dropped(); got != 3 {
		t.Fatalf("dropped %d, want 3", got)
	}
	if got := readAll(t, r, 8); string(got) != "defghijk" {
		t.Fatalf("read %q, want the newest 8 bytes", got)
	}

	// One write larger than the ring keeps only its tail.
	r = newRing(4)
	if _, err := r.Write([]byte("0123456789")); err != nil {
		t.Fatal(err)
	}
	if got := r.Dropped(); got != 6 {
		t.Fatalf("dropped %d, want 6", got)
	}
	if got := readAll(t, r, 4); string(got) != "6789" {
		t.Fatalf("read %q, want 6789", got)
	}
}

func TestRingPartialReads(t *testing.T) {
	r := newRing(16)
	if _, err := r.Write([]byte("hello world")); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 5)
	var got []byte
	for len(got) < 11 {
		n, err := r.Read(b)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, b[:n]...)
	}
	if string(got) != "hello world" || r.Dropped() != 0 {
		t.Fatalf("read %q, dropped %d", got, r.Dropped())
	}
}

type readResult struct {
	data string
	err  error
}

// readAsync starts one Read on r.
func readAsync(r *ring) <-chan readResult {
	ch := make(chan readResult, 1)
	go func() {
		b := make([]byte, 64)
		n, err := r.Read(b)
		ch <- readResult{string(b[:n]), err}
	}()
	return ch
}

// stillBlocked checks that nothing arrives on ch for a short while.
func stillBlocked(t *testing.T, ch <-chan readResult) {
	t.Helper()
	select {
	case res := <-ch:
		t.Fatalf("read returned early: %q, %v", res.data, res.err)
	case <-time.After(20 * time.Millisecond):
	}
}

func TestRingReadBlocksUntilWrite(t *testing.T) {
	r := newRing(16)
	ch := readAsync(r)
	stillBlocked(t, ch)
	if _, err := r.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if res := receive(t, ch, "read"); res.data != "x" || res.err != nil {
		t.Fatalf("read %q, %v", res.data, res.err)
	}
}

func TestRingReadBlocksUntilClose(t *testing.T) {
	r := newRing(16)
	ch := readAsync(r)
	stillBlocked(t, ch)
	r.Close()
	if res := receive(t, ch, "read"); res.data != "" || !errors.Is(res.err, io.EOF) {
		t.Fatalf("read %q, %v; want EOF", res.data, res.err)
	}
}

func TestRingCloseDrainsThenEOF(t *testing.T) {
	r := newRing(16)
	if _, err := r.Write([]byte("last words")); err != nil {
		t.Fatal(err)
	}
	r.Close()
	if _, err := r.Write([]byte("more")); !errors.Is(err, io.ErrClosedPipe) {
		t.Fatalf("write after close: %v, want ErrClosedPipe", err)
	}
	if got := readAll(t, r, 10); string(got) != "last words" {
		t.Fatalf("read %q after close", got)
	}
	for range 2 {
		if n, err := r.Read(make([]byte, 4)); n != 0 || !errors.Is(err, io.EOF) {
			t.Fatalf("read of drained ring: %d, %v; want EOF", n, err)
		}
	}
}

func TestRingConcurrentNoLoss(t *testing.T) {
	r := newRing(1 << 20)
	var want bytes.Buffer
	for i := range 2000 {
		want.WriteString(time.Duration(i).String())
	}
	go func() {
		p := want.Bytes()
		for len(p) > 0 {
			n := min(len(p), 7)
			_, _ = r.Write(p[:n])
			p = p[n:]
		}
		r.Close()
	}()
	got, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want.Bytes()) || r.Dropped() != 0 {
		t.Fatalf("read %d bytes (dropped %d), want %d", len(got), r.Dropped(), want.Len())
	}
}

// startConsole starts a console on a net.Pipe and returns it with the
// guest's side; both are closed when the test ends.
func startConsole(t *testing.T, stdin, stdout string) (*console, net.Conn) {
	t.Helper()
	ctx, _ := testLogger(t)
	host, guest := net.Pipe()
	io := stdio{stdin: stdin, stdout: stdout}
	out, err := openOutput(ctx, "test", "default", io)
	if err != nil {
		t.Fatal(err)
	}
	c := newConsole(ctx, host, io, out)
	t.Cleanup(func() {
		_ = guest.Close()
		_ = c.Close()
	})
	return c, guest
}

// writeAsync writes p to w in the background.
func writeAsync(w io.Writer, p []byte) <-chan error {
	ch := make(chan error, 1)
	go func() {
		_, err := w.Write(p)
		ch <- err
	}()
	return ch
}

func TestConsoleNoStdoutDiscards(t *testing.T) {
	c, guest := startConsole(t, "", "")
	data := bytes.Repeat([]byte("boot log line\n"), 20000) // more than the ring holds
	if err := receive(t, writeAsync(guest, data), "guest write"); err != nil {
		t.Fatal(err)
	}
	if isClosedNow(c.flushed()) {
		t.Fatal("flushed before the guest side closed")
	}
	_ = guest.Close()
	if !closedWithin(c.flushed()) {
		t.Fatal("flushed not closed after guest EOF")
	}
}

func TestConsoleToStdoutFifo(t *testing.T) {
	path := mkfifo(t, "stdout")
	c, guest := startConsole(t, "", path)
	r := receive(t, openFifo(t, path, os.O_RDONLY), "stdout reader")
	if err := r.SetReadDeadline(time.Now().Add(waitTimeout)); err != nil {
		t.Fatal(err)
	}

	want := []byte("Linux version 6.1\nlogin: ")
	if err := receive(t, writeAsync(guest, want), "guest write"); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(want))
	if _, err := io.ReadFull(r, got); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("stdout read %q, %v; want %q", got, err, want)
	}

	_ = guest.Close()
	if !closedWithin(c.flushed()) {
		t.Fatal("flushed not closed after guest EOF")
	}
	_ = c.Close()
	if n, err := r.Read(make([]byte, 1)); n != 0 || !errors.Is(err, io.EOF) {
		t.Fatalf("stdout after close: %d, %v; want EOF", n, err)
	}
}

func TestConsoleStdoutReaderGone(t *testing.T) {
	path := mkfifo(t, "stdout")
	c, guest := startConsole(t, "", path)
	r := receive(t, openFifo(t, path, os.O_RDONLY), "stdout reader")
	if err := receive(t, writeAsync(guest, []byte("hi")), "guest write"); err != nil {
		t.Fatal(err)
	}
	if err := r.SetReadDeadline(time.Now().Add(waitTimeout)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(r, make([]byte, 2)); err != nil {
		t.Fatal(err)
	}
	_ = r.Close() // the reader goes away: writes to the fifo now fail

	if err := receive(t, writeAsync(guest, make([]byte, 4<<20)), "4 MiB guest write"); err != nil {
		t.Fatal(err)
	}
	_ = guest.Close()
	if !closedWithin(c.flushed()) {
		t.Fatal("flushed not closed after guest EOF")
	}
}

func TestConsoleStalledReaderDoesNotBlockGuest(t *testing.T) {
	path := mkfifo(t, "stdout")
	c, guest := startConsole(t, "", path)
	receive(t, openFifo(t, path, os.O_RDONLY), "stdout reader") // open, never read

	if err := receive(t, writeAsync(guest, make([]byte, 4<<20)), "4 MiB guest write"); err != nil {
		t.Fatal(err)
	}
	if c.buf.Dropped() == 0 {
		t.Fatal("4 MiB through a stalled reader and a 1 MiB ring dropped nothing")
	}
}

func TestConsoleStdoutNeverOpened(t *testing.T) {
	// Nobody opens the stdout fifo: output waits in the ring and Close
	// still ends the console.
	path := mkfifo(t, "stdout")
	c, guest := startConsole(t, "", path)
	if err := receive(t, writeAsync(guest, []byte("unseen")), "guest write"); err != nil {
		t.Fatal(err)
	}
	_ = c.Close()
	if !closedWithin(c.flushed()) {
		t.Fatal("flushed not closed after Close")
	}
}

// stdinOpened waits until the console has opened its stdin fifo.
func stdinOpened(t *testing.T, c *console) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for {
		c.mu.Lock()
		ok := c.stdin != nil
		c.mu.Unlock()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("stdin fifo never opened")
		}
		time.Sleep(time.Millisecond)
	}
}

func TestConsoleStdinReachesGuest(t *testing.T) {
	path := mkfifo(t, "stdin")
	c, guest := startConsole(t, path, "")
	w := receive(t, openFifo(t, path, os.O_WRONLY), "stdin writer")
	if err := guest.SetReadDeadline(time.Now().Add(waitTimeout)); err != nil {
		t.Fatal(err)
	}

	if _, err := w.Write([]byte("root\n")); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 5)
	if _, err := io.ReadFull(guest, got); err != nil || string(got) != "root\n" {
		t.Fatalf("guest read %q, %v", got, err)
	}

	stdinOpened(t, c)
	c.closeStdin()
	// The console's end of the fifo is closed: the writer has no reader.
	if _, err := w.Write([]byte("more\n")); !errors.Is(err, syscall.EPIPE) {
		t.Fatalf("write to stdin after closeStdin: %v, want EPIPE", err)
	}
	if err := guest.SetReadDeadline(time.Now().Add(20 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if n, err := guest.Read(make([]byte, 16)); n != 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("guest read after closeStdin: %d, %v", n, err)
	}
	// The guest side stays open: its output still flows.
	if err := receive(t, writeAsync(guest, []byte("# ")), "guest write"); err != nil {
		t.Fatal(err)
	}
}

func TestConsoleCloseStdinBeforeOpen(t *testing.T) {
	c, _ := startConsole(t, "", "")
	c.closeStdin() // no stdin: nothing to close, must not panic
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestServiceConsoleToStdout(t *testing.T) {
	s, l, p, _ := newService(t)
	path := mkfifo(t, "stdout")
	create(t, s, p, &taskAPI.CreateTaskRequest{ID: "vm1", Stdout: path})
	r := receive(t, openFifo(t, path, os.O_RDONLY), "stdout reader")
	if err := r.SetReadDeadline(time.Now().Add(waitTimeout)); err != nil {
		t.Fatal(err)
	}
	want := []byte("SeaBIOS (version 1.16)\r\n")
	if err := receive(t, writeAsync(l.vm(t, "vm1").guest, want), "guest write"); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(want))
	if _, err := io.ReadFull(r, got); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("stdout read %q, %v; want %q", got, err, want)
	}
}

func TestServiceExitAfterConsoleFlushed(t *testing.T) {
	s, l, p, _ := newService(t)
	path := mkfifo(t, "stdout")
	running(t, s, p, "vm1")
	create(t, s, p, &taskAPI.CreateTaskRequest{ID: "vm2", Stdout: path})
	s.mu.Lock()
	cons := s.tasks["vm2"].cons
	s.mu.Unlock()
	flushedAtExit := make(chan bool, 1)
	p.setHook(func(topic string, _ any) {
		if topic == runtime.TaskExitEventTopic {
			flushedAtExit <- isClosedNow(cons.flushed())
		}
	})

	// The last words of the guest are still on their way to stdout (nobody
	// reads it yet) when QEMU exits.
	vm := l.vm(t, "vm2")
	want := bytes.Repeat([]byte("reboot: Power down\n"), 256<<10/19)
	if err := receive(t, writeAsync(vm.guest, want), "guest write"); err != nil {
		t.Fatal(err)
	}
	vm.exit(0)
	r := receive(t, openFifo(t, path, os.O_RDONLY), "stdout reader")
	if err := r.SetReadDeadline(time.Now().Add(waitTimeout)); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(want))
	if _, err := io.ReadFull(r, got); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("stdout lost output: read %d of %d bytes, %v", len(bytes.TrimRight(got, "\x00")), len(want), err)
	}
	if ev := expect[*eventstypes.TaskExit](t, p, runtime.TaskExitEventTopic); ev.ContainerID != "vm2" {
		t.Fatalf("TaskExit %+v", ev)
	}
	if !receive(t, flushedAtExit, "exit hook") {
		t.Fatal("TaskExit published before the console output was flushed")
	}
}

func TestServiceCloseIO(t *testing.T) {
	s, l, p, _ := newService(t)
	ctx := context.Background()
	path := mkfifo(t, "stdin")
	create(t, s, p, &taskAPI.CreateTaskRequest{ID: "vm1", Stdin: path})
	w := receive(t, openFifo(t, path, os.O_WRONLY), "stdin writer")
	if _, err := w.Write([]byte("ls\n")); err != nil {
		t.Fatal(err)
	}
	guest := l.vm(t, "vm1").guest
	if err := guest.SetReadDeadline(time.Now().Add(waitTimeout)); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 3)
	if _, err := io.ReadFull(guest, got); err != nil || string(got) != "ls\n" {
		t.Fatalf("guest read %q, %v", got, err)
	}
	s.mu.Lock()
	cons := s.tasks["vm1"].cons
	s.mu.Unlock()
	stdinOpened(t, cons)
	if _, err := s.CloseIO(ctx, &taskAPI.CloseIORequest{ID: "vm1", Stdin: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write([]byte("more\n")); err == nil {
		t.Fatal("stdin still read after CloseIO")
	}
}

// TestRingWrapsAround interleaves writes and reads of random sizes that
// wrap the circular buffer many times, checking against a plain queue.
func TestRingWrapsAround(t *testing.T) {
	const limit = 97
	r := newRing(limit)
	rnd := rand.New(rand.NewPCG(1, 2))
	var want []byte
	var next byte
	for i := 0; i < 5000; i++ {
		if rnd.IntN(2) == 0 {
			p := make([]byte, rnd.IntN(limit+20))
			for j := range p {
				p[j] = next
				next++
			}
			if _, err := r.Write(p); err != nil {
				t.Fatal(err)
			}
			want = append(want, p...)
			if len(want) > limit {
				want = want[len(want)-limit:]
			}
			continue
		}
		if len(want) == 0 {
			continue
		}
		p := make([]byte, 1+rnd.IntN(limit))
		n, err := r.Read(p)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(p[:n], want[:n]) {
			t.Fatalf("step %d: read %v, want %v", i, p[:n], want[:n])
		}
		want = want[n:]
	}
}
