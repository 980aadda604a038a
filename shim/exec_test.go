package shim

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	apitask "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/v2/core/runtime"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/vmshim/vmshim/launch"
	"github.com/vmshim/vmshim/qemu"
)

// fakeAgent runs "programs" whose outcome the test scripts by program
// (see programOf). It can fail every call (err) or the calls of one name
// (fail), and hold calls for the test (holdCalls): a held call hangs
// until the test answers it or its context ends, so the test can also
// answer calls in another order than they came. It also plays the VM's
// terminal ports (see fakePort).
type fakeAgent struct {
	mu       sync.Mutex // guards everything below
	results  map[string]launch.GuestExecStatus
	pending  map[int]string // pid → program still running
	next     int
	commands []launch.GuestCommand
	hang     map[string]bool  // programs that never end
	err      error            // returned by every call when set
	fail     map[string]error // returned by the calls of a name
	held     chan *agentCall  // receives the calls hold selects; nil: none
	hold     func(*agentCall) bool
	calls    int // calls made
	// noDeadline lists the calls made with a context without deadline.
	noDeadline []string
	// ports are the terminal ports added so far; openPorts makes the
	// guest open a port as soon as its terminal program starts.
	ports     []*fakePort
	openPorts bool
}

// newFakeAgent returns an agent with nothing scripted.
func newFakeAgent() *fakeAgent {
	return &fakeAgent{
		results: map[string]launch.GuestExecStatus{}, pending: map[int]string{}, hang: map[string]bool{},
		fail: map[string]error{}, next: 100,
	}
}

// programOf names a command for scripting: a helper script run with
// `sh -c SCRIPT NAME ...` by its NAME ($0), anything else by its path.
func programOf(c launch.GuestCommand) string {
	if c.Path == guestShell && len(c.Args) > 2 && c.Args[0] == "-c" {
		return c.Args[2]
	}
	return c.Path
}

// agentCall is one call to the fake agent, as the test sees it when the
// agent holds it.
type agentCall struct {
	name   string              // "exec", "status", "ping", "addport" or "removeport"
	cmd    launch.GuestCommand // exec's command
	pid    int                 // status's pid
	port   string              // addport's and removeport's port
	answer chan error
}

// release lets a held call go on as scripted (err nil) or fails it with err.
func (c *agentCall) release(err error) { c.answer <- err }

// holdCalls makes the agent hold the calls which accepts (every call when
// which is nil) and hand each to the returned channel as it arrives.
func (a *fakeAgent) holdCalls(which func(*agentCall) bool) <-chan *agentCall {
	ch := make(chan *agentCall)
	a.mu.Lock()
	defer a.mu.Unlock()
	a.held, a.hold = ch, which
	return ch
}

// stopHolding lets later calls through without the test.
func (a *fakeAgent) stopHolding() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.held, a.hold = nil, nil
}

// call goes through what every call does first: it fails with err, is
// noted if ctx has no deadline, and waits while it is held.
func (a *fakeAgent) call(ctx context.Context, c *agentCall) error {
	a.mu.Lock()
	err, held, hold := a.err, a.held, a.hold
	if err == nil {
		err = a.fail[c.name]
	}
	a.calls++
	if _, ok := ctx.Deadline(); !ok {
		a.noDeadline = append(a.noDeadline, c.name)
	}
	a.mu.Unlock()
	if err != nil {
		return err
	}
	if held == nil || (hold != nil && !hold(c)) {
		return nil
	}
	c.answer = make(chan error, 1)
	select {
	case held <- c:
	case <-ctx.Done():
		return fmt.Errorf("guest agent %s: %w", c.name, ctx.Err())
	}
	select {
	case err := <-c.answer:
		return err
	case <-ctx.Done():
		return fmt.Errorf("guest agent %s: %w", c.name, ctx.Err())
	}
}

// Exec starts a scripted program and returns its pid.
func (a *fakeAgent) Exec(ctx context.Context, c launch.GuestCommand) (int, error) {
	if err := a.call(ctx, &agentCall{name: "exec", cmd: c}); err != nil {
		return 0, err
	}
	a.mu.Lock()
	a.commands = append(a.commands, c)
	a.next++
	pid := a.next
	a.pending[pid] = programOf(c)
	open := a.openPorts && programOf(c) == ttyRunName
	a.mu.Unlock()
	if open {
		a.port(c.Args[3]).open()
	}
	return pid, nil
}

// ExecStatus reports a program's scripted outcome, or that it runs.
func (a *fakeAgent) ExecStatus(ctx context.Context, pid int) (launch.GuestExecStatus, error) {
	if err := a.call(ctx, &agentCall{name: "status", pid: pid}); err != nil {
		return launch.GuestExecStatus{}, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	prog, ok := a.pending[pid]
	if !ok {
		return launch.GuestExecStatus{}, fmt.Errorf("pid %d: %w", pid, errdefs.ErrNotFound)
	}
	if a.hang[prog] {
		return launch.GuestExecStatus{}, nil
	}
	st := a.results[prog]
	st.Exited = true
	delete(a.pending, pid)
	return st, nil
}

// end makes the running and later copies of prog end with st.
func (a *fakeAgent) end(prog string, st launch.GuestExecStatus) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.results[prog] = st
	a.hang[prog] = false
}

// ran returns the commands run so far of program prog.
func (a *fakeAgent) ran(prog string) []launch.GuestCommand {
	var out []launch.GuestCommand
	for _, c := range a.commandList() {
		if programOf(c) == prog {
			out = append(out, c)
		}
	}
	return out
}

// Ping answers unless the agent fails or holds the call.
func (a *fakeAgent) Ping(ctx context.Context) error {
	return a.call(ctx, &agentCall{name: "ping"})
}

func (a *fakeAgent) commandList() []launch.GuestCommand {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]launch.GuestCommand(nil), a.commands...)
}

// processSpec is an exec's process as containerd sends it.
func processSpec(t *testing.T, p specs.Process) *anypb.Any {
	t.Helper()
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	return &anypb.Any{TypeUrl: "types.containerd.io/opencontainers/runtime-spec/1/Process", Value: b}
}

// execVM starts task vm1 whose guest has the given agent.
func execVM(t *testing.T, agent launch.GuestAgent) (*service, *fakePublisher, *fakeVM) {
	t.Helper()
	s, l, p, _ := newService(t)
	running(t, s, p, "vm1")
	vm := l.vm(t, "vm1")
	vm.mu.Lock()
	vm.agent = agent
	if a, ok := agent.(*fakeAgent); ok {
		vm.onExit = a.vanishPorts
	}
	vm.mu.Unlock()
	return s, p, vm
}

// readFifo reads a fifo opened in the background to its end.
func readFifo(t *testing.T, ch <-chan *os.File) <-chan string {
	out := make(chan string, 1)
	go func() {
		f, ok := <-ch
		if !ok {
			close(out)
			return
		}
		b, _ := io.ReadAll(f)
		out <- string(b)
	}()
	return out
}

func TestExecRunsInGuest(t *testing.T) {
	agent := newFakeAgent()
	agent.results["sh"] = launch.GuestExecStatus{ExitCode: 3, Stdout: []byte("out\n"), Stderr: []byte("err\n")}
	s, p, _ := execVM(t, agent)
	ctx := context.Background()
	stdout, stderr := mkfifo(t, "out"), mkfifo(t, "err")
	outCh := readFifo(t, openFifo(t, stdout, os.O_RDONLY))
	errCh := readFifo(t, openFifo(t, stderr, os.O_RDONLY))

	_, err := s.Exec(ctx, &taskAPI.ExecProcessRequest{
		ID: "vm1", ExecID: "e1", Stdout: stdout, Stderr: stderr,
		Spec: processSpec(t, specs.Process{Args: []string{"sh", "-c", "exit 3"}, Env: []string{"A=1"}}),
	})
	if err != nil {
		t.Fatalf("exec: %v", err)
	}
	added := expect[*eventstypes.TaskExecAdded](t, p, runtime.TaskExecAddedEventTopic)
	if added.ContainerID != "vm1" || added.ExecID != "e1" {
		t.Fatalf("exec added %+v", added)
	}
	st, err := s.State(ctx, &taskAPI.StateRequest{ID: "vm1", ExecID: "e1"})
	if err != nil || st.Status != apitask.Status_CREATED {
		t.Fatalf("state before start: %v, %v", st, err)
	}
	sr, err := s.Start(ctx, &taskAPI.StartRequest{ID: "vm1", ExecID: "e1"})
	if err != nil || sr.Pid == 0 {
		t.Fatalf("start exec: %v, %v", sr, err)
	}
	started := expect[*eventstypes.TaskExecStarted](t, p, runtime.TaskExecStartedEventTopic)
	if started.ExecID != "e1" || started.Pid != sr.Pid {
		t.Fatalf("exec started %+v, want pid %d", started, sr.Pid)
	}
	wr, err := s.Wait(ctx, &taskAPI.WaitRequest{ID: "vm1", ExecID: "e1"})
	if err != nil || wr.ExitStatus != 3 {
		t.Fatalf("wait exec: %v, %v", wr, err)
	}
	exit := expect[*eventstypes.TaskExit](t, p, runtime.TaskExitEventTopic)
	if exit.ContainerID != "vm1" || exit.ID != "e1" || exit.ExitStatus != 3 || exit.Pid != sr.Pid {
		t.Fatalf("exec exit %+v", exit)
	}
	if got := receive(t, outCh, "stdout"); got != "out\n" {
		t.Errorf("stdout %q", got)
	}
	if got := receive(t, errCh, "stderr"); got != "err\n" {
		t.Errorf("stderr %q", got)
	}
	cmds := agent.commandList()
	if len(cmds) != 1 || cmds[0].Path != "sh" || strings.Join(cmds[0].Args, " ") != "-c exit 3" || cmds[0].Env[0] != "A=1" {
		t.Fatalf("agent ran %+v", cmds)
	}
	dr, err := s.Delete(ctx, &taskAPI.DeleteRequest{ID: "vm1", ExecID: "e1"})
	if err != nil || dr.ExitStatus != 3 {
		t.Fatalf("delete exec: %v, %v", dr, err)
	}
	if _, err := s.State(ctx, &taskAPI.StateRequest{ID: "vm1", ExecID: "e1"}); !errdefs.IsNotFound(errgrpc.ToNative(err)) {
		t.Fatalf("state after delete: %v", err)
	}
	wantStatus(t, s, "vm1", apitask.Status_RUNNING)
}

// plainAgent is a guest agent whose VM cannot add terminal ports.
type plainAgent struct{ launch.GuestAgent }

func TestExecRefused(t *testing.T) {
	noAgent := qemu.ErrNoAgent
	tests := []struct {
		name    string
		agent   launch.GuestAgent
		proc    specs.Process
		atStart bool // the error comes from Start, not Exec
		class   string
		is      func(error) bool
		text    string
	}{
		{name: "tty without terminal ports", agent: plainAgent{newFakeAgent()}, proc: specs.Process{Args: []string{"sh"}, Terminal: true},
			class: "NotImplemented", is: errdefs.IsNotImplemented, text: "tty"},
		{name: "tty with a NUL byte", agent: newFakeAgent(), proc: specs.Process{Args: []string{"sh", "-c", "a\x00b"}, Terminal: true},
			class: "InvalidArgument", is: errdefs.IsInvalidArgument, text: "NUL"},
		{name: "no command", agent: newFakeAgent(), proc: specs.Process{},
			class: "InvalidArgument", is: errdefs.IsInvalidArgument, text: "no command"},
		{name: "no agent channel", agent: nil, proc: specs.Process{Args: []string{"true"}},
			class: "FailedPrecondition", is: errdefs.IsFailedPrecondition, text: "no guest"},
		{name: "agent not running", agent: &fakeAgent{err: noAgent, results: map[string]launch.GuestExecStatus{}, pending: map[int]string{}},
			proc: specs.Process{Args: []string{"true"}}, atStart: true,
			class: "FailedPrecondition", is: errdefs.IsFailedPrecondition, text: "no guest agent"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, _, _ := execVM(t, tc.agent)
			ctx := context.Background()
			_, err := s.Exec(ctx, &taskAPI.ExecProcessRequest{ID: "vm1", ExecID: "e", Spec: processSpec(t, tc.proc)})
			if tc.atStart {
				if err != nil {
					t.Fatalf("exec: %v", err)
				}
				_, err = s.Start(ctx, &taskAPI.StartRequest{ID: "vm1", ExecID: "e"})
			}
			wantErr(t, err, tc.class, tc.is)
			if !strings.Contains(err.Error(), tc.text) {
				t.Fatalf("error %q does not mention %q", err, tc.text)
			}
		})
	}
}

func TestExecKill(t *testing.T) {
	agent := newFakeAgent()
	agent.hang["sleep"] = true
	s, p, _ := execVM(t, agent)
	ctx := context.Background()
	if _, err := s.Exec(ctx, &taskAPI.ExecProcessRequest{ID: "vm1", ExecID: "e", Spec: processSpec(t, specs.Process{Args: []string{"sleep", "100"}})}); err != nil {
		t.Fatal(err)
	}
	sr, err := s.Start(ctx, &taskAPI.StartRequest{ID: "vm1", ExecID: "e"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Kill(ctx, &taskAPI.KillRequest{ID: "vm1", ExecID: "e", Signal: uint32(syscall.SIGKILL)}); err != nil {
		t.Fatalf("kill: %v", err)
	}
	// The guest never reports the end: the exec ends anyway, killed.
	wr, err := s.Wait(ctx, &taskAPI.WaitRequest{ID: "vm1", ExecID: "e"})
	if err != nil || wr.ExitStatus != 137 {
		t.Fatalf("wait: %v, %v", wr, err)
	}
	cmds := agent.commandList()
	want := fmt.Sprintf("kill -9 %d", sr.Pid)
	if len(cmds) != 2 || cmds[1].Path+" "+strings.Join(cmds[1].Args, " ") != want {
		t.Fatalf("agent ran %+v, want %q last", cmds, want)
	}
	expect[*eventstypes.TaskExecAdded](t, p, runtime.TaskExecAddedEventTopic)
	expect[*eventstypes.TaskExecStarted](t, p, runtime.TaskExecStartedEventTopic)
	if exit := expect[*eventstypes.TaskExit](t, p, runtime.TaskExitEventTopic); exit.ID != "e" || exit.ExitStatus != 137 {
		t.Fatalf("exit %+v", exit)
	}
	if _, err := s.Kill(ctx, &taskAPI.KillRequest{ID: "vm1", ExecID: "e", Signal: 9}); !errdefs.IsNotFound(errgrpc.ToNative(err)) {
		t.Fatalf("kill after exit: %v", err)
	}
}

func TestExecEndsWithVM(t *testing.T) {
	agent := newFakeAgent()
	agent.hang["sleep"] = true
	s, _, vm := execVM(t, agent)
	ctx := context.Background()
	if _, err := s.Exec(ctx, &taskAPI.ExecProcessRequest{ID: "vm1", ExecID: "e", Spec: processSpec(t, specs.Process{Args: []string{"sleep", "100"}})}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Start(ctx, &taskAPI.StartRequest{ID: "vm1", ExecID: "e"}); err != nil {
		t.Fatal(err)
	}
	vm.exit(0)
	wr, err := s.Wait(ctx, &taskAPI.WaitRequest{ID: "vm1", ExecID: "e"})
	if err != nil || wr.ExitStatus != 137 {
		t.Fatalf("wait: %v, %v", wr, err)
	}
	_, err = s.Exec(ctx, &taskAPI.ExecProcessRequest{ID: "vm1", ExecID: "e2", Spec: processSpec(t, specs.Process{Args: []string{"true"}})})
	wantErr(t, err, "FailedPrecondition", errdefs.IsFailedPrecondition)
}

func TestExecStdin(t *testing.T) {
	agent := newFakeAgent()
	agent.results["cat"] = launch.GuestExecStatus{Stdout: []byte("hello")}
	s, _, _ := execVM(t, agent)
	ctx := context.Background()
	stdin := mkfifo(t, "in")
	in := openFifo(t, stdin, os.O_WRONLY)
	if _, err := s.Exec(ctx, &taskAPI.ExecProcessRequest{ID: "vm1", ExecID: "e", Stdin: stdin, Spec: processSpec(t, specs.Process{Args: []string{"cat"}})}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Start(ctx, &taskAPI.StartRequest{ID: "vm1", ExecID: "e"}); err != nil {
		t.Fatal(err)
	}
	f := receive(t, in, "stdin fifo")
	if _, err := f.WriteString("hello"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	wr, err := s.Wait(ctx, &taskAPI.WaitRequest{ID: "vm1", ExecID: "e"})
	if err != nil || wr.ExitStatus != 0 {
		t.Fatalf("wait: %v, %v", wr, err)
	}
	cmds := agent.commandList()
	if len(cmds) != 1 || string(cmds[0].Input) != "hello" {
		t.Fatalf("agent ran %+v", cmds)
	}
}

// TestExecStdinNeverOpened: a client with no input at all closes its end
// of the stdin fifo before it was opened (ctr's stdin from /dev/null
// does), then sends CloseIO, or does not: the program runs with no
// input, instead of the exec waiting for a writer that never comes.
// Input written before CloseIO is still read whole.
func TestExecStdinNeverOpened(t *testing.T) {
	agent := newFakeAgent()
	agent.results["true"] = launch.GuestExecStatus{}
	agent.results["cat"] = launch.GuestExecStatus{}
	s, _, _ := execVM(t, agent)
	ctx := context.Background()
	stdin := mkfifo(t, "in")
	if _, err := s.Exec(ctx, &taskAPI.ExecProcessRequest{ID: "vm1", ExecID: "e", Stdin: stdin, Spec: processSpec(t, specs.Process{Args: []string{"true"}})}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Start(ctx, &taskAPI.StartRequest{ID: "vm1", ExecID: "e"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CloseIO(ctx, &taskAPI.CloseIORequest{ID: "vm1", ExecID: "e", Stdin: true}); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	wr, err := s.Wait(wctx, &taskAPI.WaitRequest{ID: "vm1", ExecID: "e"})
	if err != nil || wr.ExitStatus != 0 {
		t.Fatalf("wait: %v, %v", wr, err)
	}

	stdin2 := mkfifo(t, "in2")
	in := openFifo(t, stdin2, os.O_WRONLY)
	if _, err := s.Exec(ctx, &taskAPI.ExecProcessRequest{ID: "vm1", ExecID: "e2", Stdin: stdin2, Spec: processSpec(t, specs.Process{Args: []string{"cat"}})}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Start(ctx, &taskAPI.StartRequest{ID: "vm1", ExecID: "e2"}); err != nil {
		t.Fatal(err)
	}
	f := receive(t, in, "stdin fifo")
	if _, err := f.WriteString("late"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CloseIO(ctx, &taskAPI.CloseIORequest{ID: "vm1", ExecID: "e2", Stdin: true}); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if wr, err := s.Wait(wctx, &taskAPI.WaitRequest{ID: "vm1", ExecID: "e2"}); err != nil || wr.ExitStatus != 0 {
		t.Fatalf("wait: %v, %v", wr, err)
	}
	// No CloseIO either (ctr's client can lose it): the exec runs with
	// no input once stdinWait has passed without a writer.
	stdin3 := mkfifo(t, "in3")
	if _, err := s.Exec(ctx, &taskAPI.ExecProcessRequest{ID: "vm1", ExecID: "e3", Stdin: stdin3, Spec: processSpec(t, specs.Process{Args: []string{"true"}})}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Start(ctx, &taskAPI.StartRequest{ID: "vm1", ExecID: "e3"}); err != nil {
		t.Fatal(err)
	}
	if wr, err := s.Wait(wctx, &taskAPI.WaitRequest{ID: "vm1", ExecID: "e3"}); err != nil || wr.ExitStatus != 0 {
		t.Fatalf("wait: %v, %v", wr, err)
	}
	cmds := agent.commandList()
	if len(cmds) != 3 || len(cmds[0].Input) != 0 || string(cmds[1].Input) != "late" || len(cmds[2].Input) != 0 {
		t.Fatalf("agent ran %+v", cmds)
	}
}

func TestServiceStatsUpdate(t *testing.T) {
	s, l, p, _ := newService(t)
	ctx := context.Background()
	running(t, s, p, "vm1")
	vm := l.vm(t, "vm1")
	if _, err := s.Stats(ctx, &taskAPI.StatsRequest{ID: "vm1"}); !errdefs.IsNotFound(errgrpc.ToNative(err)) {
		t.Fatalf("stats without cgroup: %v", err)
	}
	vm.mu.Lock()
	vm.stats = &apitask.ProcessInfo{Pid: 42} // any proto message
	vm.mu.Unlock()
	sr, err := s.Stats(ctx, &taskAPI.StatsRequest{ID: "vm1"})
	if err != nil || !strings.HasSuffix(sr.Stats.GetTypeUrl(), "containerd.v1.types.ProcessInfo") {
		t.Fatalf("stats: %v, %v", sr, err)
	}
	quota := int64(50000)
	res, _ := json.Marshal(specs.LinuxResources{CPU: &specs.LinuxCPU{Quota: &quota}})
	if _, err := s.Update(ctx, &taskAPI.UpdateTaskRequest{ID: "vm1", Resources: &anypb.Any{TypeUrl: "x", Value: res}}); err != nil {
		t.Fatalf("update: %v", err)
	}
	vm.mu.Lock()
	got := vm.updates
	vm.mu.Unlock()
	if len(got) != 1 || got[0].CPU == nil || *got[0].CPU.Quota != quota {
		t.Fatalf("updates %+v", got)
	}
	_, err = s.Update(ctx, &taskAPI.UpdateTaskRequest{ID: "vm1"})
	wantErr(t, err, "InvalidArgument", errdefs.IsInvalidArgument)
}
