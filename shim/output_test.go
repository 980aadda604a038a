package shim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

func TestOutputNone(t *testing.T) {
	ctx, _ := testLogger(t)
	o, err := openOutput(ctx, "task1", "test", stdio{})
	if err != nil {
		t.Fatal(err)
	}
	if o.w != nil {
		t.Errorf("no stdout gives writer %v, want none", o.w)
	}
	if err := o.Close(); err != nil {
		t.Error(err)
	}
}

func TestOutputFile(t *testing.T) {
	for _, tc := range []struct {
		name, path string // path under a temporary directory
		old        string // content before; "" for no file
	}{
		{name: "appends", path: "console.log", old: "old\n"},
		{name: "creates", path: "a/b/console.log"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, _ := testLogger(t)
			path := filepath.Join(t.TempDir(), tc.path)
			if tc.old != "" {
				if err := os.WriteFile(path, []byte(tc.old), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			o, err := openOutput(ctx, "task1", "test", stdio{stdout: "file://" + path, stderr: "file://" + path + ".err"})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := o.w.Write([]byte("new\n")); err != nil {
				t.Fatal(err)
			}
			if err := o.Close(); err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if want := tc.old + "new\n"; string(got) != want {
				t.Errorf("file holds %q, want %q", got, want)
			}
		})
	}
}

func TestOutputRefused(t *testing.T) {
	for _, tc := range []struct {
		stdout string
		is     func(error) bool
	}{
		{stdout: "tcp://x", is: errdefs.IsInvalidArgument},
		{stdout: "file:console.log", is: errdefs.IsInvalidArgument},
		{stdout: "binary:logger?a=b", is: errdefs.IsInvalidArgument},
		{stdout: "://x", is: errdefs.IsInvalidArgument},
		{stdout: "binary:///nonexistent/logger", is: func(err error) bool { return errors.Is(err, os.ErrNotExist) }},
		{stdout: "/nonexistent/fifo", is: func(err error) bool { return errors.Is(err, os.ErrNotExist) }},
	} {
		t.Run(tc.stdout, func(t *testing.T) {
			ctx, _ := testLogger(t)
			o, err := openOutput(ctx, "task1", "test", stdio{stdout: tc.stdout})
			if err == nil {
				o.Close()
				t.Fatal("openOutput succeeded")
			}
			if !tc.is(err) {
				t.Errorf("error %v is not of the expected kind", err)
			}
		})
	}
}

func TestOutputFifo(t *testing.T) {
	ctx, _ := testLogger(t)
	stdout, stderr := mkfifo(t, "stdout"), mkfifo(t, "stderr")
	o, err := openOutput(ctx, "task1", "test", stdio{stdout: stdout, stderr: stderr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { o.Close() })
	// The shim holds a writer, so opening the read ends does not block.
	outR, err := os.OpenFile(stdout, os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer outR.Close()
	errR, err := os.OpenFile(stderr, os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer errR.Close()

	if _, err := o.w.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 5)
	if _, err := io.ReadFull(outR, b); err != nil || string(b) != "hello" {
		t.Fatalf("read %q, %v; want hello", b, err)
	}
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	for name, r := range map[string]*os.File{"stdout": outR, "stderr": errR} {
		done := make(chan string, 1)
		go func() {
			rest, err := io.ReadAll(r)
			done <- fmt.Sprintf("%q, %v", rest, err)
		}()
		if got := receive(t, done, name+" EOF after Close"); got != `"", <nil>` {
			t.Errorf("%s after Close: read %s, want EOF", name, got)
		}
	}
}

// loggerScript writes a logging binary to dir that records its pid, args
// and environment, runs ready, then copies its stdout pipe to dir/out.
func loggerScript(t *testing.T, dir, ready string) string {
	t.Helper()
	return writeScript(t, dir, "logger", fmt.Sprintf(`cd %q
echo $$ > pid
printf '%%s\n' "$@" > args
printf '%%s\n' "$CONTAINER_ID" "$CONTAINER_NAMESPACE" > env
%s
/bin/cat <&3 > out`, dir, ready))
}

// loggerPid returns the pid a logger script recorded in dir.
func loggerPid(t *testing.T, dir string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// checkReaped fails t if pid is still a process (a zombie included).
func checkReaped(t *testing.T, pid int) {
	t.Helper()
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("logger pid %d is still there (%v)", pid, err)
	}
}

func TestOutputLogger(t *testing.T) {
	for _, tc := range []struct {
		name, scheme, ready string
	}{
		{name: "binary closes ready", scheme: "binary", ready: "exec 5>&-"},
		{name: "binary writes ready", scheme: "binary", ready: "printf r >&5"},
		{name: "binary-v2", scheme: "binary-v2", ready: "printf r >&5; exec 5>&-"},
		{name: "binary-v2 keeps ready open", scheme: "binary-v2", ready: "printf r >&5"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, _ := testLogger(t)
			dir := t.TempDir()
			logger := loggerScript(t, dir, tc.ready)
			o, err := openOutput(ctx, "task1", "testns", stdio{stdout: tc.scheme + "://" + logger + "?key=value"})
			if err != nil {
				t.Fatal(err)
			}
			cmd := o.logger
			// Ready means the logger got as far as its ready step.
			for file, want := range map[string]string{"args": "key\nvalue\n", "env": "task1\ntestns\n"} {
				if got, err := os.ReadFile(filepath.Join(dir, file)); err != nil || string(got) != want {
					t.Errorf("logger %s: %q, %v; want %q", file, got, err, want)
				}
			}
			if _, err := o.w.Write([]byte("console output\n")); err != nil {
				t.Fatal(err)
			}
			if err := o.Close(); err != nil {
				t.Fatal(err)
			}
			if got, err := os.ReadFile(filepath.Join(dir, "out")); err != nil || string(got) != "console output\n" {
				t.Errorf("logger wrote %q, %v; want the console output", got, err)
			}
			if cmd == nil || cmd.ProcessState == nil || !cmd.ProcessState.Success() {
				t.Errorf("logger not reaped after Close, or failed: %v", cmd)
			}
			checkReaped(t, loggerPid(t, dir))
		})
	}
}

func TestOutputLoggerNotReady(t *testing.T) {
	for _, tc := range []struct {
		name, scheme, ready string
		timeout             time.Duration
		want                string
	}{
		{name: "v2 exits without ready byte", scheme: "binary-v2", ready: "exit 0", want: "without saying it was ready"},
		{name: "never ready", scheme: "binary", ready: ":", timeout: 300 * time.Millisecond, want: context.DeadlineExceeded.Error()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, _ := testLogger(t)
			if tc.timeout != 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.timeout)
				defer cancel()
			}
			dir := t.TempDir()
			logger := loggerScript(t, dir, tc.ready)
			o, err := openOutput(ctx, "task1", "testns", stdio{stdout: tc.scheme + "://" + logger})
			if err == nil {
				o.Close()
				t.Fatal("openOutput succeeded")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q, want one saying %q", err, tc.want)
			}
			checkReaped(t, loggerPid(t, dir))
		})
	}
}

func TestOutputLoggerStubborn(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for loggerExitTimeout, twice")
	}
	for _, tc := range []struct {
		name, body string
		want       syscall.Signal
	}{
		{name: "ignores EOF", body: "exec 5>&- 3<&- 4<&-; exec /bin/sleep 60", want: syscall.SIGTERM},
		{name: "ignores EOF and SIGTERM", body: "trap '' TERM; exec 5>&- 3<&- 4<&-; exec /bin/sleep 60", want: syscall.SIGKILL},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, _ := testLogger(t)
			logger := writeScript(t, t.TempDir(), "logger", tc.body)
			o, err := openOutput(ctx, "task1", "testns", stdio{stdout: "binary://" + logger})
			if err != nil {
				t.Fatal(err)
			}
			cmd := o.logger
			t.Cleanup(func() { _ = cmd.Process.Kill() })
			done := make(chan error, 1)
			go func() { done <- o.Close() }()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Close: %v", err)
				}
			case <-time.After(3*loggerExitTimeout + 5*time.Second):
				t.Fatal("Close did not return")
			}
			ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
			if !ok || !ws.Signaled() || ws.Signal() != tc.want {
				t.Errorf("logger ended with %v, want %v", cmd.ProcessState, tc.want)
			}
		})
	}
}

// writeScript writes an executable shell script called name into dir.
func writeScript(t *testing.T, dir, name, body string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}
