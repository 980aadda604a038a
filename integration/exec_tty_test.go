package integration

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/pkg/cio"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"k8s.io/client-go/tools/remotecommand"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// terminal is the client's side of an exec with a terminal, without a
// pty of its own: the bytes it types, what the terminal shows, and its
// window size.
type terminal struct {
	in     io.Writer
	screen *screen
	resize func(width, height uint32) error
}

// screen collects a terminal's output; marks let a test look only at
// what came after an action.
type screen struct {
	mu      sync.Mutex
	buf     strings.Builder
	changed chan struct{}
}

func newScreen() *screen { return &screen{changed: make(chan struct{})} }

// Write adds output.
func (s *screen) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.buf.Write(p)
	close(s.changed)
	s.changed = make(chan struct{})
	return len(p), nil
}

// mark is where the output ends now.
func (s *screen) mark() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Len()
}

// since returns the output after mark.
func (s *screen) since(mark int) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()[mark:]
}

// waitFor waits until the output after mark satisfies ok.
func (s *screen) waitFor(ctx context.Context, t *testing.T, mark int, what string, ok func(string) bool) {
	t.Helper()
	for {
		s.mu.Lock()
		out, ch := s.buf.String()[mark:], s.changed
		s.mu.Unlock()
		if ok(out) {
			return
		}
		select {
		case <-ch:
		case <-ctx.Done():
			t.Fatalf("terminal never showed %s: %v\nafter the mark:\n%q", what, ctx.Err(), out)
		}
	}
}

// hasLine reports whether out has a line that is exactly line.
func hasLine(out, line string) bool {
	for _, l := range strings.Split(strings.ReplaceAll(out, "\r", ""), "\n") {
		if l == line {
			return true
		}
	}
	return false
}

// typeIn types s and returns the output's mark from before.
func (term *terminal) typeIn(t *testing.T, s string) int {
	t.Helper()
	mark := term.screen.mark()
	if _, err := io.WriteString(term.in, s); err != nil {
		t.Fatalf("type %q: %v", s, err)
	}
	return mark
}

// run types a command line and waits for a line of output that is
// exactly want.
func (term *terminal) run(ctx context.Context, t *testing.T, cmd, want string) string {
	t.Helper()
	mark := term.typeIn(t, cmd+"\n")
	term.screen.waitFor(ctx, t, mark, "the line "+want, func(out string) bool { return hasLine(out, want) })
	return term.screen.since(mark)
}

// exerciseShell drives the guest's shell, whose window was 40x120 at
// start, as a user would, and leaves it exiting with 7: the echo of what
// is typed and the output, the size, a resize that changes it and
// reaches a WINCH trap, and Ctrl-C ending a foreground program.
func exerciseShell(ctx context.Context, t *testing.T, term *terminal) {
	t.Helper()
	term.run(ctx, t, "stty size", "40 120")

	out := term.run(ctx, t, "echo hi", "hi")
	if !strings.Contains(out, "echo hi") {
		t.Errorf("typed text not echoed: %q", out)
	}

	// The shell waits for a background job, so that it is the one in the
	// foreground process group that SIGWINCH reaches.
	term.run(ctx, t, `trap 'echo WINCH' WINCH; echo trap-set-$((2+3)); sleep 30 & wait`, "trap-set-5")
	mark := term.screen.mark()
	if err := term.resize(132, 50); err != nil {
		t.Fatalf("resize: %v", err)
	}
	term.screen.waitFor(ctx, t, mark, "WINCH after the resize", func(out string) bool { return hasLine(out, "WINCH") })
	term.run(ctx, t, "stty size", "50 132")

	term.run(ctx, t, "echo sleeping-$((2*4)); sleep 100", "sleeping-8")
	time.Sleep(time.Second) // sleep has started
	start := time.Now()
	mark = term.typeIn(t, "\x03")
	term.screen.waitFor(ctx, t, mark, "^C", func(out string) bool { return strings.Contains(out, "^C") })
	term.run(ctx, t, "echo back-$((3*3))", "back-9")
	if d := time.Since(start); d > 60*time.Second {
		t.Errorf("the prompt came back %v after Ctrl-C: sleep 100 was not interrupted", d)
	}
	term.typeIn(t, "exit 7\n")
}

// TestExecTTYContainerd runs an interactive shell in the guest through
// containerd's task API, as `ctr task exec -t` does, with a client that
// writes bytes and reads the terminal's output; then it kills programs
// running on a terminal.
func TestExecTTYContainerd(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*bootTimeout)
	defer cancel()
	v := startVM(ctx, t, imageKernelAgent)
	v.console.waitFor(ctx, t, markerAgent)
	v.console.waitFor(ctx, t, markerBooted)

	inR, inW := io.Pipe()
	defer inW.Close()
	term := &terminal{in: inW, screen: newScreen()}
	proc, statusC := execProcess(ctx, t, v, "tty", &specs.Process{Args: []string{"sh"}, Env: []string{"PATH=/usr/bin:/bin"}, Cwd: "/", Terminal: true},
		cio.NewCreator(cio.WithStreams(inR, term.screen, nil), cio.WithTerminal))
	term.resize = func(w, h uint32) error { return proc.Resize(ctx, w, h) }
	if err := term.resize(120, 40); err != nil {
		t.Fatalf("resize: %v", err)
	}
	exerciseShell(ctx, t, term)
	select {
	case st := <-statusC:
		if code, _, err := st.Result(); err != nil || code != 7 {
			t.Errorf("exit %d, %v; want 7", code, err)
		}
	case <-ctx.Done():
		t.Fatalf("the shell did not exit; terminal:\n%q", term.screen.since(0))
	}
	proc.IO().Wait()
	t.Logf("terminal:\n%s", term.screen.since(0))
	if _, err := proc.Delete(ctx); err != nil {
		t.Errorf("exec delete: %v", err)
	}
	killTTYExecs(ctx, t, v)

	// A session still open does not hold up the task's SIGKILL and delete.
	left, err := v.task.Exec(ctx, "left", &specs.Process{Args: []string{"sh"}, Cwd: "/", Terminal: true},
		cio.NewCreator(cio.WithStreams(nil, io.Discard, nil), cio.WithTerminal))
	if err != nil {
		t.Fatalf("exec: %v", err)
	}
	if err := left.Start(ctx); err != nil {
		t.Fatalf("exec start: %v", err)
	}
	start := time.Now()
	v.remove(t)
	t.Logf("task with an open terminal session removed in %v", time.Since(start).Round(time.Millisecond))
	assertNothingLeft(ctx, t, v.id)
}

// killTTYExecs signals programs running on a terminal as containerd's
// Kill does: the program gets the signal (sleep's status tells which),
// not script, which runs it.
func killTTYExecs(ctx context.Context, t *testing.T, v *vm) {
	t.Helper()
	for i, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		screen := newScreen()
		mark := screen.mark()
		// The program runs once the shell has said so (it then becomes
		// sleep; a signal in between ends the shell with the same
		// status), never before script has started it.
		args := []string{"sh", "-c", "echo VMSHIM-SLEEPING; exec sleep 1000"}
		proc, statusC := execProcess(ctx, t, v, fmt.Sprintf("kill%d", i), &specs.Process{Args: args, Cwd: "/", Terminal: true},
			cio.NewCreator(cio.WithStreams(nil, screen, nil), cio.WithTerminal))
		screen.waitFor(ctx, t, mark, "the program running", func(out string) bool { return strings.Contains(out, "VMSHIM-SLEEPING") })
		if err := proc.Kill(ctx, sig); err != nil {
			t.Fatalf("kill %v: %v", sig, err)
		}
		select {
		case st := <-statusC:
			if code, _, err := st.Result(); err != nil || code != 128+uint32(sig) {
				t.Errorf("%v: exit %d, %v; want %d", sig, code, err, 128+int(sig))
			}
		case <-ctx.Done():
			t.Fatalf("%v did not end the exec", sig)
		}
		proc.IO().Wait()
		if _, err := proc.Delete(ctx); err != nil {
			t.Errorf("exec delete: %v", err)
		}
	}
}

// sizeQueue is the window sizes a remotecommand client sends.
type sizeQueue chan *remotecommand.TerminalSize

// Next returns the next size, or nil once the queue is closed.
func (q sizeQueue) Next() *remotecommand.TerminalSize { return <-q }

// TestExecTTYCRI runs an interactive shell in the guest through the CRI's
// exec stream with a tty and a window size queue, as `kubectl exec -it`
// does.
func TestExecTTYCRI(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*bootTimeout)
	defer cancel()
	p, vm := runAgentVM(ctx, t, "exectty")

	resp, err := p.c.runtime.Exec(ctx, &runtimeapi.ExecRequest{ContainerId: vm.id, Cmd: []string{"sh"}, Stdin: true, Stdout: true, Tty: true})
	if err != nil {
		t.Fatalf("Exec: %v", err)
	}
	inR, inW := io.Pipe()
	defer inW.Close()
	sizes := make(sizeQueue, 4)
	defer close(sizes)
	sizes <- &remotecommand.TerminalSize{Width: 120, Height: 40}
	term := &terminal{in: inW, screen: newScreen(), resize: func(w, h uint32) error {
		sizes <- &remotecommand.TerminalSize{Width: uint16(w), Height: uint16(h)}
		return nil
	}}
	streamed := make(chan error, 1)
	go func() {
		streamed <- streamExec(ctx, resp.Url, remotecommand.StreamOptions{
			Stdin: inR, Stdout: term.screen, Tty: true, TerminalSizeQueue: sizes,
		})
	}()
	exerciseShell(ctx, t, term)
	select {
	case err := <-streamed:
		if err == nil || !strings.Contains(err.Error(), "exit code 7") {
			t.Errorf("stream: %v, want exit code 7", err)
		}
	case <-ctx.Done():
		t.Fatalf("the shell did not exit; terminal:\n%q", term.screen.since(0))
	}
	t.Logf("terminal:\n%s", term.screen.since(0))
	p.remove(t)
	assertNothingLeftCRI(t, vm.id)
}
