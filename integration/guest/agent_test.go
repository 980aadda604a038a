package guest_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// markerAgentStarted is printed by init.sh once qemu-ga runs.
const markerAgentStarted = "VMSHIM-AGENT-STARTED"

// agentArgs are QEMU's side of the guest agent channel, as the shim adds
// it (see qemu/argv.go): a virtio-serial port named org.qemu.guest_agent.0
// backed by a unix socket QEMU listens on.
func agentArgs(sock string) []string {
	return []string{
		"-device", "virtio-serial-pci,id=vser0",
		"-chardev", "socket,id=agent,path=" + sock + ",server=on,wait=off",
		"-device", "virtserialport,bus=vser0.0,chardev=agent,name=org.qemu.guest_agent.0,id=agent-port",
	}
}

// kernelBoot boots the kernel guest of flavour with initrd-FLAVOUR.img.
func kernelBoot(dir, flavour string) []string {
	return []string{
		"-kernel", filepath.Join(dir, "vmlinux"),
		"-initrd", filepath.Join(dir, "initrd-"+flavour+".img"),
		"-append", "console=ttyS0",
	}
}

// firstOf returns the first console line starting with any of prefixes,
// failing the test if QEMU exits or timeout passes first.
func (v *vm) firstOf(timeout time.Duration, prefixes ...string) string {
	v.t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case line, ok := <-v.lines:
			if !ok {
				v.t.Fatalf("console closed before any of %q", prefixes)
			}
			for _, p := range prefixes {
				if strings.HasPrefix(line, p) {
					return line
				}
			}
		case <-deadline:
			v.t.Fatalf("none of %q on the console after %v", prefixes, timeout)
		}
	}
}

// logged reports whether any console line so far starts with prefix.
func (v *vm) logged(prefix string) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, line := range v.log {
		if strings.HasPrefix(line, prefix) {
			return true
		}
	}
	return false
}

// agentConn speaks the guest agent protocol, raw, on QEMU's socket:
// newline-terminated JSON commands and answers, and 0xFF as the marker
// that resets the agent's parser and starts guest-sync-delimited's answer.
type agentConn struct {
	conn net.Conn
	r    *bufio.Reader
}

// agentError is an error answer of the agent.
type agentError struct {
	Class string `json:"class"`
	Desc  string `json:"desc"`
}

func (e *agentError) Error() string { return e.Class + ": " + e.Desc }

// dialAgent connects to the agent socket.
func dialAgent(ctx context.Context, path string) (*agentConn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("dial agent %s: %w", path, err)
	}
	return &agentConn{conn: conn, r: bufio.NewReader(conn)}, nil
}

// deadline bounds the next reads and writes by timeout and by ctx.
func (a *agentConn) deadline(ctx context.Context, timeout time.Duration) {
	dl := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(dl) {
		dl = d
	}
	_ = a.conn.SetDeadline(dl)
}

// send writes prefix and then the command as one JSON line.
func (a *agentConn) send(prefix []byte, command string, args any) error {
	msg, err := json.Marshal(struct {
		Execute   string `json:"execute"`
		Arguments any    `json:"arguments,omitempty"`
	}{command, args})
	if err != nil {
		return err
	}
	buf := append(append(append([]byte{}, prefix...), msg...), '\n')
	if _, err := a.conn.Write(buf); err != nil {
		return fmt.Errorf("send %s: %w", command, err)
	}
	return nil
}

// decodeAnswer parses one answer line into ret, or returns its error.
func decodeAnswer(line []byte, ret any) error {
	var rsp struct {
		Return json.RawMessage `json:"return"`
		Error  *agentError     `json:"error"`
	}
	if err := json.Unmarshal(line, &rsp); err != nil {
		return fmt.Errorf("answer %q: %w", line, err)
	}
	if rsp.Error != nil {
		return rsp.Error
	}
	if rsp.Return == nil {
		return fmt.Errorf("answer %q has neither return nor error", line)
	}
	if ret == nil {
		return nil
	}
	return json.Unmarshal(rsp.Return, ret)
}

// sync sends 0xFF and guest-sync-delimited with a fresh id until the agent
// answers it (0xFF, then {"return":ID}), so what follows is in step. An
// attempt waits up to 10 s; answers to earlier attempts are skipped.
func (a *agentConn) sync(ctx context.Context, firstID int) error {
	for id := firstID; ; id++ {
		a.deadline(ctx, 10*time.Second)
		if err := a.send([]byte{0xFF}, "guest-sync-delimited", map[string]int{"id": id}); err != nil {
			return err
		}
		err := a.awaitSync(id)
		if err == nil {
			return nil
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) || ctx.Err() != nil {
			return fmt.Errorf("guest-sync-delimited %d: %w", id, err)
		}
	}
}

// awaitSync reads answers until the one to guest-sync-delimited with id.
func (a *agentConn) awaitSync(id int) error {
	for {
		if _, err := a.r.ReadBytes(0xFF); err != nil {
			return err
		}
		line, err := a.r.ReadBytes('\n')
		if err != nil {
			return err
		}
		var got int
		if err := decodeAnswer(line, &got); err != nil {
			return err
		}
		if got == id {
			return nil
		}
	}
}

// call runs one command and decodes its return value into ret (unless nil).
func (a *agentConn) call(ctx context.Context, command string, args, ret any) error {
	a.deadline(ctx, 30*time.Second)
	if err := a.send(nil, command, args); err != nil {
		return err
	}
	line, err := a.r.ReadBytes('\n')
	if err != nil {
		return fmt.Errorf("%s: %w", command, err)
	}
	if err := decodeAnswer(bytes.TrimLeft(line, "\xff"), ret); err != nil {
		return fmt.Errorf("%s: %w", command, err)
	}
	return nil
}

// execStatus is guest-exec-status's answer.
type execStatus struct {
	Exited   bool   `json:"exited"`
	ExitCode *int   `json:"exitcode"`
	Signal   *int   `json:"signal"`
	OutData  []byte `json:"out-data"` // base64 in JSON
	ErrData  []byte `json:"err-data"`
}

// exec runs path with args through guest-exec (output captured, input
// from input when not nil) and polls guest-exec-status until it exits.
func (a *agentConn) exec(ctx context.Context, path string, args []string, input []byte) (*execStatus, error) {
	req := map[string]any{"path": path, "capture-output": true}
	if len(args) > 0 { // the agent refuses "arg": null
		req["arg"] = args
	}
	if input != nil {
		req["input-data"] = base64.StdEncoding.EncodeToString(input)
	}
	var started struct {
		PID int `json:"pid"`
	}
	if err := a.call(ctx, "guest-exec", req, &started); err != nil {
		return nil, err
	}
	for {
		var st execStatus
		if err := a.call(ctx, "guest-exec-status", map[string]int{"pid": started.PID}, &st); err != nil {
			return nil, err
		}
		if st.Exited {
			return &st, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("guest-exec-status %d: %w", started.PID, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// TestGuestAgent boots the agent guest with a virtio-serial port on a unix
// socket, syncs with qemu-ga and runs commands through guest-exec.
func TestGuestAgent(t *testing.T) {
	dir := guestDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	sock := filepath.Join(t.TempDir(), "agent.sock")
	v := startVM(t, ctx, append(kernelBoot(dir, "agent"), agentArgs(sock)...)...)

	if got := v.firstOf(3*time.Minute, markerAgentStarted, markerBooted, markerWarning); got != markerAgentStarted {
		t.Fatalf("first marker = %q, want %s before %s", got, markerAgentStarted, markerBooted)
	}
	t.Logf("kernel-agent: %s after %.2fs", markerAgentStarted, time.Since(v.start).Seconds())
	v.booted("kernel-agent")

	a, err := dialAgent(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	defer a.conn.Close()
	syncStart := time.Now()
	if err := a.sync(ctx, 12345); err != nil {
		t.Fatal(err)
	}
	t.Logf("guest-sync-delimited answered after %.2fs", time.Since(syncStart).Seconds())

	tests := []struct {
		name     string
		path     string
		args     []string
		input    []byte
		exitCode *int
		signal   *int
		out, err string // exact, unless outHas is set
		outHas   string // out must contain this
	}{
		{name: "sh-exit-3", path: "sh", args: []string{"-c", "echo out; echo err >&2; exit 3"},
			exitCode: intp(3), out: "out\n", err: "err\n"},
		{name: "cat-cpuinfo", path: "cat", args: []string{"/proc/cpuinfo"}, exitCode: intp(0), outHas: "processor\t: 0"},
		{name: "cat-stdin", path: "cat", input: []byte("hello agent\n"), exitCode: intp(0), out: "hello agent\n"},
		{name: "nproc", path: "nproc", exitCode: intp(0), out: "1\n"},
		{name: "kill", path: "kill", args: []string{"-0", "1"}, exitCode: intp(0)},
		{name: "killed", path: "sh", args: []string{"-c", "kill -9 $$"}, signal: intp(9)},
		{name: "dd", path: "sh", args: []string{"-c", "dd if=/dev/zero bs=512 count=2 2>/dev/null | wc -c"},
			exitCode: intp(0), out: "1024\n"},
		{name: "exit-1", path: "sh", args: []string{"-c", "false"}, exitCode: intp(1)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, err := a.exec(ctx, tt.path, tt.args, tt.input)
			if err != nil {
				t.Fatal(err)
			}
			if !sameInt(st.ExitCode, tt.exitCode) || !sameInt(st.Signal, tt.signal) {
				t.Errorf("exitcode %s signal %s, want exitcode %s signal %s",
					intStr(st.ExitCode), intStr(st.Signal), intStr(tt.exitCode), intStr(tt.signal))
			}
			if tt.outHas != "" {
				if !strings.Contains(string(st.OutData), tt.outHas) {
					t.Errorf("out-data %q lacks %q", st.OutData, tt.outHas)
				}
			} else if string(st.OutData) != tt.out {
				t.Errorf("out-data = %q, want %q", st.OutData, tt.out)
			}
			if string(st.ErrData) != tt.err {
				t.Errorf("err-data = %q, want %q", st.ErrData, tt.err)
			}
		})
	}

	t.Run("missing-command", func(t *testing.T) {
		_, err := a.exec(ctx, "no-such-command", nil, nil)
		var ae *agentError
		if !errors.As(err, &ae) || !strings.Contains(ae.Desc, "No such file") {
			t.Errorf("guest-exec of a missing command: %v, want an agent error naming ENOENT", err)
		}
	})

	v.qmpCommand(ctx, "system_powerdown")
	v.waitFor(markerACPI, 60*time.Second)
	v.waitExit(30 * time.Second)
	v.wholeLines()
	if v.logged(markerWarning) {
		t.Errorf("the guest printed a warning")
	}
}

// TestGuestNoAgent checks the guests that must not answer: the wait guest
// (no qemu-ga) with the agent port present, and the agent guest without
// the port, which warns instead of starting qemu-ga.
func TestGuestNoAgent(t *testing.T) {
	dir := guestDir(t)
	tests := []struct {
		name    string
		flavour string
		port    bool
		want    string // first of the agent markers, warnings and BOOTED
	}{
		{"wait-with-port", "wait", true, markerBooted},
		{"agent-without-port", "agent", false, markerWarning + ": no virtio-serial port org.qemu.guest_agent.0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			defer cancel()
			boot := kernelBoot(dir, tt.flavour)
			if tt.port {
				boot = append(boot, agentArgs(filepath.Join(t.TempDir(), "agent.sock"))...)
			}
			v := startVM(t, ctx, boot...)
			if got := v.firstOf(3*time.Minute, markerAgentStarted, markerBooted, markerWarning); !strings.HasPrefix(got, tt.want) {
				t.Errorf("first marker = %q, want %q", got, tt.want)
			}
			v.send("poweroff")
			v.waitFor(markerPoweroff, 60*time.Second)
			v.waitExit(30 * time.Second)
			v.wholeLines()
			if v.logged(markerAgentStarted) {
				t.Errorf("%s printed %s", tt.name, markerAgentStarted)
			}
		})
	}
}

// sameInt reports whether a and b are both nil or hold the same value.
func sameInt(a, b *int) bool {
	return (a == nil && b == nil) || (a != nil && b != nil && *a == *b)
}

// intStr formats an optional int.
func intStr(p *int) string {
	if p == nil {
		return "none"
	}
	return fmt.Sprint(*p)
}

// intp returns a pointer to n.
func intp(n int) *int { return &n }
