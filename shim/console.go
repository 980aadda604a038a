package shim

import (
	"context"
	"errors"
	"io"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/fifo"
	"github.com/containerd/log"
)

// drainTimeout bounds how long output left when the guest's console ends
// may wait for a reader of stdout before it is dropped.
const drainTimeout = time.Second

// consoleBuffer bounds how much console output waits for a slow reader of
// the task's stdout (about 20 s of a 115200 baud serial port); past it the
// oldest output is dropped, so the guest never stalls on its serial port.
const consoleBuffer = 256 << 10

// console joins the guest's serial port to the task's stdio fifos.
type console struct {
	conn   io.ReadWriteCloser
	buf    *ring
	done   chan struct{} // closed once all guest output has been written out
	cancel context.CancelFunc

	mu     sync.Mutex // guards stdin and out
	stdin  io.Closer
	out    *output // nil once closed
	stdout *os.File
}

// newConsole starts copying between conn (the guest's serial port) and the
// task's stdin fifo and its output (see openOutput), which it then owns.
func newConsole(ctx context.Context, conn io.ReadWriteCloser, io stdio, out *output) *console {
	ctx, cancel := context.WithCancel(ctx)
	c := &console{conn: conn, buf: newRing(consoleBuffer), done: make(chan struct{}), cancel: cancel, out: out, stdout: out.w}
	go c.readGuest()
	go c.writeStdout(ctx)
	if io.stdin != "" {
		go c.readStdin(ctx, io.stdin)
	}
	return c
}

// readGuest moves guest output into the buffer until the guest side closes.
func (c *console) readGuest() {
	b := make([]byte, 32<<10)
	for {
		n, err := c.conn.Read(b)
		if n > 0 {
			c.buf.Write(b[:n])
		}
		if err != nil {
			c.buf.Close()
			c.mu.Lock()
			if c.stdout != nil {
				_ = c.stdout.SetWriteDeadline(time.Now().Add(drainTimeout))
			}
			c.mu.Unlock()
			return
		}
	}
}

// writeStdout drains the buffer into the output; with none, or once it
// fails, output is discarded so the buffer keeps draining. When the
// guest's console ends and all is written, the output is closed, as a
// process's stdout and stderr would be when it exits.
func (c *console) writeStdout(ctx context.Context) {
	defer close(c.done)
	defer c.closeOutput(ctx)
	var w io.Writer = io.Discard
	if c.stdout != nil {
		c.mu.Lock()
		if c.buf.isClosed() {
			_ = c.stdout.SetWriteDeadline(time.Now().Add(drainTimeout))
		}
		c.mu.Unlock()
		w = c.stdout
	}
	b := make([]byte, 32<<10)
	for {
		n, err := c.buf.Read(b)
		if n > 0 && w != io.Discard {
			if _, werr := w.Write(b[:n]); werr != nil {
				log.G(ctx).WithError(werr).Debug("stdout closed, discarding console output")
				w = io.Discard
			}
		}
		if err != nil {
			return
		}
	}
}

// closeOutput closes the output once: its readers see the task's output
// end.
func (c *console) closeOutput(ctx context.Context) {
	c.mu.Lock()
	out := c.out
	c.out = nil
	c.mu.Unlock()
	if out == nil {
		return
	}
	if err := out.Close(); err != nil {
		log.G(ctx).WithError(err).Warn("close task output")
	}
}

// readStdin copies the stdin fifo to the guest until it ends.
func (c *console) readStdin(ctx context.Context, path string) {
	f, err := fifo.OpenFifo(ctx, path, syscall.O_RDONLY, 0)
	if err != nil {
		if !errors.Is(err, context.Canceled) {
			log.G(ctx).WithError(err).Warn("open stdin fifo")
		}
		return
	}
	c.mu.Lock()
	c.stdin = f
	c.mu.Unlock()
	_, _ = io.Copy(c.conn, f)
}

// note writes a line of the shim's own into the task's output, between
// the guest's lines, for whoever reads the container's log.
func (c *console) note(line string) {
	c.buf.Write([]byte("\r\n" + line + "\r\n"))
}

// flushed is closed once every byte the guest wrote has reached stdout
// (or been discarded); it happens after the guest side closes.
func (c *console) flushed() <-chan struct{} { return c.done }

// closeStdin stops forwarding input to the guest (CloseIO).
// Closing the fifo ends readStdin's copy; the guest side stays open.
func (c *console) closeStdin() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stdin != nil {
		_ = c.stdin.Close()
	}
}

// Close releases the fifos and the guest connection.
func (c *console) Close() error {
	c.cancel()
	c.buf.Close()
	err := c.conn.Close()
	c.mu.Lock()
	if c.stdin != nil {
		_ = c.stdin.Close()
	}
	c.mu.Unlock()
	c.closeOutput(context.Background())
	return err
}

// ring is a bounded byte queue whose writes never block: when full, the
// oldest bytes are dropped.
type ring struct {
	mu      sync.Mutex // guards everything below
	cond    *sync.Cond
	buf     []byte // circular, allocated on first write
	limit   int
	start   int // index of the oldest byte
	n       int // bytes held
	closed  bool
	dropped int64
}

func newRing(limit int) *ring {
	r := &ring{limit: limit}
	r.cond = sync.NewCond(&r.mu)
	return r
}

// Write appends p, dropping the oldest bytes beyond the limit.
func (r *ring) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return 0, io.ErrClosedPipe
	}
	if r.buf == nil {
		r.buf = make([]byte, r.limit)
	}
	written := len(p)
	if len(p) >= r.limit {
		// Only the newest limit bytes of p survive.
		r.dropped += int64(r.n + len(p) - r.limit)
		p = p[len(p)-r.limit:]
		r.start, r.n = 0, 0
	} else if over := r.n + len(p) - r.limit; over > 0 {
		r.start = (r.start + over) % r.limit
		r.n -= over
		r.dropped += int64(over)
	}
	end := (r.start + r.n) % r.limit
	c := copy(r.buf[end:], p)
	copy(r.buf, p[c:])
	r.n += len(p)
	r.cond.Signal()
	return written, nil
}

// Read blocks until data is available; it returns io.EOF once the ring is
// closed and empty.
func (r *ring) Read(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for r.n == 0 && !r.closed {
		r.cond.Wait()
	}
	if r.n == 0 {
		return 0, io.EOF
	}
	k := min(len(p), r.n)
	c := copy(p[:k], r.buf[r.start:min(r.start+k, r.limit)])
	copy(p[c:k], r.buf)
	r.start = (r.start + k) % r.limit
	r.n -= k
	return k, nil
}

// Close ends the ring: readers drain what is left, then get io.EOF.
func (r *ring) Close() {
	r.mu.Lock()
	r.closed = true
	r.cond.Broadcast()
	r.mu.Unlock()
}

// isClosed reports whether Close was called.
func (r *ring) isClosed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.closed
}

// Dropped reports how many bytes were dropped for want of a reader.
func (r *ring) Dropped() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.dropped
}
