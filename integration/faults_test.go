package integration

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestFaultQEMUFrozenPausePending freezes QEMU (SIGSTOP) and asks for a
// pause, which reaches QEMU and waits there for an answer that does not
// come: State still answers, and SIGKILL ends the task long before the
// pause would give up at its deadline.
func TestFaultQEMUFrozenPausePending(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*bootTimeout)
	defer cancel()
	v := startVM(ctx, t, imageKernelWait)
	v.console.waitFor(ctx, t, markerBooted)
	freeze(ctx, t, v.id)
	pid := int(v.task.Pid())
	paused := make(chan error, 1)
	go func() { paused <- v.task.Pause(ctx) }()
	waitGone(ctx, t, "a QMP request unread by the frozen QEMU", func() bool { return qmpUnread(t, pid) > 0 })

	start := time.Now()
	st, err := v.task.Status(ctx)
	if err != nil || st.Status != client.Running {
		t.Errorf("status with a pause pending: %v, %v; want running", st.Status, err)
	}
	t.Logf("State answered in %v with a pause pending on the frozen QEMU", time.Since(start).Round(time.Millisecond))
	start = time.Now()
	if err := v.task.Kill(ctx, syscall.SIGKILL); err != nil {
		t.Fatalf("kill SIGKILL: %v", err)
	}
	if code := v.waitExit(ctx, t); code != 137 {
		t.Errorf("exit status %d, want 137", code)
	}
	took := time.Since(start)
	t.Logf("SIGKILL to exit: %v", took.Round(time.Millisecond))
	if took >= qmpCallTimeout {
		t.Errorf("the kill took %v: it waited for the pending pause to time out (%v)", took, qmpCallTimeout)
	}
	if err := <-paused; err == nil {
		t.Error("the pause of a frozen QEMU succeeded")
	}
}

// qmpCallTimeout is the deadline of the shim's calls to QMP.
const qmpCallTimeout = 10 * time.Second

// qmpUnread is how many bytes QEMU (pid) has not read from its QMP
// connections: a request is on its way once this is above zero. A unix
// socket shows only in the network namespace it was made in: the shim
// makes QMP's, in the suite daemon's.
func qmpUnread(t *testing.T, pid int) int {
	t.Helper()
	out, err := exec.Command("nsenter", "--net=/run/netns/"+env.daemon.netns, "ss", "-xpnH").Output()
	if err != nil {
		t.Fatalf("ss: %v", err)
	}
	n := 0
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 || !strings.HasSuffix(f[4], "/qmp.sock") || !strings.Contains(line, fmt.Sprintf("pid=%d,", pid)) {
			continue
		}
		if q, err := strconv.Atoi(f[2]); err == nil {
			n += q
		}
	}
	return n
}

// Markers and log lines of the faults below.
const (
	markerPanic    = "VMSHIM-GUEST-PANIC"         // the guest crashes itself (mode panic)
	kernelPanic    = "Kernel panic - not syncing" // the guest kernel's last words
	logGuestPanic  = "guest panicked"             // the shim's error on QMP GUEST_PANICKED
	logDiskIOError = "guest disk i/o error"       // the shim's error on QMP BLOCK_IO_ERROR
	// markerCloudInitDone is the cloud guest's final cloud-init message,
	// at the end of its boot.
	markerCloudInitDone = "VMSHIM-CLOUD-INIT-DONE"
)

// TestFaultQEMUFrozen stops a booted VM's QEMU with SIGSTOP, then stops
// the container as the kubelet does: the power button cannot be
// answered, so StopContainer must still return, by SIGKILL at its
// deadline, and the container exit 137; the pod then goes without a trace.
func TestFaultQEMUFrozen(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*bootTimeout)
	defer cancel()
	p := newCRI(t, env.daemon).runPod(ctx, t, "frozen")
	netns := p.netnsPath(ctx, t)
	vm := p.startVM(ctx, t, imageKernelWaitCRI, nil)
	vm.waitLog(ctx, t, markerBooted)
	freeze(ctx, t, vm.id)

	stopCtx, stopCancel := context.WithTimeout(ctx, time.Minute)
	defer stopCancel()
	start := time.Now()
	if _, err := p.c.runtime.StopContainer(stopCtx, &runtimeapi.StopContainerRequest{ContainerId: vm.id, Timeout: 5}); err != nil {
		t.Fatalf("StopContainer of a frozen VM: %v\ncontainerd log:\n%s", err, env.daemon.logTail())
	}
	t.Logf("StopContainer (timeout 5 s) returned after %v", time.Since(start).Round(100*time.Millisecond))
	if st := vm.waitExited(ctx, t); st.ExitCode != 137 {
		t.Errorf("frozen VM stopped: exit %d reason %q, want 137", st.ExitCode, st.Reason)
	}
	p.remove(t)
	assertPodGone(ctx, t, p, netns, vm.id)
}

// freeze stops the QEMU process of container id with SIGSTOP and waits
// until the kernel reports it stopped. A test that fails before QEMU is
// killed lets it go on again.
func freeze(ctx context.Context, t *testing.T, id string) {
	t.Helper()
	pid, err := pidOf("guest=" + id)
	if err != nil {
		t.Fatalf("qemu of %s: %v", id, err)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP qemu: %v", err)
	}
	t.Cleanup(func() {
		if cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); strings.Contains(string(cmd), "guest="+id) {
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	})
	waitGone(ctx, t, "running qemu pid "+fmt.Sprint(pid), func() bool {
		st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		// The state follows the command name in parentheses.
		i := strings.LastIndexByte(string(st), ')')
		return i > 0 && strings.HasPrefix(string(st[i:]), ") T")
	})
}

// TestFaultGuestPanic crashes the guest kernel: pvpanic tells QEMU, which
// exits non-zero (-action panic=exit-failure); the container is reported
// exited with that code, the shim's log says why, and nothing is left.
func TestFaultGuestPanic(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*bootTimeout)
	defer cancel()
	p := newCRI(t, env.daemon).runPod(ctx, t, "panic")
	netns := p.netnsPath(ctx, t)
	vm := p.startVM(ctx, t, imageKernelWaitCRI, map[string]string{annotationKernelCmdline: "vmshim.mode=panic"})
	pid, err := pidOf("guest=" + vm.id) // QEMU runs on until the guest has booted
	if err != nil {
		t.Fatalf("qemu of %s: %v", vm.id, err)
	}
	st := vm.waitExited(ctx, t)
	vm.waitLog(ctx, t, markerPanic)
	vm.waitLog(ctx, t, kernelPanic)
	if st.ExitCode == 0 || st.Reason != "Error" {
		t.Errorf("after a guest panic: exit %d reason %q, want non-zero Error", st.ExitCode, st.Reason)
	}
	line := waitDaemonLog(ctx, t, env.daemon, logGuestPanic, fmt.Sprintf("pid=%d ", pid))
	if !strings.Contains(line, "level=error") {
		t.Errorf("guest panic not logged as an error: %s", line)
	}
	t.Logf("exit %d (%s); shim: %s", st.ExitCode, st.Reason, line)
	p.remove(t)
	assertPodGone(ctx, t, p, netns, vm.id)
}

// TestFaultContainerdRestartDuringBoot restarts containerd while a VM pod's
// guest is still booting: the guest boots on (same QEMU), its console
// reaches the CRI log through the restarted containerd, it gets its lease,
// powers off on a graceful stop and the pod goes without a trace.
func TestFaultContainerdRestartDuringBoot(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*bootTimeout)
	defer cancel()
	p := newCRI(t, env.daemon).runPod(ctx, t, "bootrestart")
	netns := p.netnsPath(ctx, t)
	// The disk guest boots through SeaBIOS: the slower boot leaves room
	// for the restart.
	vm := p.startVM(ctx, t, imageDiskWait, nil)
	qemu := processesMentioning("guest=" + vm.id)
	if _, booted := findLogLine(vm.log, markerBooted); booted {
		t.Fatalf("the guest booted before containerd could be restarted")
	}
	restart := time.Now()
	if err := env.daemon.restart(); err != nil {
		t.Fatalf("restart containerd: %v", err)
	}
	_, booted := findLogLine(vm.log, markerBooted)
	t.Logf("containerd restarted in %v; %s in the log right after: %v", time.Since(restart).Round(100*time.Millisecond), markerBooted, booted)
	p.c = newCRI(t, env.daemon) // vm.p is p
	if st := vm.status(ctx, t); st.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Errorf("after the restart: state %v, want running", st.State)
	}
	vm.waitLog(ctx, t, markerBooted)
	vm.waitLog(ctx, t, "VMSHIM-LEASE")
	if now := processesMentioning("guest=" + vm.id); len(now) != 1 || len(qemu) != 1 || now[0] != qemu[0] {
		t.Errorf("qemu before the restart %v, after %v", qemu, now)
	}
	vm.stop(ctx, t, 30)
	vm.waitLog(ctx, t, markerACPI)
	if st := vm.waitExited(ctx, t); st.ExitCode != 0 {
		t.Errorf("exit %d after ACPI stop, want 0", st.ExitCode)
	}
	p.remove(t)
	assertPodGone(ctx, t, p, netns, vm.id)
}

// assertPodGone checks, after RemovePodSandbox, that the pod's shim and
// pause process have ended, its netns is gone, and no process, mount,
// runtime dir or netns of the containers ids is left.
func assertPodGone(ctx context.Context, t *testing.T, p *pod, netns string, ids ...string) {
	t.Helper()
	waitGone(ctx, t, "shim of pod "+p.id, func() bool { return len(shimsOf(p.id)) == 0 })
	waitGone(ctx, t, "pause process of "+p.id, func() bool { return len(processesMentioning("vmshim-pause "+netns)) == 0 })
	assertNothingLeftCRI(t, append(ids, p.id)...)
	if _, err := os.Stat(netns); err == nil {
		t.Errorf("pod netns %s left", netns)
	}
	for _, id := range ids {
		if _, err := os.Stat(vmNetns(criNamespace, id)); err == nil {
			t.Errorf("network namespace left for %s", id)
		}
	}
}

// waitDaemonLog waits until a line of d's log contains every one of parts
// and returns it.
func waitDaemonLog(ctx context.Context, t *testing.T, d *daemon, parts ...string) string {
	t.Helper()
	for {
		if line, ok := findDaemonLog(d.logPath, parts...); ok {
			return line
		}
		select {
		case <-ctx.Done():
			t.Fatalf("containerd log never had a line with %q\ncontainerd log:\n%s", parts, d.logTail())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// findDaemonLog returns the first line of the log at path containing every
// one of parts; a line is matched with a space at its end, so a part such
// as "pid=42 " also matches a last field.
func findDaemonLog(path string, parts ...string) (string, bool) {
	f, err := os.Open(path)
	if err != nil {
		return "", false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
next:
	for sc.Scan() {
		for _, s := range parts {
			if !strings.Contains(sc.Text()+" ", s) {
				continue next
			}
		}
		return sc.Text(), true
	}
	return "", false
}

// smallLayerMiB is the size of the tmpfs the overlayfs snapshotter of
// TestFaultWritableLayerFull's daemon keeps image layers and writable
// layers on: room for the disk and cloud guests' layers.
const smallLayerMiB = 256

// TestFaultWritableLayerFull runs VMs whose writable layer, where the
// root disk's qcow2 overlay lives, has no room left: on a daemon whose
// snapshotter is on a small tmpfs, filled up once the image is unpacked.
func TestFaultWritableLayerFull(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*bootTimeout)
	defer cancel()
	d, err := startDaemon(os.Getenv(envContainerd), env.binDir, daemonOptions{snapshotterTmpfs: smallLayerMiB << 20})
	if err != nil {
		t.Fatalf("start daemon: %v", err)
	}
	t.Cleanup(d.stop)
	cl, err := client.New(d.address, client.WithDefaultNamespace(testNamespace))
	if err != nil {
		t.Fatalf("connect to containerd: %v", err)
	}
	t.Cleanup(func() { cl.Close() })
	for _, a := range []string{"disk-wait.tar", "disk-cloud.tar"} {
		if out, err := d.ctr(ctx, "images", "import", filepath.Join(env.guestDir, a)); err != nil {
			t.Fatalf("import %s: %v: %s", a, err, out)
		}
	}
	small := &smallLayer{d: d, client: cl}
	suite := &suite{daemon: d, client: cl}

	// No room for the overlay: create fails with one line naming it and
	// the cause, and leaves nothing behind.
	t.Run("create", func(t *testing.T) {
		small.fill(t)
		id := uniqueID(t)
		out, err := d.ctr(ctx, "run", "--rm", "--runtime", runtimeName, imageDiskWait, id)
		if err == nil {
			t.Fatalf("ctr run succeeded with a full writable layer:\n%s", out)
		}
		lines := errorLines(out)
		if len(lines) != 1 || !strings.Contains(lines[0], "overlay /") || !strings.Contains(lines[0], "No space left on device") {
			t.Errorf("want one line naming the overlay and ENOSPC, got:\n%s", out)
		}
		t.Logf("%s", strings.Join(lines, " / "))
		suite.assertNothingLeft(ctx, t, id)
	})

	// The overlay is made, then the layer fills up: the guest's first
	// write that needs room fails on the host, QEMU pauses the VM (its
	// default for ENOSPC on writes) and the shim logs why; the task shows
	// paused and the console says why. Once there is room again, a resume
	// lets the guest finish booting. SIGKILL ends it with 137 and nothing
	// is left.
	t.Run("runtime", func(t *testing.T) {
		id := uniqueID(t)
		evlog := subscribeTasksOn(ctx, t, cl)
		v, err := suite.createVM(ctx, t, id, imageDebianCloud, nil, nil)
		if err != nil {
			t.Fatalf("create task: %v\ncontainerd log:\n%s", err, d.logTail())
		}
		filler := small.fill(t)
		v.start(ctx, t)
		pid := int(v.task.Pid())
		line := waitDaemonLog(ctx, t, d, logDiskIOError, fmt.Sprintf("pid=%d ", pid))
		for _, want := range []string{"level=error", "nospace=true", "operation=write", "action=stop"} {
			if !strings.Contains(line, want) {
				t.Errorf("disk error line lacks %q: %s", want, line)
			}
		}
		t.Logf("shim: %s", line)
		v.console.waitFor(ctx, t, "write failed: No space left on device; it resumes when the task is resumed")
		if st, err := v.task.Status(ctx); err != nil || st.Status != client.Paused {
			t.Fatalf("task status with the VM paused by QEMU: %v, %v; want paused", st.Status, err)
		}
		if err := os.Remove(filler); err != nil {
			t.Fatal(err)
		}
		if err := v.task.Resume(ctx); err != nil {
			t.Fatalf("resume once there is room: %v", err)
		}
		v.console.waitFor(ctx, t, markerCloudInitDone)
		if st, err := v.task.Status(ctx); err != nil || st.Status != client.Running {
			t.Errorf("task status after the resume: %v, %v; want running", st.Status, err)
		}
		if err := v.task.Kill(ctx, syscall.SIGKILL); err != nil {
			t.Fatalf("kill SIGKILL: %v", err)
		}
		if code := v.waitExit(ctx, t); code != 137 {
			t.Errorf("exit status %d, want 137", code)
		}
		v.remove(t)
		suite.assertNothingLeft(ctx, t, id)
		got := evlog.until(ctx, t, id)
		t.Logf("events: %v", got)
		paused, resumed := slices.Index(got, "/tasks/paused"), slices.Index(got, "/tasks/resumed")
		if paused < 0 || resumed < paused {
			t.Errorf("want /tasks/paused, then /tasks/resumed: %v", got)
		}
	})
}

// smallLayer is TestFaultWritableLayerFull's daemon, whose snapshotter
// root is a tmpfs.
type smallLayer struct {
	d      *daemon
	client *client.Client
}

// root is the snapshotter's root, the tmpfs.
func (s *smallLayer) root() string {
	return filepath.Join(s.d.dir, "root", "io.containerd.snapshotter.v1.overlayfs")
}

// fill takes all but a few pages of the tmpfs's free room (some is left
// for the snapshotter's own metadata), until the test ends or the file
// it returns is removed.
func (s *smallLayer) fill(t *testing.T) string {
	t.Helper()
	const slack = 64 << 10 // less than a qcow2 overlay's 384 KiB of metadata
	var st syscall.Statfs_t
	if err := syscall.Statfs(s.root(), &st); err != nil {
		t.Fatal(err)
	}
	free := int64(st.Bavail) * st.Bsize
	path := filepath.Join(s.root(), "filler")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(path) })
	defer f.Close()
	if free > slack {
		if err := syscall.Fallocate(int(f.Fd()), 0, 0, free-slack); err != nil {
			t.Fatalf("fill the writable layer's tmpfs: %v", err)
		}
	}
	t.Logf("writable layer: %d KiB free of %d MiB", slack>>10, smallLayerMiB)
	return path
}
