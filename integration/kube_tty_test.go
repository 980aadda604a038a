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

// kubectlTTY is kubectl on a real terminal, as a user runs it: what it
// prints is on screen, what the test types goes to its terminal.
type kubectlTTY struct {
	t      *testing.T
	master *os.File
	screen *consoleOut
	// live is cancelled when kubectl exits (a refused tty, a broken
	// stream), so that every wait on the screen ends early then.
	live    context.Context
	waited  chan struct{}
	waitErr error
}

// startKubectlTTY starts kubectl args on a new terminal of rows x cols;
// the test's end kills it if it still runs and logs the screen.
func (k *kubeCluster) startKubectlTTY(ctx context.Context, t *testing.T, rows, cols uint16, args ...string) *kubectlTTY {
	t.Helper()
	master, slave, err := openPTY()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { master.Close() })
	if err := setWinsize(master, rows, cols); err != nil {
		t.Fatal(err)
	}
	cmd := k.kubectl(ctx, args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		slave.Close()
		t.Fatalf("start kubectl %s: %v", strings.Join(args, " "), err)
	}
	slave.Close()
	s := &kubectlTTY{t: t, master: master, screen: newConsoleOut(), waited: make(chan struct{})}
	go func() { _, _ = io.Copy(s.screen, master) }()
	go func() { s.waitErr = cmd.Wait(); close(s.waited) }()
	live, stopLive := context.WithCancel(ctx)
	s.live = live
	go func() {
		select {
		case <-s.waited:
			stopLive()
		case <-live.Done():
		}
	}()
	t.Cleanup(func() {
		stopLive()
		select {
		case <-s.waited:
		default:
			_ = cmd.Process.Kill()
			<-s.waited
		}
		t.Logf("terminal of kubectl %s:\n%s", strings.Join(args, " "), strings.ReplaceAll(s.screen.String(), "\r", ""))
	})
	return s
}

// typ types str on the terminal.
func (s *kubectlTTY) typ(str string) {
	s.t.Helper()
	if _, err := s.master.WriteString(str); err != nil {
		s.t.Fatalf("type %q: %v", str, err)
	}
}

// waitFor waits until the screen shows marker.
func (s *kubectlTTY) waitFor(marker string) {
	s.t.Helper()
	s.screen.waitFor(s.live, s.t, marker)
}

// exit waits for kubectl to end and checks that its exit code is code.
func (s *kubectlTTY) exit(ctx context.Context, code int) {
	s.t.Helper()
	select {
	case <-s.waited:
	case <-ctx.Done():
		s.t.Fatal("kubectl did not end after the shell exited")
	}
	var ee *exec.ExitError
	if code == 0 && s.waitErr != nil || code != 0 && (!errors.As(s.waitErr, &ee) || ee.ExitCode() != code) {
		s.t.Errorf("kubectl ended with %v, want exit status %d", s.waitErr, code)
	}
}

// testExecTTY: `kubectl exec -it POD -- sh` with kubectl on a real
// terminal, as a user types: the guest's shell echoes what is typed and
// runs it, sees the terminal's size and its change (SIGWINCH on the
// client), line editing works, Ctrl-C interrupts the foreground
// command, and the shell's exit code is kubectl's.
func (k *kubeCluster) testExecTTY(t *testing.T, p *corev1.Pod) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := k.startKubectlTTY(ctx, t, 33, 101, "-n", kubeNamespace, "exec", "-it", p.Name, "--", "sh")
	master, screen, live, typ := s.master, s.screen, s.live, s.typ

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
	s.exit(ctx, 3)
	if strings.Contains(screen.String(), "not-2-interrupted") {
		t.Errorf("Ctrl-C did not interrupt sleep")
	}
}
