package qemu

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"
)

// testSpec is a small TCG VM with its QMP socket in dir.
func testSpec(dir string) Spec {
	return Spec{
		Name:      "test-vm",
		Accel:     AccelTCG,
		CPUs:      1,
		MemoryMiB: 64,
		QMPSocket: filepath.Join(dir, "qmp.sock"),
	}
}

// fakeQEMU writes an executable shell script standing in for QEMU.
func fakeQEMU(t *testing.T, script string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "fake-qemu")
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+script+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

func waitDone(t *testing.T, v *VM) {
	t.Helper()
	select {
	case <-v.Done():
	case <-time.After(20 * time.Second):
		v.Kill()
		t.Fatal("qemu did not exit")
	}
}

func TestLaunchStartPauseKill(t *testing.T) {
	bin := qemuBinary(t)
	dir := t.TempDir()
	spec := testSpec(dir)
	spec.Paused = true
	spec.AgentSocket = filepath.Join(dir, "agent.sock")
	var stderr bytes.Buffer
	ctx := testCtx(t, 20*time.Second)
	v, err := Launch(ctx, LaunchConfig{Binary: bin, Spec: spec, Stderr: &stderr, Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer v.Kill()
	if code, at := v.ExitStatus(); code != -1 || !at.IsZero() {
		t.Errorf("ExitStatus before exit = %d, %v", code, at)
	}
	if err := syscall.Kill(v.Pid(), 0); err != nil {
		t.Fatalf("pid %d: %v", v.Pid(), err)
	}
	if pgid, _ := syscall.Getpgid(v.Pid()); pgid != v.Pid() {
		t.Errorf("qemu process group = %d, want its own (%d)", pgid, v.Pid())
	}
	status := func(want string) {
		t.Helper()
		st, err := v.QMP().QueryStatus(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.Status != want {
			t.Errorf("status = %+v, want %s", st, want)
		}
	}
	if fi, err := os.Stat(spec.AgentSocket); err != nil || fi.Mode()&os.ModeSocket == 0 {
		t.Errorf("agent socket: %v, %v", fi, err)
	}
	// A guest that never ran has not opened the agent port.
	if v.Agent() == nil {
		t.Fatal("no agent client for a VM with an agent socket")
	}
	if err := v.Agent().Ping(ctx); !errors.Is(err, ErrNoAgent) {
		t.Errorf("agent of a paused guest: %v, want ErrNoAgent", err)
	}
	if st := v.agentPort.Load(); st != agentPortClosed {
		t.Errorf("agent port state = %d, want closed (%d) from query-chardev", st, agentPortClosed)
	}
	status("prelaunch")
	if err := v.Start(ctx); err != nil {
		t.Fatal(err)
	}
	status("running")
	if err := v.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	status("paused")
	if err := v.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	status("running")
	if err := v.Powerdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := v.Kill(); err != nil {
		t.Fatal(err)
	}
	waitDone(t, v)
	code, at := v.ExitStatus()
	if code != 137 {
		t.Errorf("exit status = %d, want 137; stderr: %s", code, stderr.String())
	}
	if at.IsZero() || time.Since(at) > time.Minute {
		t.Errorf("exit time = %v", at)
	}
	if err := v.Kill(); err != nil {
		t.Errorf("Kill after exit: %v", err)
	}
	select {
	case <-v.QMP().Done():
	case <-time.After(5 * time.Second):
		t.Error("qmp client not done after qemu exit")
	}
	if _, err := v.QMP().QueryStatus(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("qmp after exit: %v, want ErrClosed", err)
	}
	if _, err := os.Stat(spec.QMPSocket); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("qmp socket left behind: %v", err)
	}
	if _, err := os.Stat(spec.AgentSocket); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("agent socket left behind: %v", err)
	}
	if err := v.Agent().Ping(ctx); !errors.Is(err, ErrAgentClosed) {
		t.Errorf("agent after exit: %v, want ErrAgentClosed", err)
	}
}

func TestLaunchEarlyExit(t *testing.T) {
	bin := fakeQEMU(t, `echo "starting" >&2
echo "qemu-system-x86_64: -blockdev {}: Could not open '/x': No such file or directory" >&2
exit 3`)
	dir := t.TempDir()
	var stderr bytes.Buffer
	v, err := Launch(testCtx(t, 10*time.Second), LaunchConfig{Binary: bin, Spec: testSpec(dir), Stderr: &stderr})
	if err == nil {
		v.Kill()
		t.Fatal("Launch succeeded")
	}
	msg := err.Error()
	for _, want := range []string{"qemu exited with status 3", "Could not open '/x'", "starting"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q lacks %q", msg, want)
		}
	}
	if strings.Contains(msg, "\n") {
		t.Errorf("error %q spans lines", msg)
	}
	if !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("error %v is not ErrFailedPrecondition", err)
	}
	if !strings.Contains(stderr.String(), "Could not open") {
		t.Errorf("stderr writer got %q", stderr.String())
	}
}

func TestLaunchNeverReady(t *testing.T) {
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "pid")
	bin := fakeQEMU(t, "echo $$ > "+pidFile+"\nexec sleep 60")
	start := time.Now()
	v, err := Launch(testCtx(t, 300*time.Millisecond), LaunchConfig{Binary: bin, Spec: testSpec(dir)})
	if err == nil {
		v.Kill()
		t.Fatal("Launch succeeded")
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("error = %v, want deadline exceeded", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("Launch took %s", d)
	}
	b, rerr := os.ReadFile(pidFile)
	if rerr != nil {
		t.Fatal(rerr)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("fake qemu pid %d still exists after failed Launch: %v", pid, err)
	}
}

func TestLaunchInvalid(t *testing.T) {
	dir := t.TempDir()
	spec := testSpec(dir)
	spec.CPUs = 0
	if _, err := Launch(testCtx(t, time.Second), LaunchConfig{Binary: "/bin/true", Spec: spec}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("bad spec: %v", err)
	}
	if _, err := Launch(testCtx(t, time.Second), LaunchConfig{Spec: testSpec(dir)}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("no binary: %v", err)
	}
	if _, err := Launch(testCtx(t, time.Second), LaunchConfig{Binary: filepath.Join(dir, "missing"), Spec: testSpec(dir)}); err == nil {
		t.Error("missing binary: no error")
	}
}

func TestExitCode(t *testing.T) {
	for script, want := range map[string]int{
		"exit 0":        0,
		"exit 3":        3,
		"kill -TERM $$": 143,
		"kill -KILL $$": 137,
	} {
		cmd := exec.Command("/bin/sh", "-c", script)
		_ = cmd.Run()
		if got := exitCode(cmd.ProcessState); got != want {
			t.Errorf("%q: exit code %d, want %d", script, got, want)
		}
	}
	if got := exitCode(nil); got != -1 {
		t.Errorf("nil state: %d", got)
	}
}

func TestTailWriter(t *testing.T) {
	w := &tailWriter{max: 32}
	if got := w.lastLines(2); got != "no output" {
		t.Errorf("empty: %q", got)
	}
	w.Write([]byte("first line\nsecond\n\n"))
	w.Write([]byte("third line that is long\nfourth\r\n"))
	if got := w.lastLines(2); got != "third line that is long | fourth" {
		t.Errorf("lastLines = %q", got)
	}
	if len(w.buf) > 32 {
		t.Errorf("buffer holds %d bytes", len(w.buf))
	}
}

func TestAgentPortEvent(t *testing.T) {
	ev := func(name, data string) Event { return Event{Name: name, Data: json.RawMessage(data)} }
	tests := []struct {
		name   string
		before int32
		ev     Event
		want   int32
	}{
		{"opened", agentPortClosed, ev("VSERPORT_CHANGE", `{"id": "agent-port", "open": true}`), agentPortOpen},
		{"closed", agentPortOpen, ev("VSERPORT_CHANGE", `{"id": "agent-port", "open": false}`), agentPortClosed},
		{"opened before any query", agentPortUnknown, ev("VSERPORT_CHANGE", `{"id": "agent-port", "open": true}`), agentPortOpen},
		{"other port", agentPortClosed, ev("VSERPORT_CHANGE", `{"id": "other", "open": true}`), agentPortClosed},
		{"other event", agentPortOpen, ev("STOP", `{"id": "agent-port", "open": false}`), agentPortOpen},
		{"bad data", agentPortOpen, ev("VSERPORT_CHANGE", `[]`), agentPortOpen},
		{"no data", agentPortClosed, ev("VSERPORT_CHANGE", ``), agentPortClosed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := &VM{}
			v.agentPort.Store(tt.before)
			v.agentPortEvent(tt.ev)
			if got := v.agentPort.Load(); got != tt.want {
				t.Errorf("state = %d, want %d", got, tt.want)
			}
		})
	}
}

func TestWatchAgentPort(t *testing.T) {
	tests := []struct {
		name     string
		chardevs string // query-chardev's answer
		wantOpen bool   // before any event
	}{
		{"closed", `[{"frontend-open": true, "filename": "unix:/q", "label": "qmp"}, {"frontend-open": false, "filename": "unix:/a", "label": "agent"}]`, false},
		{"already open", `[{"frontend-open": true, "filename": "unix:/a", "label": "agent"}]`, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, conn := newPeer(t)
			f := newFakeAgent(t, func(fakeRequest) string { return `{"return": {}}` })
			v := &VM{}
			v.agent = NewAgent(f.path, v.agentOpen)
			defer v.agent.Close()
			// The client sends the handshake and the query before QEMU's
			// greeting: one round trip for both.
			go func() {
				caps, query := p.recv(), p.recv()
				if caps.Execute != "qmp_capabilities" || query.Execute != "query-chardev" {
					t.Errorf("commands %q, %q, want qmp_capabilities and query-chardev", caps.Execute, query.Execute)
				}
				p.send("%s", greeting)
				p.send(`{"return": {}, "id": %s}`, caps.ID)
				p.send(`{"return": %s, "id": %s}`, tt.chardevs, query.ID)
			}()
			ctx := testCtx(t, 10*time.Second)
			query, err := v.open(ctx, conn, log.G(ctx))
			if err != nil {
				t.Fatal(err)
			}
			if err := v.agentPortState(ctx, query); err != nil {
				t.Fatal(err)
			}
			// ready polls until the client sees the port in state open.
			ready := func(open bool) {
				t.Helper()
				for v.agentOpen() != open {
					if ctx.Err() != nil {
						t.Fatalf("port open = %v, want %v", !open, open)
					}
					time.Sleep(5 * time.Millisecond)
				}
				err := v.Agent().Ping(ctx)
				if open && err != nil {
					t.Errorf("Ping with the port open: %v", err)
				}
				if !open && !errors.Is(err, ErrNoAgent) {
					t.Errorf("Ping with the port closed: %v, want ErrNoAgent", err)
				}
			}
			ready(tt.wantOpen)
			for _, open := range []bool{!tt.wantOpen, tt.wantOpen, true, false, true} {
				p.send(`{"event": "VSERPORT_CHANGE", "data": {"open": %t, "id": "%s"}, "timestamp": {"seconds": 1, "microseconds": 0}}`, open, AgentPortID)
				ready(open)
			}
			// Once QMP is gone, nothing can tell: the port counts as closed.
			p.conn.Close()
			ready(false)
		})
	}
}

// scriptedVM is a VM whose QMP peer is scripted; its pid is made up.
func scriptedVM(t *testing.T) (*VM, *peer) {
	t.Helper()
	c, p := connect(t)
	return &VM{qmp: c, cmd: &exec.Cmd{Process: &os.Process{Pid: 4242}}}, p
}

func TestPowerdownUnanswered(t *testing.T) {
	tests := []struct {
		name     string
		peer     func(p *peer) // plays QEMU after the handshake
		deadline time.Duration // the caller's
		wantErr  error         // nil: Powerdown succeeds
	}{
		{"answered", func(p *peer) {
			r := p.recv()
			p.send(`{"return": {}, "id": %s}`, r.ID)
		}, time.Minute, nil},
		// A stopped QEMU: the request is on its socket, no answer comes.
		{"sent, never answered", func(p *peer) { p.recv() }, time.Minute, nil},
		{"caller's deadline first", func(p *peer) { p.recv() }, 100 * time.Millisecond, context.DeadlineExceeded},
		// Nothing reads the socket: the request was never delivered.
		{"never read", func(*peer) {}, time.Minute, context.DeadlineExceeded},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, p := scriptedVM(t)
			go tt.peer(p)
			err := v.Powerdown(testCtx(t, tt.deadline))
			if tt.wantErr == nil && err != nil {
				t.Fatalf("Powerdown: %v", err)
			}
			if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Fatalf("Powerdown: %v, want %v", err, tt.wantErr)
			}
		})
	}
}

func TestLogFault(t *testing.T) {
	tests := []struct {
		name    string
		event   string // as QEMU sends it
		wantMsg string
		want    log.Fields
	}{
		{"pvpanic", `{"event": "GUEST_PANICKED", "data": {"action": "poweroff"}}`,
			"guest panicked", log.Fields{"action": "poweroff"}},
		{"panic with info", `{"event": "GUEST_PANICKED", "data": {"action": "pause", "info": {"type": "s390", "core": 0}}}`,
			"guest panicked", log.Fields{"action": "pause", "info": `{"type": "s390", "core": 0}`}},
		{"overlay full", `{"event": "BLOCK_IO_ERROR", "data": {"device": "", "node-name": "disk-root", "operation": "write", "action": "stop", "nospace": true, "reason": "No space left on device"}}`,
			"guest disk i/o error, vm paused", log.Fields{"node": "disk-root", "operation": "write", "action": "stop", "nospace": true, "reason": "No space left on device"}},
		{"reported read error", `{"event": "BLOCK_IO_ERROR", "data": {"device": "drive0", "operation": "read", "action": "report", "reason": "Input/output error"}}`,
			"guest disk i/o error", log.Fields{"node": "drive0", "operation": "read", "action": "report", "nospace": false, "reason": "Input/output error"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, conn := newPeer(t)
			v := &VM{cmd: &exec.Cmd{Process: &os.Process{Pid: 4242}}}
			go p.handshake()
			logger, hook := logtest.NewNullLogger()
			ctx := testCtx(t, 10*time.Second)
			if _, err := v.open(ctx, conn, logrus.NewEntry(logger).WithField("pid", v.Pid())); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { v.qmp.Close() })
			p.send(`{"event": "STOP", "timestamp": {"seconds": 1, "microseconds": 0}}`)
			p.send("%s", tt.event)
			for len(hook.AllEntries()) == 0 {
				if ctx.Err() != nil {
					t.Fatal("nothing logged")
				}
				time.Sleep(5 * time.Millisecond)
			}
			e := hook.LastEntry()
			if e.Level != logrus.ErrorLevel || e.Message != tt.wantMsg {
				t.Errorf("logged %s %q, want error %q", e.Level, e.Message, tt.wantMsg)
			}
			tt.want["pid"] = 4242
			for k, want := range tt.want {
				if got := e.Data[k]; got != want {
					t.Errorf("field %s = %#v, want %#v", k, got, want)
				}
			}
			if len(hook.AllEntries()) != 1 {
				t.Errorf("%d entries logged, want 1 (STOP is no fault)", len(hook.AllEntries()))
			}
		})
	}
}

// TestListen checks Listen makes a socket only its owner may connect to,
// listening on the returned file after Listen's own listener is gone, and
// that it replaces what a crashed shim left at the path.
func TestListen(t *testing.T) {
	tests := []struct {
		name  string
		stale func(t *testing.T, p string) // leaves something at the path
	}{
		{"new", func(*testing.T, string) {}},
		{"stale socket", func(t *testing.T, p string) {
			l, err := net.ListenUnix("unix", &net.UnixAddr{Name: p, Net: "unix"})
			if err != nil {
				t.Fatal(err)
			}
			l.SetUnlinkOnClose(false)
			l.Close()
			if _, err := net.Dial("unix", p); err == nil {
				t.Fatal("the stale socket accepts connections")
			}
		}},
		{"stale file", func(t *testing.T, p string) {
			if err := os.WriteFile(p, nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "qmp.sock")
			tc.stale(t, p)
			f, err := Listen(p)
			if err != nil {
				t.Fatalf("Listen() error = %v", err)
			}
			defer f.Close()
			fi, err := os.Lstat(p)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o600 {
				t.Errorf("%s: mode %v, want a socket of mode 0600", p, fi.Mode())
			}
			if n, err := syscall.GetsockoptInt(int(f.Fd()), syscall.SOL_SOCKET, syscall.SO_ACCEPTCONN); err != nil || n != 1 {
				t.Errorf("returned file is not listening: %d, %v", n, err)
			}
			// A connection made before anyone accepts waits in the
			// backlog, as QEMU's do while it starts.
			conn, err := net.Dial("unix", p)
			if err != nil {
				t.Fatalf("dial: %v", err)
			}
			defer conn.Close()
			l, err := net.FileListener(f)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			server, err := l.Accept()
			if err != nil {
				t.Fatalf("accept: %v", err)
			}
			defer server.Close()
			if _, err := conn.Write([]byte("ping")); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 4)
			if _, err := io.ReadFull(server, buf); err != nil || string(buf) != "ping" {
				t.Fatalf("read %q, %v", buf, err)
			}
		})
	}
}

func TestListenErrors(t *testing.T) {
	dir := t.TempDir()
	for _, p := range []string{
		filepath.Join(dir, "missing", "qmp.sock"),
		filepath.Join(dir, strings.Repeat("x", 120)),
	} {
		f, err := Listen(p)
		if err == nil {
			f.Close()
			t.Errorf("Listen(%s) succeeded", p)
			continue
		}
		if !strings.HasPrefix(err.Error(), "listen on "+p+": ") {
			t.Errorf("Listen(%s) error = %v, want it named", p, err)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("failed Listen left %v", entries)
	}
}

// TestLaunchListeningFDs checks QEMU serves QMP and the agent port on the
// listening sockets it inherits, and leaves them as Listen made them.
func TestLaunchListeningFDs(t *testing.T) {
	bin := qemuBinary(t)
	dir := t.TempDir()
	spec := testSpec(dir)
	spec.Paused = true
	spec.AgentSocket = filepath.Join(dir, "agent.sock")
	var fds FDSet
	defer fds.Close()
	for _, l := range []struct {
		path string
		fd   *int
	}{{spec.QMPSocket, &spec.QMPFD}, {spec.AgentSocket, &spec.AgentFD}} {
		f, err := Listen(l.path)
		if err != nil {
			t.Fatal(err)
		}
		*l.fd = fds.Add(f)
	}
	var stderr bytes.Buffer
	ctx := testCtx(t, 20*time.Second)
	v, err := Launch(ctx, LaunchConfig{Binary: bin, Spec: spec, Files: fds.Files(), Stderr: &stderr, Dir: dir})
	if err != nil {
		t.Fatalf("%v: %s", err, stderr.String())
	}
	defer v.Kill()
	// QEMU holds its own copies.
	if err := fds.Close(); err != nil {
		t.Fatal(err)
	}
	st, err := v.QMP().QueryStatus(ctx)
	if err != nil || st.Status != "prelaunch" {
		t.Fatalf("status = %+v, %v", st, err)
	}
	if err := v.Agent().Ping(ctx); !errors.Is(err, ErrNoAgent) {
		t.Errorf("agent of a paused guest: %v, want ErrNoAgent", err)
	}
	for _, p := range []string{spec.QMPSocket, spec.AgentSocket} {
		if fi, err := os.Lstat(p); err != nil || fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v, %v; want a socket of mode 0600", p, fi, err)
		}
	}
	if err := v.Kill(); err != nil {
		t.Fatal(err)
	}
	waitDone(t, v)
}

// TestResetEvent passes on the resets the guest caused, and only those.
func TestResetEvent(t *testing.T) {
	var got []string
	v := &VM{guestReset: func(reason string) { got = append(got, reason) }}
	for _, data := range []string{
		`{"guest": true, "reason": "guest-reset"}`,
		`{"guest": false, "reason": "host-qmp-system-reset"}`,
		`{"guest": true, "reason": "guest-panic"}`,
		`{"reason": "snapshot-load"}`,
		`not json`,
		``,
	} {
		v.resetEvent(Event{Name: "RESET", Data: json.RawMessage(data)})
	}
	if want := []string{"guest-reset", "guest-panic"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("resets told: %q, want %q", got, want)
	}
	(&VM{}).resetEvent(Event{Name: "RESET", Data: json.RawMessage(`{"guest": true}`)}) // no callback: ignored
}
