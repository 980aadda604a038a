package thread

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// waitTimeout bounds how long a test waits for a thread or process.
const waitTimeout = 5 * time.Second

// stepLog records what fake thread steps did, in order.
type stepLog struct {
	calls []string
	tid   int // the thread the last step ran on
}

// step is a fake Step named name that fails with err, or succeeds
// with an undo that reports back.
func (l *stepLog) step(name string, err error, back bool) Step {
	return func() (func() bool, error) {
		l.calls = append(l.calls, name)
		l.tid = unix.Gettid()
		if err != nil {
			return nil, err
		}
		return func() bool {
			l.calls = append(l.calls, "undo "+name)
			return back
		}, nil
	}
}

// moved is a fake Step named name that moves the thread for good and
// then fails with err.
func (l *stepLog) moved(name string, err error) Step {
	return func() (func() bool, error) {
		l.calls = append(l.calls, name)
		l.tid = unix.Gettid()
		return func() bool {
			l.calls = append(l.calls, "undo "+name)
			return false
		}, err
	}
}

func TestForkFromSteps(t *testing.T) {
	errStep := errors.New("step failed")
	for _, tc := range []struct {
		name     string
		path     string // the command; /bin/true when empty
		steps    func(l *stepLog) []Step
		want     []string
		wantErr  error
		started  bool
		lostTask bool // an undo failed: the thread must end
	}{
		{name: "no steps", steps: func(*stepLog) []Step { return nil }, started: true},
		{
			name:    "undone in reverse",
			steps:   func(l *stepLog) []Step { return []Step{l.step("a", nil, true), l.step("b", nil, true)} },
			want:    []string{"a", "b", "undo b", "undo a"},
			started: true,
		},
		{
			name: "failing step undoes the earlier ones",
			steps: func(l *stepLog) []Step {
				return []Step{l.step("a", nil, true), l.step("b", nil, true), l.step("c", errStep, true), l.step("d", nil, true)}
			},
			want:    []string{"a", "b", "c", "undo b", "undo a"},
			wantErr: errStep,
		},
		{
			name:    "first step fails",
			steps:   func(l *stepLog) []Step { return []Step{l.step("a", errStep, true)} },
			want:    []string{"a"},
			wantErr: errStep,
		},
		{
			name:    "start fails",
			path:    "/nonexistent/command",
			steps:   func(l *stepLog) []Step { return []Step{l.step("a", nil, true), l.step("b", nil, true)} },
			want:    []string{"a", "b", "undo b", "undo a"},
			wantErr: os.ErrNotExist,
		},
		{
			// A step that fails having moved the thread (a jail) can
			// only be undone by ending the thread.
			name: "failing step that moved the thread",
			steps: func(l *stepLog) []Step {
				return []Step{l.step("a", nil, true), l.moved("b", errStep)}
			},
			want:     []string{"a", "b", "undo b", "undo a"},
			wantErr:  errStep,
			lostTask: true,
		},
		{
			name: "undo fails",
			steps: func(l *stepLog) []Step {
				return []Step{l.step("a", nil, false), l.step("b", nil, true)}
			},
			want:     []string{"a", "b", "undo b", "undo a"},
			started:  true,
			lostTask: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := tc.path
			if path == "" {
				path = "/bin/true"
			}
			cmd := exec.Command(path)
			var l stepLog
			err := Fork(cmd, tc.steps(&l)...)
			if cmd.Process != nil {
				if werr := cmd.Wait(); werr != nil {
					t.Errorf("command: %v", werr)
				}
			}
			switch {
			case tc.wantErr == nil && err != nil:
				t.Errorf("Fork: %v", err)
			case tc.wantErr != nil && !errors.Is(err, tc.wantErr):
				t.Errorf("Fork: %v, want %v", err, tc.wantErr)
			}
			if started := cmd.Process != nil; started != tc.started {
				t.Errorf("command started: %v, want %v", started, tc.started)
			}
			if !reflect.DeepEqual(l.calls, tc.want) {
				t.Errorf("steps did %q, want %q", l.calls, tc.want)
			}
			if tc.lostTask && l.tid != os.Getpid() {
				// The thread is left locked and ends with its goroutine.
				task := fmt.Sprintf("/proc/self/task/%d", l.tid)
				deadline := time.Now().Add(waitTimeout)
				for {
					if _, err := os.Stat(task); errors.Is(err, os.ErrNotExist) {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("thread %d whose undo failed still runs", l.tid)
					}
					time.Sleep(10 * time.Millisecond)
				}
			}
		})
	}
}

// readlinkNetns runs `readlink /proc/self/ns/net` forked after steps.
func readlinkNetns(t *testing.T, steps ...Step) string {
	t.Helper()
	var out bytes.Buffer
	cmd := exec.Command("/bin/readlink", "/proc/self/ns/net")
	cmd.Stdout = &out
	if err := Fork(cmd, steps...); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(out.String())
}

func TestForkFromNetns(t *testing.T) {
	path := testNetns(t)
	ours := ourNetns(t)

	// The calling goroutine's thread stays where it is.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	before, err := os.Readlink("/proc/thread-self/ns/net")
	if err != nil {
		t.Fatal(err)
	}

	var tid int
	join := JoinNetns(path)
	recordTid := func() (func() bool, error) {
		tid = unix.Gettid()
		return join()
	}
	if got, want := readlinkNetns(t, recordTid), netnsID(t, path); got != want {
		t.Errorf("child of a thread that joined %s is in %s, want %s", path, got, want)
	}
	if got := readlinkNetns(t); got != ours {
		t.Errorf("child forked without steps is in %s, want ours %s", got, ours)
	}
	after, err := os.Readlink("/proc/thread-self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	if after != before {
		t.Errorf("calling thread moved from %s to %s", before, after)
	}
	// The forking thread went back before it was unlocked for other goroutines.
	if got, err := os.Readlink(fmt.Sprintf("/proc/self/task/%d/ns/net", tid)); err == nil && got != ours {
		t.Errorf("forking thread %d is left in %s, want ours %s", tid, got, ours)
	}
}

func TestJoinNetnsErrors(t *testing.T) {
	notNetns := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notNetns, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, path, want string
	}{
		{name: "missing", path: filepath.Join(t.TempDir(), "missing"), want: "open netns"},
		{name: "not a netns", path: notNetns, want: "enter netns"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command("/bin/true")
			err := Fork(cmd, JoinNetns(tc.path))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Fork: %v, want an error saying %q", err, tc.want)
			}
			if cmd.Process != nil {
				_ = cmd.Wait()
				t.Error("command started")
			}
		})
	}
}

// testNetns makes a network namespace pinned under a temporary directory
// and removes it when the test ends; it skips the test unless root.
func testNetns(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("making a network namespace needs root")
	}
	path := filepath.Join(t.TempDir(), "netns")
	if err := os.WriteFile(path, nil, 0o444); err != nil {
		t.Fatal(err)
	}
	if err := Run(func() error {
		return unix.Mount("/proc/thread-self/ns/net", path, "none", unix.MS_BIND, "")
	}, NewNetns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(path, unix.MNT_DETACH); err != nil {
			t.Error(err)
		}
	})
	return path
}

// netnsID names the network namespace at path as readlink of
// /proc/PID/ns/net does.
func netnsID(t *testing.T, path string) string {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatalf("stat %s: %v", path, err)
	}
	return fmt.Sprintf("net:[%d]", st.Ino)
}

// ourNetns names the test process's network namespace.
func ourNetns(t *testing.T) string {
	t.Helper()
	return netnsID(t, "/proc/self/ns/net")
}
