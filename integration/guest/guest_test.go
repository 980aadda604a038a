package guest_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// Markers printed by the test guest's /init (see init.sh).
const (
	markerBooted    = "VMSHIM-GUEST-BOOTED"
	markerUptime    = "VMSHIM-GUEST-UPTIME "
	markerPoweroff  = "VMSHIM-GUEST-POWEROFF"
	markerACPI      = "VMSHIM-GUEST-ACPI-POWERDOWN"
	markerEchoReply = "VMSHIM-ECHO: "
)

// guestDir builds the guests (once per output dir, build.sh is idempotent)
// and returns the output dir. The test needs root-free tools only, but
// boots several VMs under TCG, so it runs only when VMSHIM_GUEST_TEST=1.
func guestDir(t *testing.T) string {
	t.Helper()
	if os.Getenv("VMSHIM_GUEST_TEST") != "1" {
		t.Skip("set VMSHIM_GUEST_TEST=1 to build the test guests and boot them under QEMU (about a minute)")
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("qemu-system-x86_64 not installed")
	}
	return buildGuest(t, "build.sh", 10*time.Minute)
}

// buildGuest runs script (build.sh or cloud.sh, both idempotent) within
// timeout into the guest output dir, $VMSHIM_GUEST_DIR or
// ~/.cache/vmshim/guest, and returns the dir.
func buildGuest(t *testing.T, script string, timeout time.Duration) string {
	t.Helper()
	dir := os.Getenv("VMSHIM_GUEST_DIR")
	if dir == "" {
		cache, err := os.UserCacheDir()
		if err != nil {
			t.Fatal(err)
		}
		dir = filepath.Join(cache, "vmshim", "guest")
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "./"+script, dir)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v", script, dir, err)
	}
	return dir
}

// vm is one QEMU process with its console and QMP socket.
type vm struct {
	t     *testing.T
	cmd   *exec.Cmd
	stdin io.WriteCloser
	qmp   string
	start time.Time
	lines chan string // console lines, closed at EOF
	done  chan error  // QEMU's exit
	mu    sync.Mutex  // guards log
	log   []string    // every console line so far
}

// startVM runs QEMU under TCG with the console on stdio and boot args.
func startVM(t *testing.T, ctx context.Context, boot ...string) *vm {
	t.Helper()
	return startVMIn(t, ctx, "", boot...)
}

// startVMIn is startVM inside the network namespace at path netns (none
// when empty), entered with nsenter, which execs QEMU in place.
func startVMIn(t *testing.T, ctx context.Context, netns string, boot ...string) *vm {
	t.Helper()
	qmp := filepath.Join(t.TempDir(), "qmp.sock")
	args := append([]string{
		"qemu-system-x86_64",
		"-accel", "tcg", "-nodefaults", "-display", "none", "-machine", "q35", "-m", "256",
		"-serial", "stdio", "-qmp", "unix:" + qmp + ",server=on,wait=off",
	}, boot...)
	if netns != "" {
		args = append([]string{"nsenter", "--net=" + netns}, args...)
	}
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	v := &vm{t: t, cmd: cmd, stdin: stdin, qmp: qmp, lines: make(chan string, 1024), done: make(chan error, 1)}
	v.start = time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := strings.TrimRight(sc.Text(), "\r")
			v.mu.Lock()
			v.log = append(v.log, line)
			v.mu.Unlock()
			v.lines <- line
		}
		close(v.lines)
		err := cmd.Wait()
		if err != nil && stderr.Len() > 0 {
			err = fmt.Errorf("%w: %s", err, strings.TrimSpace(stderr.String()))
		}
		v.done <- err
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		if t.Failed() {
			v.mu.Lock()
			t.Logf("console:\n%s", strings.Join(v.log, "\n"))
			v.mu.Unlock()
		}
	})
	return v
}

// waitFor returns the first console line starting with prefix, failing the
// test if QEMU exits or timeout passes first.
func (v *vm) waitFor(prefix string, timeout time.Duration) string {
	v.t.Helper()
	return v.firstOf(timeout, prefix)
}

// waitForAll returns the first console line starting with each of
// prefixes, in whatever order they come, failing the test if QEMU exits or
// timeout passes first.
func (v *vm) waitForAll(timeout time.Duration, prefixes ...string) map[string]string {
	v.t.Helper()
	got := make(map[string]string, len(prefixes))
	deadline := time.After(timeout)
	for len(got) < len(prefixes) {
		select {
		case line, ok := <-v.lines:
			if !ok {
				v.t.Fatalf("console closed; still waiting for some of %q (have %q)", prefixes, got)
			}
			for _, p := range prefixes {
				if _, seen := got[p]; !seen && strings.HasPrefix(line, p) {
					got[p] = line
					break
				}
			}
		case <-deadline:
			v.t.Fatalf("after %v, still waiting for some of %q (have %q)", timeout, prefixes, got)
		}
	}
	return got
}

// wholeLines fails the test if a marker is not at the start of its console
// line, i.e. writers interleaved.
func (v *vm) wholeLines() {
	v.t.Helper()
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, line := range v.log {
		if strings.Contains(line, "VMSHIM-") && !strings.HasPrefix(line, "VMSHIM-") {
			v.t.Errorf("marker not at the start of a console line: %q", line)
		}
	}
}

// waitExit waits for QEMU to exit and fails unless it exits with 0.
func (v *vm) waitExit(timeout time.Duration) {
	v.t.Helper()
	for range v.lines {
	}
	select {
	case err := <-v.done:
		if err != nil {
			v.t.Fatalf("qemu: %v", err)
		}
	case <-time.After(timeout):
		v.t.Fatalf("qemu still running %v after the guest powered off", timeout)
	}
}

// send writes one line to the guest console.
func (v *vm) send(line string) {
	v.t.Helper()
	if _, err := io.WriteString(v.stdin, line+"\n"); err != nil {
		v.t.Fatal(err)
	}
}

// qmpCommand runs one QMP command on a fresh connection.
func (v *vm) qmpCommand(ctx context.Context, command string) {
	v.t.Helper()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", v.qmp)
	if err != nil {
		v.t.Fatal(err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	dec := json.NewDecoder(conn)
	var greeting map[string]any
	if err := dec.Decode(&greeting); err != nil {
		v.t.Fatalf("qmp greeting: %v", err)
	}
	for _, c := range []string{"qmp_capabilities", command} {
		if _, err := fmt.Fprintf(conn, `{"execute":%q}`+"\n", c); err != nil {
			v.t.Fatal(err)
		}
		for {
			var msg map[string]json.RawMessage
			if err := dec.Decode(&msg); err != nil {
				v.t.Fatalf("qmp %s: %v", c, err)
			}
			if e, ok := msg["error"]; ok {
				v.t.Fatalf("qmp %s: %s", c, e)
			}
			if _, ok := msg["return"]; ok {
				break
			}
		}
	}
}

// booted waits for the boot markers and logs the time to them.
func (v *vm) booted(name string) {
	v.t.Helper()
	v.waitFor(markerBooted, 3*time.Minute)
	elapsed := time.Since(v.start)
	uptime := strings.TrimPrefix(v.waitFor(markerUptime, 10*time.Second), markerUptime)
	v.t.Logf("%s: %s after %.2fs (guest uptime %ss)", name, markerBooted, elapsed.Seconds(), uptime)
}

func TestGuestsBoot(t *testing.T) {
	dir := guestDir(t)
	p := func(name string) string { return filepath.Join(dir, name) }
	kernel := func(mode string) []string {
		return []string{"-kernel", p("vmlinux"), "-initrd", p("initrd-" + mode + ".img"), "-append", "console=ttyS0"}
	}
	disk := func(mode string) []string {
		return []string{"-drive", "file=" + p("disk-"+mode+".qcow2") + ",format=qcow2,if=virtio,readonly=on"}
	}
	tests := []struct {
		name string
		boot []string
		run  func(ctx context.Context, v *vm)
	}{
		{"kernel-poweroff", kernel("poweroff"), poweroffBySelf},
		{"disk-poweroff", disk("poweroff"), poweroffBySelf},
		{"kernel-wait-acpi", kernel("wait"), poweroffByACPI},
		{"disk-wait-acpi", disk("wait"), poweroffByACPI},
		{"kernel-wait-console", kernel("wait"), poweroffByConsole},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			defer cancel()
			v := startVM(t, ctx, tt.boot...)
			v.booted(tt.name)
			tt.run(ctx, v)
			v.waitExit(30 * time.Second)
			v.wholeLines()
		})
	}
}

// poweroffBySelf expects a poweroff guest to power off right after booting.
func poweroffBySelf(_ context.Context, v *vm) {
	v.waitFor(markerPoweroff, 30*time.Second)
}

// poweroffByACPI checks the console echo, then presses the power button.
func poweroffByACPI(ctx context.Context, v *vm) {
	v.send("hello vmshim")
	if got := v.waitFor(markerEchoReply, 30*time.Second); got != markerEchoReply+"hello vmshim" {
		v.t.Errorf("echo = %q", got)
	}
	v.qmpCommand(ctx, "system_powerdown")
	v.waitFor(markerACPI, 60*time.Second)
}

// poweroffByConsole powers the guest off with a "poweroff" console line.
func poweroffByConsole(_ context.Context, v *vm) {
	v.send("poweroff")
	if got := v.waitFor(markerEchoReply, 30*time.Second); got != markerEchoReply+"poweroff" {
		v.t.Errorf("echo = %q", got)
	}
	v.waitFor(markerPoweroff, 30*time.Second)
}
