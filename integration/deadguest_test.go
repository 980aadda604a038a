package integration

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// A dead guest: what the shim writes as the log's last line, and the
// kernel command lines that make the test guests die.
const (
	deadLine = "vmshim: the guest is dead, its vm stopped: "
	// earlyPanic makes the kernel guest panic before its init runs, and
	// so before any driver loads (pvpanic's among them): the kernel
	// finds no init in its initramfs and no root device.
	earlyPanic      = "rdinit=/vmshim-no-init"
	earlyPanicLine  = "Kernel panic - not syncing: VFS: Unable to mount root fs"
	earlyPanicDeath = deadLine + "kernel panic: VFS: Unable to mount root fs"
	// resetLoop makes the kernel guest's init reboot at once, over and
	// over, as a guest that triple-faults in its boot resets.
	resetLoopCmdline = "rdinit=/bin/reboot -- -f"
)

// TestDeadGuestPanicEarly boots a guest that panics before any driver
// loads, so that pvpanic never tells QEMU: the shim sees the panic on the
// console, stops the VM, and the container exits 1 with the panic as the
// log's last line; nothing is left.
func TestDeadGuestPanicEarly(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*bootTimeout)
	defer cancel()
	p := newCRI(t, env.daemon).runPod(ctx, t, "panicearly")
	netns := p.netnsPath(ctx, t)
	vm := p.startVM(ctx, t, imageKernelWait, map[string]string{annotationKernelCmdline: earlyPanic})
	vm.waitLog(ctx, t, earlyPanicLine)
	panicAt := time.Now()
	waitDead(ctx, t, vm, earlyPanicDeath, "the panic line reached the log", panicAt)
	if line, ok := findLogLine(vm.log, "VMSHIM-GUEST-BOOTED"); ok {
		t.Errorf("the guest booted: %s", line)
	}
	p.remove(t)
	assertPodGone(ctx, t, p, netns, vm.id)
}

// TestDeadGuestHalted: lines that merely quote a panic or a halt, and a
// panic line alone (on the console, through the kernel's log), leave the
// guest running; a guest that halts (halt -f: every vCPU stopped, nothing
// for QEMU to report) is stopped, and the container exits 1 saying so.
func TestDeadGuestHalted(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*bootTimeout)
	defer cancel()
	p := newCRI(t, env.daemon).runPod(ctx, t, "halted")
	netns := p.netnsPath(ctx, t)
	vm := p.startVM(ctx, t, imageKernelAgent, nil)
	vm.waitLog(ctx, t, markerAgent)
	quotes := []string{
		"systemd-journald[1]: previous boot ended with Kernel panic - not syncing: quoted",
		"[    5.000000] audit: Kernel panic - not syncing: quoted",
		"note: reboot: System halted",
		"Kernel panic - not syncing",
		"Kernel panic - not syncing: a panic line alone, with no report after it",
		"VMSHIM-QUOTES-DONE",
	}
	script := ""
	for _, q := range quotes {
		script += fmt.Sprintf("echo '%s' > /dev/ttyS0; ", q)
	}
	script += "echo 'Kernel panic - not syncing: quoted into the kernel log' > /dev/kmsg"
	vm.mustExec(ctx, t, "sh", "-c", script)
	vm.waitLog(ctx, t, "VMSHIM-QUOTES-DONE")
	time.Sleep(5 * time.Second) // longer than the shim waits before it stops a dead guest
	if st := vm.status(ctx, t); st.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("after lines that quote a panic: state %v, want running", st.State)
	}
	if out := vm.mustExec(ctx, t, "echo", "alive"); !strings.Contains(out, "alive") {
		t.Fatalf("exec after the quotes: %q", out)
	}
	halt := time.Now()
	if _, err := vm.execSync(ctx, t, 10, "halt", "-f"); err != nil {
		t.Logf("halt -f: %v (the guest halted under it)", err)
	}
	waitDead(ctx, t, vm, deadLine+"the guest halted", "halt -f", halt)
	p.remove(t)
	assertPodGone(ctx, t, p, netns, vm.id)
}

// TestDeadGuestResetLoop boots a guest whose init reboots at once: QEMU
// resets it each time, and the fifth reset within a minute makes the
// shim stop it.
func TestDeadGuestResetLoop(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*bootTimeout)
	defer cancel()
	p := newCRI(t, env.daemon).runPod(ctx, t, "resetloop")
	netns := p.netnsPath(ctx, t)
	start := time.Now()
	vm := p.startVM(ctx, t, imageKernelWait, map[string]string{annotationKernelCmdline: resetLoopCmdline})
	waitDead(ctx, t, vm, deadLine+"reset loop: the guest reset 5 times", "its start", start)
	p.remove(t)
	assertPodGone(ctx, t, p, netns, vm.id)
}

// waitDead waits for the container of a guest that died to exit, and
// checks it exited 1 with a log whose last line starts with want; it logs
// how long after since (what happened then) it exited.
func waitDead(ctx context.Context, t *testing.T, vm *criContainer, want, what string, since time.Time) {
	t.Helper()
	st := vm.waitExited(ctx, t)
	t.Logf("exited %v after %s: exit %d, reason %q", time.Since(since).Round(100*time.Millisecond), what, st.ExitCode, st.Reason)
	if st.ExitCode != 1 || st.Reason != "Error" {
		t.Errorf("exit %d reason %q, want 1 Error", st.ExitCode, st.Reason)
	}
	if last := lastLogLine(t, vm.log); !strings.HasPrefix(last, want) {
		t.Errorf("last log line %q, want it to start with %q", last, want)
	}
}

// lastLogLine is the content of a CRI log's last line that has any.
func lastLogLine(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	last := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), " ", 4)
		if len(parts) == 4 {
			if s := strings.TrimRight(parts[3], "\r"); strings.TrimSpace(s) != "" {
				last = s
			}
		}
	}
	return last
}

// testDeadGuest: a VM pod whose guest panics before any driver loads is
// restarted by the kubelet, as its restartPolicy says, and its last
// termination shows why: exit 1, with the shim's line naming the panic
// as the termination message (FallbackToLogsOnError), in the pod's
// status and in kubectl describe.
func (k *kubeCluster) testDeadGuest(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), kubeTimeout)
	defer cancel()
	pod := vmPod("deadguest", imageKernelWait)
	pod.Annotations = map[string]string{annotationKernelCmdline: earlyPanic}
	pod.Spec.RestartPolicy = corev1.RestartPolicyAlways
	pod.Spec.Containers[0].TerminationMessagePolicy = corev1.TerminationMessageFallbackToLogsOnError
	start := time.Now()
	k.createPod(ctx, t, pod)
	p := k.waitPod(ctx, t, pod.Name, "restarted after its guest died", func(p *corev1.Pod) bool {
		return len(p.Status.ContainerStatuses) > 0 && p.Status.ContainerStatuses[0].RestartCount >= 1 &&
			p.Status.ContainerStatuses[0].LastTerminationState.Terminated != nil
	})
	cs := p.Status.ContainerStatuses[0]
	last := cs.LastTerminationState.Terminated
	t.Logf("restart count %d after %v; last termination: exit %d, reason %s, message:\n%s",
		cs.RestartCount, time.Since(start).Round(time.Second), last.ExitCode, last.Reason, last.Message)
	if last.ExitCode != 1 || last.Reason != "Error" {
		t.Errorf("last termination: exit %d reason %q, want 1 Error", last.ExitCode, last.Reason)
	}
	if !strings.Contains(last.Message, earlyPanicDeath) {
		t.Errorf("termination message lacks %q:\n%s", earlyPanicDeath, last.Message)
	}
	out, err := k.kubectlOK(ctx, "-n", kubeNamespace, "describe", "pod", pod.Name)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, earlyPanicDeath) {
		t.Errorf("kubectl describe pod lacks %q:\n%s", earlyPanicDeath, out)
	}
	k.deletePods(ctx, t, pod.Name)
}
