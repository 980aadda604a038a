package shim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
)

// loggerReadyTimeout bounds how long a logging binary may take to say it
// is ready.
const loggerReadyTimeout = 30 * time.Second

// loggerExitTimeout bounds how long a logging binary may take to finish
// once its pipes are closed, before it is sent SIGTERM, and again before
// it is killed.
const loggerExitTimeout = 5 * time.Second

// output is where the guest's console goes: the task's stdout as
// containerd names it. That is a fifo path, `file:///PATH` (append to a
// file), or `binary:///PATH?ARGS` (a logging binary, as nerdctl's and
// `ctr run --log-uri` use, started the way containerd's runc shim does:
// stdout and stderr pipes as fds 3 and 4, a readiness pipe as fd 5,
// CONTAINER_ID and CONTAINER_NAMESPACE in its environment).
type output struct {
	w       *os.File    // where console output is written; nil discards it
	closers []io.Closer // closed, in order, by Close
	logger  *exec.Cmd   // the logging binary, if any
}

// line writes a line of the shim's own into the output while the task is
// made, before the guest's console takes it over; a reader that does not
// keep up loses the line rather than holding the create up.
func (o *output) line(s string) {
	if o == nil || o.w == nil {
		return
	}
	_ = o.w.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = o.w.WriteString(s + "\n")
	_ = o.w.SetWriteDeadline(time.Time{})
}

// openOutput opens the task's stdout (and stderr, which the guest's single
// console leaves empty but which readers wait on too).
func openOutput(ctx context.Context, id, ns string, io stdio) (*output, error) {
	if io.stdout == "" {
		return &output{}, nil
	}
	u, err := url.Parse(io.stdout)
	if err != nil {
		return nil, fmt.Errorf("stdout %q: %w", io.stdout, errdefs.ErrInvalidArgument)
	}
	if u.Opaque != "" {
		return nil, fmt.Errorf("stdout %q: the path is not absolute: %w", io.stdout, errdefs.ErrInvalidArgument)
	}
	switch u.Scheme {
	case "", "fifo":
		return openFifos(ctx, io)
	case "file":
		return openFile(u.Path)
	case "binary", "binary-v2":
		return startLogger(ctx, id, ns, u)
	}
	return nil, fmt.Errorf("stdout %q: scheme %q is not one of fifo, file, binary: %w", io.stdout, u.Scheme, errdefs.ErrInvalidArgument)
}

// openFifos opens the stdout and stderr fifos for writing. A read end of
// each is held, never read, so that while containerd is away (restarting)
// writes wait instead of failing with EPIPE; the console's ring keeps the
// guest from stalling meanwhile. Both ends are pollable, so writes honour
// deadlines and Close.
func openFifos(ctx context.Context, io stdio) (*output, error) {
	o := &output{}
	for _, path := range []string{io.stdout, io.stderr} {
		if path == "" {
			continue
		}
		keep, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
		if err != nil {
			o.Close()
			return nil, fmt.Errorf("open output fifo %s: %w", path, err)
		}
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			keep.Close()
			o.Close()
			return nil, fmt.Errorf("open output fifo %s: %w", path, err)
		}
		o.closers = append(o.closers, f, keep)
		if o.w == nil {
			o.w = f
		}
	}
	log.G(ctx).WithField("stdout", io.stdout).Debug("console goes to fifo")
	return o, nil
}

// openFile appends the console to the file at path.
func openFile(path string) (*output, error) {
	if !filepath.IsAbs(path) {
		return nil, fmt.Errorf("log file %q is not an absolute path: %w", path, errdefs.ErrInvalidArgument)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("create log file directory: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open log file: %w", err)
	}
	return &output{w: f, closers: []io.Closer{f}}, nil
}

// startLogger starts the logging binary u names and waits until it says
// it is ready.
func startLogger(ctx context.Context, id, ns string, u *url.URL) (_ *output, retErr error) {
	if !filepath.IsAbs(u.Path) {
		return nil, fmt.Errorf("logging binary %q is not an absolute path: %w", u.Path, errdefs.ErrInvalidArgument)
	}
	o := &output{}
	defer func() {
		if retErr != nil {
			o.Close()
		}
	}()
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	o.w = outW
	o.closers = append(o.closers, outW)
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		return nil, err
	}
	o.closers = append(o.closers, errW)
	readyR, readyW, err := os.Pipe()
	if err != nil {
		outR.Close()
		errR.Close()
		return nil, err
	}
	defer readyR.Close()

	var args []string
	for k, vs := range u.Query() {
		args = append(args, k)
		if len(vs) > 0 {
			args = append(args, vs[0])
		}
	}
	cmd := exec.Command(u.Path, args...)
	cmd.Env = []string{"CONTAINER_ID=" + id, "CONTAINER_NAMESPACE=" + ns}
	cmd.ExtraFiles = []*os.File{outR, errR, readyW}
	err = cmd.Start()
	outR.Close()
	errR.Close()
	readyW.Close()
	if err != nil {
		return nil, fmt.Errorf("start logging binary %s: %w", u.Path, err)
	}
	o.logger = cmd

	ready := make(chan error, 1)
	go func() {
		b := make([]byte, 1)
		n, err := readyR.Read(b)
		switch {
		case err != nil && !errors.Is(err, io.EOF):
			ready <- err
		case u.Scheme == "binary-v2" && n == 0:
			ready <- errors.New("it exited without saying it was ready")
		default:
			ready <- nil
		}
	}()
	select {
	case err = <-ready:
	case <-ctx.Done():
		err = ctx.Err()
	case <-time.After(loggerReadyTimeout):
		err = fmt.Errorf("not ready within %s", loggerReadyTimeout)
	}
	if err != nil {
		return nil, fmt.Errorf("logging binary %s: %w", u.Path, err)
	}
	log.G(ctx).WithField("logger", u.Path).Debug("console goes to logging binary")
	return o, nil
}

// Close closes the output: a logging binary sees its pipes end and is
// waited for (then sent SIGTERM, then killed, each after
// loggerExitTimeout).
func (o *output) Close() error {
	var errs []error
	for _, c := range o.closers {
		if err := c.Close(); err != nil && !errors.Is(err, os.ErrClosed) {
			errs = append(errs, err)
		}
	}
	o.closers = nil
	if o.logger != nil {
		errs = append(errs, stopLogger(o.logger))
		o.logger = nil
	}
	return errors.Join(errs...)
}

// stopLogger waits for a logging binary whose input has ended.
func stopLogger(cmd *exec.Cmd) error {
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	for _, sig := range []os.Signal{nil, syscall.SIGTERM, os.Kill} {
		if sig != nil {
			_ = cmd.Process.Signal(sig)
		}
		select {
		case err := <-done:
			var exit *exec.ExitError
			if errors.As(err, &exit) && sig != nil {
				return nil // ended by our signal
			}
			return err
		case <-time.After(loggerExitTimeout):
		}
	}
	return fmt.Errorf("logging binary %s (pid %d) did not exit", cmd.Path, cmd.Process.Pid)
}
