package shim

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	goruntime "runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/v2/core/runtime"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/vmshim/vmshim/launch"
	"github.com/vmshim/vmshim/qemu"
)

// ttyAgent returns a fake agent whose guest opens a terminal's port as
// soon as its program starts, and whose terminal programs run until the
// test ends them.
func ttyAgent() *fakeAgent {
	a := newFakeAgent()
	a.openPorts = true
	a.hang[ttyRunName] = true
	return a
}

// ttyOut collects what a terminal exec writes to its stdout fifo.
type ttyOut struct {
	mu      sync.Mutex // guards buf, eof and changed
	buf     bytes.Buffer
	eof     bool
	changed chan struct{}
}

// readTTYOut reads the stdout fifo, opened in the background, to its end.
func readTTYOut(t *testing.T, ch <-chan *os.File) *ttyOut {
	o := &ttyOut{changed: make(chan struct{})}
	go func() {
		f, ok := <-ch
		buf := make([]byte, 4096)
		for ok {
			n, err := f.Read(buf)
			o.mu.Lock()
			o.buf.Write(buf[:n])
			o.eof = err != nil
			close(o.changed)
			o.changed = make(chan struct{})
			o.mu.Unlock()
			ok = err == nil
		}
	}()
	return o
}

// waitFor waits until the output holds want, or, with want empty, ends.
func (o *ttyOut) waitFor(t *testing.T, want string) {
	t.Helper()
	deadline := time.After(waitTimeout)
	for {
		o.mu.Lock()
		done := (want == "" && o.eof) || (want != "" && strings.Contains(o.buf.String(), want))
		got, ch := o.buf.String(), o.changed
		o.mu.Unlock()
		if done {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("terminal output %q: no %q (or end)", got, want)
		}
	}
}

// ttyClient is the test's side of a terminal exec: its stdin, its
// output, the port and the guest on the port's other end.
type ttyClient struct {
	stdin *os.File
	out   *ttyOut
	port  *fakePort
	guest *fakeTTY
	pid   uint32
}

// startTTY adds and starts terminal exec id running args, with stdin and
// stdout fifos; a size, when given, is sent with ResizePty right after
// Start, as containerd does.
func startTTY(t *testing.T, s *service, agent *fakeAgent, id string, args []string, size *winSize) *ttyClient {
	t.Helper()
	ctx := context.Background()
	stdin, stdout := mkfifo(t, id+"-in"), mkfifo(t, id+"-out")
	in := openFifo(t, stdin, os.O_WRONLY)
	c := &ttyClient{out: readTTYOut(t, openFifo(t, stdout, os.O_RDONLY))}
	_, err := s.Exec(ctx, &taskAPI.ExecProcessRequest{
		ID: "vm1", ExecID: id, Terminal: true, Stdin: stdin, Stdout: stdout,
		Spec: processSpec(t, specs.Process{Args: args, Env: []string{"PATH=/bin"}, Terminal: true}),
	})
	if err != nil {
		t.Fatalf("exec: %v", err)
	}
	sr, err := s.Start(ctx, &taskAPI.StartRequest{ID: "vm1", ExecID: id})
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	c.pid = sr.Pid
	if size != nil {
		if _, err := s.ResizePty(ctx, &taskAPI.ResizePtyRequest{ID: "vm1", ExecID: id, Width: size.cols, Height: size.rows}); err != nil {
			t.Fatalf("resize: %v", err)
		}
	}
	ports := agent.portList()
	c.port = ports[len(ports)-1]
	c.guest = guestTTY(t, c.port)
	c.stdin = receive(t, in, "stdin fifo")
	return c
}

// startShell starts terminal exec "e", sh in a 24×80 window.
func startShell(t *testing.T, s *service, agent *fakeAgent) *ttyClient {
	t.Helper()
	return startTTY(t, s, agent, "e", []string{"sh"}, &winSize{rows: 24, cols: 80})
}

// shellTTY starts terminal exec "e", sh in a 24×80 window, on a fake VM
// whose guest agent is a ttyAgent.
func shellTTY(t *testing.T) (*fakeAgent, *service, *fakeVM, *ttyClient) {
	t.Helper()
	agent := ttyAgent()
	s, _, vm := execVM(t, agent)
	return agent, s, vm, startShell(t, s, agent)
}

// typeIn writes to the terminal's stdin.
func (c *ttyClient) typeIn(t *testing.T, s string) {
	t.Helper()
	if _, err := c.stdin.WriteString(s); err != nil {
		t.Fatal(err)
	}
}

// waitExec waits for exec id to exit and returns its status.
func waitExec(t *testing.T, s *service, id string) uint32 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	wr, err := s.Wait(ctx, &taskAPI.WaitRequest{ID: "vm1", ExecID: id})
	if err != nil {
		t.Fatalf("wait exec %s: %v", id, err)
	}
	return wr.ExitStatus
}

// helperArgs lists the arguments after $0 of each run of helper prog.
func helperArgs(a *fakeAgent, prog string) []string {
	var out []string
	for _, c := range a.ran(prog) {
		out = append(out, strings.Join(c.Args[3:], " "))
	}
	return out
}

// TestTTYExec runs an exec with a terminal through the service: the
// program starts under script on a port of its own with the size
// containerd sends after Start, input is relayed and echoed back, a
// resize reaches the guest, and the exit code comes back once the port
// is removed and the output has ended.
func TestTTYExec(t *testing.T) {
	agent := ttyAgent()
	s, p, _ := execVM(t, agent)
	ctx := context.Background()
	c := startTTY(t, s, agent, "e", []string{"sh", "-c", "it's \"$HOME\"\n"}, &winSize{rows: 40, cols: 120})
	if c.guest.header != "40 120" {
		t.Errorf("first size %q, want \"40 120\"", c.guest.header)
	}
	run := agent.ran(ttyRunName)
	if len(run) != 1 {
		t.Fatalf("terminal programs %+v", run)
	}
	want := []string{"-c", ttyRunScript, ttyRunName, c.port.name, `unset SHELL; exec 'sh' '-c' 'it'\''s "$HOME"` + "\n'"}
	if run[0].Path != guestShell || !slices.Equal(run[0].Args, want) {
		t.Errorf("terminal program %s %q, want %q", run[0].Path, run[0].Args[2:], want[2:])
	}
	if !slices.Equal(run[0].Env, []string{"PATH=/bin", "TERM=xterm"}) {
		t.Errorf("terminal env %q", run[0].Env)
	}
	st, err := s.State(ctx, &taskAPI.StateRequest{ID: "vm1", ExecID: "e"})
	if err != nil || !st.Terminal || st.Pid != c.pid {
		t.Errorf("state %+v, %v", st, err)
	}

	c.typeIn(t, "echo hi\n")
	c.out.waitFor(t, "echo hi\n")
	if _, err := s.ResizePty(ctx, &taskAPI.ResizePtyRequest{ID: "vm1", ExecID: "e", Width: 132, Height: 50}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the resize", func() bool { return len(agent.ran(ttyResizeName)) == 1 })
	if got, want := helperArgs(agent, ttyResizeName), fmt.Sprintf("%d 50 132", c.pid); got[0] != want {
		t.Errorf("resize %q, want %q", got, want)
	}

	agent.end(ttyRunName, launch.GuestExecStatus{ExitCode: 7})
	if code := waitExec(t, s, "e"); code != 7 {
		t.Errorf("exit %d, want 7", code)
	}
	c.out.waitFor(t, "")
	if !c.port.isRemoved() || !c.port.hostClosed() {
		t.Errorf("port removed %v, closed %v", c.port.isRemoved(), c.port.hostClosed())
	}
	expect[*eventstypes.TaskExecAdded](t, p, runtime.TaskExecAddedEventTopic)
	expect[*eventstypes.TaskExecStarted](t, p, runtime.TaskExecStartedEventTopic)
	if exit := expect[*eventstypes.TaskExit](t, p, runtime.TaskExitEventTopic); exit.ExitStatus != 7 || exit.Pid != c.pid {
		t.Errorf("exit event %+v", exit)
	}
	if _, err := s.Delete(ctx, &taskAPI.DeleteRequest{ID: "vm1", ExecID: "e"}); err != nil {
		t.Fatal(err)
	}
}

// TestTTYFirstSize: the size given before Start, or the default when none
// comes in time, is what the program starts with; huge sizes are clamped.
func TestTTYFirstSize(t *testing.T) {
	for _, tc := range []struct {
		name       string
		width, hgt uint32
		resize     bool
		want       string
	}{
		{"none", 0, 0, false, "24 80"},
		{"given", 100, 30, true, "30 100"},
		{"huge", 1 << 31, 1<<32 - 1, true, "4096 4096"},
		{"unknown", 0, 0, true, "0 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			agent := ttyAgent()
			s, _, _ := execVM(t, agent)
			ctx := context.Background()
			if _, err := s.Exec(ctx, &taskAPI.ExecProcessRequest{
				ID: "vm1", ExecID: "e", Terminal: true, Spec: processSpec(t, specs.Process{Args: []string{"sh"}}),
			}); err != nil {
				t.Fatal(err)
			}
			if tc.resize {
				if _, err := s.ResizePty(ctx, &taskAPI.ResizePtyRequest{ID: "vm1", ExecID: "e", Width: tc.width, Height: tc.hgt}); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := s.Start(ctx, &taskAPI.StartRequest{ID: "vm1", ExecID: "e"}); err != nil {
				t.Fatal(err)
			}
			if g := guestTTY(t, agent.portList()[0]); g.header != tc.want {
				t.Errorf("first size %q, want %q", g.header, tc.want)
			}
		})
	}
}

func TestClampSize(t *testing.T) {
	for _, tc := range []struct {
		width, height uint32
		want          winSize
	}{
		{80, 24, winSize{24, 80}},
		{0, 0, winSize{0, 0}},
		{maxTermSize, maxTermSize + 1, winSize{maxTermSize, maxTermSize}},
		{1<<32 - 1, 1, winSize{1, maxTermSize}},
	} {
		if got := clampSize(tc.width, tc.height); got != tc.want {
			t.Errorf("clampSize(%d, %d) = %+v, want %+v", tc.width, tc.height, got, tc.want)
		}
	}
}

// TestTTYResizesMerged: sizes that come while one is applied in the guest
// are merged into the latest; ResizePty never waits for the guest.
func TestTTYResizesMerged(t *testing.T) {
	agent, s, _, c := shellTTY(t)
	ctx := context.Background()
	held := agent.holdCalls(func(a *agentCall) bool { return a.name == "exec" && programOf(a.cmd) == ttyResizeName })
	resize := func(w, h uint32) {
		t.Helper()
		within(t, stateBound, "resize", func() {
			if _, err := s.ResizePty(ctx, &taskAPI.ResizePtyRequest{ID: "vm1", ExecID: "e", Width: w, Height: h}); err != nil {
				t.Error(err)
			}
		})
	}
	resize(81, 25)
	first := receive(t, held, "the first resize")
	for i := range uint32(5) {
		resize(90+i, 30+i)
	}
	agent.stopHolding()
	first.release(nil)
	waitFor(t, "the merged resize", func() bool { return len(agent.ran(ttyResizeName)) == 2 })
	time.Sleep(3 * pollMin)
	want := []string{fmt.Sprintf("%d 25 81", c.pid), fmt.Sprintf("%d 34 94", c.pid)}
	if got := helperArgs(agent, ttyResizeName); !slices.Equal(got, want) {
		t.Errorf("resizes %q, want %q", got, want)
	}
}

// TestTTYStartFails: when the terminal cannot start, Start fails with a
// one-line error naming why, and leaves neither the port nor the
// program; the exec can then be deleted.
func TestTTYStartFails(t *testing.T) {
	for _, tc := range []struct {
		name    string
		prepare func(a *fakeAgent)
		during  func(a *fakeAgent) // while Start waits for the port
		is      func(error) bool
		text    string
		ports   int  // ports added
		stops   bool // the program is signalled
	}{
		{name: "no script", prepare: func(a *fakeAgent) {
			a.openPorts = false
			a.end(ttyRunName, launch.GuestExecStatus{ExitCode: ttyNoScript,
				Stderr: []byte("the guest has no util-linux script, which a terminal needs (install util-linux or bsdutils)\n")})
		}, is: errdefs.IsFailedPrecondition, text: "no util-linux script", ports: 1},
		{name: "no script, no message", prepare: func(a *fakeAgent) {
			a.openPorts = false
			a.end(ttyRunName, launch.GuestExecStatus{ExitCode: ttyNoScript})
		}, is: errdefs.IsFailedPrecondition, text: "no util-linux script", ports: 1},
		{name: "port not added", prepare: func(a *fakeAgent) {
			a.fail["addport"] = fmt.Errorf("qmp device_add: no free ports: %w", errdefs.ErrUnknown)
		}, is: errdefs.IsUnknown, text: "no free ports", ports: 0},
		{name: "program not started", prepare: func(a *fakeAgent) {
			a.fail["exec"] = qemu.ErrNoAgent
		}, is: errdefs.IsFailedPrecondition, text: "no guest agent", ports: 1},
		{name: "vm gone", prepare: func(a *fakeAgent) { a.openPorts = false },
			during: func(a *fakeAgent) { a.vanishPorts() }, is: errdefs.IsFailedPrecondition, text: "gone", ports: 1, stops: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			agent := ttyAgent()
			tc.prepare(agent)
			s, _, _ := execVM(t, agent)
			ctx := context.Background()
			if _, err := s.Exec(ctx, &taskAPI.ExecProcessRequest{
				ID: "vm1", ExecID: "e", Terminal: true, Spec: processSpec(t, specs.Process{Args: []string{"sh"}}),
			}); err != nil {
				t.Fatal(err)
			}
			if tc.during != nil {
				go func() {
					waitFor(t, "the terminal program", func() bool { return len(agent.ran(ttyRunName)) == 1 })
					tc.during(agent)
				}()
			}
			_, err := s.Start(ctx, &taskAPI.StartRequest{ID: "vm1", ExecID: "e"})
			wantErr(t, err, "the error", tc.is)
			if !strings.Contains(err.Error(), tc.text) || strings.Contains(err.Error(), "\n") {
				t.Errorf("error %q: want one line naming %q", err, tc.text)
			}
			ports := agent.portList()
			if len(ports) != tc.ports {
				t.Fatalf("%d ports added, want %d", len(ports), tc.ports)
			}
			for _, p := range ports {
				if !isClosedNow(p.gone) && !p.isRemoved() {
					t.Errorf("port %s left", p.name)
				}
				if !p.hostClosed() {
					t.Errorf("port %s: host end left open", p.name)
				}
			}
			// A program still running is stopped; one that ended is not
			// signalled: its pid may be another's by now.
			if run, sigs := agent.ran(ttyRunName), agent.ran(ttySignalName); len(run) > 0 && (len(sigs) > 0) != tc.stops {
				t.Errorf("terminal program signalled %d times; want a stop: %v", len(sigs), tc.stops)
			}
			if _, err := s.Delete(ctx, &taskAPI.DeleteRequest{ID: "vm1", ExecID: "e"}); err != nil {
				t.Errorf("delete: %v", err)
			}
		})
	}
}

// TestTTYNeverOpened: a guest that never opens the port makes open fail
// at its deadline, with an error naming the port, and nothing is left.
func TestTTYNeverOpened(t *testing.T) {
	agent := ttyAgent()
	agent.openPorts = false
	ctx, _ := testLogger(t)
	tty, err := newTTYSession(ctx, ctx, nil, []string{"sh"}, nil, stdio{}, agent)
	if err != nil {
		t.Fatal(err)
	}
	tty.logger = log.G(ctx)
	tty.openTimeout = 200 * time.Millisecond
	_, err = tty.open(ctx)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "did not open port vmshim.tty.1 within 200ms") {
		t.Fatalf("open: %v", err)
	}
	p := agent.portList()[0]
	if !p.isRemoved() || !p.hostClosed() {
		t.Errorf("port removed %v, host end closed %v", p.isRemoved(), p.hostClosed())
	}
	if got, want := helperArgs(agent, ttySignalName), []string{"101 9"}; !slices.Equal(got, want) {
		t.Errorf("signals %q, want %q", got, want)
	}
	if st := tty.state(); st != ttyNew {
		t.Errorf("state %s after a failed open, want new", st)
	}
}

// TestTTYKill: signals reach the program through the signal helper; a
// SIGKILL the guest never reports still ends the exec, with 137, and its
// port is removed.
func TestTTYKill(t *testing.T) {
	agent, s, _, c := shellTTY(t)
	ctx := context.Background()
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		if _, err := s.Kill(ctx, &taskAPI.KillRequest{ID: "vm1", ExecID: "e", Signal: uint32(sig)}); err != nil {
			t.Fatalf("kill %d: %v", sig, err)
		}
	}
	if code := waitExec(t, s, "e"); code != 137 {
		t.Errorf("exit %d, want 137", code)
	}
	want := []string{fmt.Sprintf("%d 15", c.pid), fmt.Sprintf("%d 9", c.pid)}
	waitFor(t, "the signals", func() bool { return len(agent.ran(ttySignalName)) == 2 })
	if got := helperArgs(agent, ttySignalName); !slices.Equal(got, want) {
		t.Errorf("signals %q, want %q", got, want)
	}
	c.out.waitFor(t, "")
	if !c.port.isRemoved() {
		t.Error("port not removed")
	}
}

// TestTTYEndsWithVM: when the VM goes, the terminal exec ends with 137,
// no QMP call is made for its port, and its output ends.
func TestTTYEndsWithVM(t *testing.T) {
	agent, s, vm, c := shellTTY(t)
	vm.exit(0)
	if code := waitExec(t, s, "e"); code != 137 {
		t.Errorf("exit %d, want 137", code)
	}
	c.out.waitFor(t, "")
	agent.mu.Lock()
	defer agent.mu.Unlock()
	for _, cmd := range agent.commands {
		if programOf(cmd) == ttySignalName {
			t.Errorf("signal sent to a gone vm: %q", cmd.Args[3:])
		}
	}
	if c.port.isRemoved() {
		t.Error("port removed through a gone vm's QMP")
	}
}

// TestTTYHangup: the end of stdin, or CloseIO, hangs the terminal up: the
// program gets SIGHUP.
func TestTTYHangup(t *testing.T) {
	for _, how := range []string{"stdin closed", "CloseIO"} {
		t.Run(how, func(t *testing.T) {
			agent, s, _, c := shellTTY(t)
			if how == "CloseIO" {
				if _, err := s.CloseIO(context.Background(), &taskAPI.CloseIORequest{ID: "vm1", ExecID: "e", Stdin: true}); err != nil {
					t.Fatal(err)
				}
			} else {
				c.stdin.Close()
			}
			waitFor(t, "the hangup", func() bool { return len(agent.ran(ttySignalName)) == 1 })
			if got, want := helperArgs(agent, ttySignalName), fmt.Sprintf("%d 1", c.pid); got[0] != want {
				t.Errorf("signal %q, want %q", got, want)
			}
		})
	}
}

// TestTTYReordered: the program's end is reported while a resize is still
// held in the guest; the resize, answered last, changes nothing and the
// session ends cleanly.
func TestTTYReordered(t *testing.T) {
	agent, s, _, c := shellTTY(t)
	ctx := context.Background()
	held := agent.holdCalls(func(a *agentCall) bool { return a.name == "exec" && programOf(a.cmd) == ttyResizeName })
	if _, err := s.ResizePty(ctx, &taskAPI.ResizePtyRequest{ID: "vm1", ExecID: "e", Width: 100, Height: 40}); err != nil {
		t.Fatal(err)
	}
	resize := receive(t, held, "the resize")
	agent.stopHolding()
	agent.end(ttyRunName, launch.GuestExecStatus{ExitCode: 3})
	if code := waitExec(t, s, "e"); code != 3 {
		t.Errorf("exit %d, want 3", code)
	}
	resize.release(nil)
	c.out.waitFor(t, "")
	if !c.port.isRemoved() {
		t.Error("port not removed")
	}
	if _, err := s.ResizePty(ctx, &taskAPI.ResizePtyRequest{ID: "vm1", ExecID: "e", Width: 1, Height: 1}); !errdefs.IsNotFound(errFromRPC(err)) {
		t.Errorf("resize after exit: %v, want not found", err)
	}
}

// TestTTYCleanup: a terminal exec leaves no goroutine, port or open end
// behind once it has ended and been deleted.
func TestTTYCleanup(t *testing.T) {
	agent := ttyAgent()
	s, _, _ := execVM(t, agent)
	before := goruntime.NumGoroutine()
	c := startShell(t, s, agent)
	c.typeIn(t, "x")
	c.out.waitFor(t, "x")
	agent.end(ttyRunName, launch.GuestExecStatus{})
	waitExec(t, s, "e")
	if _, err := s.Delete(context.Background(), &taskAPI.DeleteRequest{ID: "vm1", ExecID: "e"}); err != nil {
		t.Fatal(err)
	}
	c.stdin.Close()
	c.out.waitFor(t, "")
	waitFor(t, "the session's goroutines to end", func() bool { return goruntime.NumGoroutine() <= before })
	if !c.port.isRemoved() || !c.port.hostClosed() {
		t.Errorf("port removed %v, host end closed %v", c.port.isRemoved(), c.port.hostClosed())
	}
}

func TestTTYStateTransitions(t *testing.T) {
	all := []ttyState{ttyNew, ttyOpening, ttyOpen, ttyClosed}
	allowed := map[[2]ttyState]bool{
		{ttyNew, ttyOpening}: true, {ttyNew, ttyClosed}: true,
		{ttyOpening, ttyNew}: true, {ttyOpening, ttyOpen}: true, {ttyOpening, ttyClosed}: true,
		{ttyOpen, ttyClosed}: true,
	}
	for _, from := range all {
		for _, to := range all {
			err := from.next(to)
			if allowed[[2]ttyState{from, to}] != (err == nil) {
				t.Errorf("%s → %s: %v", from, to, err)
			}
			if err != nil && !errdefs.IsFailedPrecondition(err) {
				t.Errorf("%s → %s: %v is not a failed precondition", from, to, err)
			}
		}
	}
}

// TestTTYSecondOpen: a session opens once.
func TestTTYSecondOpen(t *testing.T) {
	agent := ttyAgent()
	ctx, _ := testLogger(t)
	tty, err := newTTYSession(ctx, ctx, log.G(ctx), []string{"sh"}, nil, stdio{}, agent)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tty.open(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := tty.open(ctx); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("second open: %v", err)
	}
	tty.close()
	if _, err := tty.open(ctx); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("open after close: %v", err)
	}
	if st := tty.state(); st != ttyClosed {
		t.Errorf("state %s", st)
	}
}

// TestTTYCallsHaveDeadlines runs a terminal exec through its life (start,
// resize, signal, hangup, end) and checks every guest agent and QMP call
// had a deadline.
func TestTTYCallsHaveDeadlines(t *testing.T) {
	agent, s, _, c := shellTTY(t)
	ctx := context.Background()
	if _, err := s.ResizePty(ctx, &taskAPI.ResizePtyRequest{ID: "vm1", ExecID: "e", Width: 90, Height: 30}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the resize", func() bool { return len(agent.ran(ttyResizeName)) == 1 })
	if _, err := s.Kill(ctx, &taskAPI.KillRequest{ID: "vm1", ExecID: "e", Signal: uint32(syscall.SIGINT)}); err != nil {
		t.Fatal(err)
	}
	c.stdin.Close()
	waitFor(t, "the hangup", func() bool { return len(agent.ran(ttySignalName)) == 2 })
	agent.end(ttyRunName, launch.GuestExecStatus{})
	waitExec(t, s, "e")
	waitFor(t, "the port's removal", c.port.isRemoved)
	agent.mu.Lock()
	defer agent.mu.Unlock()
	if len(agent.noDeadline) > 0 {
		t.Errorf("calls without a deadline: %v", agent.noDeadline)
	}
}

// errFromRPC maps an RPC's error back to its errdefs class.
func errFromRPC(err error) error {
	if err == nil {
		return nil
	}
	return errgrpc.ToNative(err)
}

// addTTYExec adds terminal exec id, without stdio, to task vm1.
func addTTYExec(t *testing.T, s *service, id string) {
	t.Helper()
	if _, err := s.Exec(context.Background(), &taskAPI.ExecProcessRequest{
		ID: "vm1", ExecID: id, Terminal: true, Spec: processSpec(t, specs.Process{Args: []string{"sh"}, Terminal: true}),
	}); err != nil {
		t.Fatal(err)
	}
}

// startExecFunc starts exec id of task vm1.
func startExecFunc(s *service, id string) func() error {
	return func() error {
		_, err := s.Start(context.Background(), &taskAPI.StartRequest{ID: "vm1", ExecID: id})
		return err
	}
}

// pendingTTYAddPort leaves the start of terminal exec e waiting on QEMU
// to add its port.
func pendingTTYAddPort(t *testing.T, s *service, agent *fakeAgent) (*agentCall, <-chan error) {
	t.Helper()
	agent.openPorts, agent.hang[ttyRunName] = true, true
	addTTYExec(t, s, "e")
	return held(t, agent, "addport", startExecFunc(s, "e"))
}

// pendingTTYOpen leaves the start of terminal exec e waiting for a guest
// that never opens the port, its status poll unanswered.
func pendingTTYOpen(t *testing.T, s *service, agent *fakeAgent) (*agentCall, <-chan error) {
	t.Helper()
	agent.hang[ttyRunName] = true
	addTTYExec(t, s, "e")
	return held(t, agent, "status", startExecFunc(s, "e"))
}

// pendingTTYResize leaves a resize of running terminal exec e waiting on
// the agent.
func pendingTTYResize(t *testing.T, s *service, agent *fakeAgent) (*agentCall, <-chan error) {
	t.Helper()
	agent.openPorts, agent.hang[ttyRunName] = true, true
	startShell(t, s, agent)
	return held(t, agent, "exec", func() error {
		_, err := s.ResizePty(context.Background(), &taskAPI.ResizePtyRequest{ID: "vm1", ExecID: "e", Width: 100, Height: 30})
		return err
	})
}

// pendingTTYRemove leaves the end of terminal exec e waiting on QEMU to
// remove its port.
func pendingTTYRemove(t *testing.T, s *service, agent *fakeAgent) (*agentCall, <-chan error) {
	t.Helper()
	agent.openPorts, agent.hang[ttyRunName] = true, true
	startShell(t, s, agent)
	return held(t, agent, "removeport", func() error {
		agent.end(ttyRunName, launch.GuestExecStatus{})
		return nil
	})
}
