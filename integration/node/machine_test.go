package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmshim/vmshim/qemu"
)

const (
	// nodeCPUs and nodeMemMiB size the node.
	nodeCPUs   = 2
	nodeMemMiB = 3072
	// shareTag is the 9p mount tag of the read-only share, and shareDir
	// where the node mounts it.
	shareTag = "vmshim"
	shareDir = "/mnt/vmshim"
	// agentTimeout bounds the boot, to the guest agent answering.
	agentTimeout = 5 * time.Minute
	// execPoll is the pause between guest-exec-status calls.
	execPoll = 100 * time.Millisecond
)

// machine is the node guest running under the host's QEMU, driven through
// its guest agent.
type machine struct {
	dir   string // the run's directory: share, overlay, sockets, console log
	cmd   *exec.Cmd
	done  chan struct{} // closed once cmd is reaped
	agent *qemu.Agent
}

// shared is a file the node gets on the read-only share: src on the host,
// at dst below the share.
type shared struct{ src, dst string }

// bootMachine boots the node from image (never written: the node writes
// to an overlay) with files on its share, and waits for its guest agent.
func bootMachine(ctx context.Context, t *testing.T, image string, files []shared) *machine {
	t.Helper()
	dir, err := os.MkdirTemp("", "vmshim-node-")
	if err != nil {
		t.Fatalf("run directory: %v", err)
	}
	m := &machine{dir: dir}
	t.Cleanup(func() { m.stop(t) })
	for _, f := range files {
		if err := linkOrCopy(f.src, filepath.Join(dir, "share", f.dst)); err != nil {
			t.Fatalf("share %s: %v", f.src, err)
		}
	}
	overlay := filepath.Join(dir, "node.qcow2")
	if out, err := exec.CommandContext(ctx, "qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", image, overlay).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img create overlay of %s: %v: %s", image, err, out)
	}
	agentSock := filepath.Join(dir, "qga.sock")
	args := []string{
		"-name", "vmshim-node", "-nodefaults", "-no-user-config", "-display", "none",
		"-machine", "q35", "-accel", "tcg,thread=multi", "-cpu", "max",
		"-smp", fmt.Sprint(nodeCPUs), "-m", fmt.Sprint(nodeMemMiB),
		"-nic", "none",
		"-drive", "file=" + overlay + ",if=virtio,format=qcow2,cache=unsafe,discard=unmap",
		"-device", "virtio-rng-pci",
		"-fsdev", "local,id=share,path=" + filepath.Join(dir, "share") + ",security_model=none,readonly=on",
		"-device", "virtio-9p-pci,fsdev=share,mount_tag=" + shareTag,
		"-chardev", "socket,id=qga,path=" + agentSock + ",server=on,wait=off",
		"-device", "virtio-serial-pci",
		"-device", "virtserialport,chardev=qga,name=org.qemu.guest_agent.0",
		"-chardev", "file,id=console,path=" + m.consolePath(),
		"-serial", "chardev:console",
	}
	m.cmd = exec.Command("qemu-system-x86_64", args...)
	log, err := os.Create(filepath.Join(dir, "qemu.log"))
	if err != nil {
		t.Fatalf("qemu log: %v", err)
	}
	defer log.Close()
	m.cmd.Stdout, m.cmd.Stderr = log, log
	m.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := m.cmd.Start(); err != nil {
		t.Fatalf("start qemu-system-x86_64: %v", err)
	}
	m.done = make(chan struct{})
	go func() { _ = m.cmd.Wait(); close(m.done) }()
	t.Logf("node: qemu-system-x86_64 pid %d, TCG, %d vCPUs, %d MiB, no NIC, share %s", m.cmd.Process.Pid, nodeCPUs, nodeMemMiB, filepath.Join(dir, "share"))

	m.agent = qemu.NewAgent(agentSock, nil)
	start := time.Now()
	deadline := time.Now().Add(agentTimeout)
	for {
		pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		err := m.agent.Ping(pctx)
		cancel()
		if err == nil {
			break
		}
		select {
		case <-m.done:
			t.Fatalf("node QEMU exited during boot: %s\nconsole:\n%s", m.qemuLog(), m.consoleTail())
		default:
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("node guest agent did not answer within %s: %v\nconsole:\n%s", agentTimeout, err, m.consoleTail())
		}
		time.Sleep(time.Second)
	}
	t.Logf("node: guest agent answers %.1f s after QEMU started", time.Since(start).Seconds())
	return m
}

// consolePath is the file the node's serial console is written to.
func (m *machine) consolePath() string { return filepath.Join(m.dir, "console.log") }

// consoleTail returns the end of the node's console.
func (m *machine) consoleTail() string { return tail(m.consolePath(), 6000) }

// qemuLog returns what the node's QEMU printed.
func (m *machine) qemuLog() string { return tail(filepath.Join(m.dir, "qemu.log"), 4000) }

// tail returns up to n bytes from the end of file path.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// result is what a command run in the node did.
type result struct {
	stdout, stderr string
	code           int
}

// run runs script with /bin/sh in the node, input on its stdin, and waits
// for it to end.
func (m *machine) run(ctx context.Context, script string, input []byte) (result, error) {
	pid, err := m.agent.Exec(ctx, qemu.GuestCommand{Path: "/bin/sh", Args: []string{"-c", script}, Input: input})
	if err != nil {
		return result{}, err
	}
	for {
		st, err := m.agent.ExecStatus(ctx, pid)
		if err != nil {
			return result{}, err
		}
		if st.Exited {
			return result{stdout: string(st.Stdout), stderr: string(st.Stderr), code: st.ExitCode}, nil
		}
		select {
		case <-ctx.Done():
			return result{}, fmt.Errorf("%q in the node: %w", script, ctx.Err())
		case <-time.After(execPoll):
		}
	}
}

// sh runs script in the node and returns its stdout; anything but exit 0
// fails the test.
func (m *machine) sh(ctx context.Context, t *testing.T, script string) string {
	t.Helper()
	return m.shInput(ctx, t, script, nil)
}

// shInput is sh with input on the script's stdin.
func (m *machine) shInput(ctx context.Context, t *testing.T, script string, input []byte) string {
	t.Helper()
	r, err := m.run(ctx, script, input)
	if err != nil {
		t.Fatalf("node: %s: %v", script, err)
	}
	if r.code != 0 {
		t.Fatalf("node: %s: exit %d\nstdout: %s\nstderr: %s", script, r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

// stop ends the node's QEMU and removes the run's directory, unless
// VMSHIM_KEEP is set.
func (m *machine) stop(t *testing.T) {
	if t.Failed() {
		t.Logf("node console (end):\n%s", m.consoleTail())
	}
	if m.agent != nil {
		_ = m.agent.Close()
	}
	if m.cmd != nil && m.cmd.Process != nil {
		_ = m.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-m.done:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-m.cmd.Process.Pid, syscall.SIGKILL)
			<-m.done
		}
	}
	if os.Getenv("VMSHIM_KEEP") != "" {
		t.Logf("VMSHIM_KEEP: kept %s", m.dir)
		return
	}
	if err := os.RemoveAll(m.dir); err != nil {
		t.Errorf("remove %s: %v", m.dir, err)
	}
}

// linkOrCopy makes dst (and its directory) a hard link to src, or a copy
// where a link is not possible.
func linkOrCopy(src, dst string) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	if err := os.Link(src, dst); err == nil {
		return nil
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, st.Mode().Perm())
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	return errors.Join(err, out.Close())
}

// buildStatic builds the Go package pkg as a static binary at out.
func buildStatic(ctx context.Context, pkg, out string) error {
	return goStatic(ctx, "build", "-trimpath", "-o", out, pkg)
}

// buildStaticTest builds package pkg's tests into a static binary at out,
// to run in the node.
func buildStaticTest(ctx context.Context, pkg, out string) error {
	return goStatic(ctx, "test", "-c", "-trimpath", "-o", out, pkg)
}

// goStatic runs the go command with args, the package last, and cgo off.
func goStatic(ctx context.Context, args ...string) error {
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go %s %s: %v: %s", args[0], args[len(args)-1], err, strings.TrimSpace(stderr.String()))
	}
	return nil
}
