package integration

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
)

// openPTY opens a new pseudo-terminal pair: the master, which the test
// reads and writes, and the slave, a terminal for a child process.
func openPTY() (master, slave *os.File, err error) {
	master, err = os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open /dev/ptmx: %w", err)
	}
	fd := int(master.Fd())
	n, err := unix.IoctlGetUint32(fd, unix.TIOCGPTN)
	if err == nil {
		err = unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0)
	}
	if err == nil {
		slave, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY|syscall.O_CLOEXEC, 0)
	}
	if err != nil {
		master.Close()
		return nil, nil, fmt.Errorf("open the pty's slave: %w", err)
	}
	return master, slave, nil
}

// setWinsize sets the terminal's window size; the kernel sends SIGWINCH
// to the terminal's foreground process group when it changes.
func setWinsize(f *os.File, rows, cols uint16) error {
	return unix.IoctlSetWinsize(int(f.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols})
}

// testExecTTY: `kubectl exec -it POD -- sh` with kubectl on a real
// terminal, as a user types: the guest's shell echoes what is typed and
// runs it, sees the terminal's size and its change (SIGWINCH on the
// client), line editing works, Ctrl-C interrupts the foreground
// command, and the shell's exit code is kubectl's.
func (k *kubeCluster) testExecTTY(t *testing.T, p *corev1.Pod) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	master, slave, err := openPTY()
	if err != nil {
		t.Fatal(err)
	}
	defer master.Close()
	if err := setWinsize(master, 33, 101); err != nil {
		t.Fatal(err)
	}
	cmd := k.kubectl(ctx, "-n", kubeNamespace, "exec", "-it", p.Name, "--", "sh")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		slave.Close()
		t.Fatalf("start kubectl exec -it: %v", err)
	}
	slave.Close()
	screen := newConsoleOut()
	go func() { _, _ = io.Copy(screen, master) }()
	waited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(waited) }()
	defer func() {
		select {
		case <-waited:
		default:
			_ = cmd.Process.Kill()
			<-waited
		}
		t.Logf("terminal:\n%s", strings.ReplaceAll(screen.String(), "\r", ""))
	}()

	// Every wait ends early if kubectl exits (a refused tty, a broken
	// stream): live is cancelled then.
	live, stopLive := context.WithCancel(ctx)
	defer stopLive()
	go func() {
		select {
		case <-waited:
			stopLive()
		case <-live.Done():
		}
	}()

	typ := func(s string) {
		t.Helper()
		if _, err := master.WriteString(s); err != nil {
			t.Fatalf("type %q: %v", s, err)
		}
	}
	// Typing starts at the guest shell's prompt, once kubectl has put
	// the local terminal in raw mode: from then on every echo is the
	// guest's. What the shell prints differs from what was typed.
	screen.waitFor(live, t, "/ # ")
	prompt := len(screen.String())
	typ("echo tty-$((6*7))\r")
	screen.waitForAfter(live, t, prompt, "echo tty-$((6*7))")
	screen.waitFor(live, t, "tty-42")
	// Line editing: the guest's terminal erases the character before a
	// backspace (DEL).
	typ("echo edit-abX\x7fc\r")
	screen.waitFor(live, t, "edit-abc")
	typ("stty size\r")
	screen.waitFor(live, t, "33 101")

	// The resize reaches the guest asynchronously: ask until it shows.
	if err := setWinsize(master, 40, 120); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(screen.String(), "40 120") {
		if time.Now().After(deadline) {
			t.Fatalf("the guest never saw the new window size 40x120")
		}
		typ("stty size\r")
		time.Sleep(time.Second)
	}

	typ("echo sleeping-$((2+2)); sleep 300; echo not-$((1+1))-interrupted\r")
	screen.waitFor(live, t, "sleeping-4")
	time.Sleep(500 * time.Millisecond)
	typ("\x03")
	typ("echo after-$?\r")
	screen.waitFor(live, t, "after-130")

	typ("exit 3\r")
	select {
	case <-waited:
	case <-ctx.Done():
		t.Fatal("kubectl exec -it did not end after the shell exited")
	}
	var ee *exec.ExitError
	if !errors.As(waitErr, &ee) || ee.ExitCode() != 3 {
		t.Errorf("kubectl exec -it ended with %v, want exit status 3", waitErr)
	}
	if strings.Contains(screen.String(), "not-2-interrupted") {
		t.Errorf("Ctrl-C did not interrupt sleep")
	}
}
