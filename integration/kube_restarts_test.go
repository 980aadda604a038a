package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// The restarts-under-load test: VM pods running while containerd and
// the kubelet restart and one pod's shim is killed.
const (
	// kubeLoadPods is how many plain VM pods run (load-0, load-1, ...);
	// with the suspending VM, the node runs one more.
	kubeLoadPods = 9
	// kubeLongExecs is how many of them have an exec in flight across
	// each restart (the first ones).
	kubeLongExecs = 3
	// kubeRestartsApp names the StatefulSet of the VM that suspends on
	// stop, its volume and its StorageClass.
	kubeRestartsApp = "vm-restarts"
	// kubeLongExecSleep is how long a long exec's command sleeps in the
	// guest: long enough to be in flight when a restart comes.
	kubeLongExecSleep = 20
	// kubeExecTimeout bounds one `kubectl exec` of a short command.
	kubeExecTimeout = 30 * time.Second
	// kubeLeftBound bounds how long what a killed shim's pod held may
	// take to go once the pod is Ready again.
	kubeLeftBound = time.Minute
	// kubePhaseTimeout bounds each phase of the test.
	kubePhaseTimeout = 3 * time.Minute
)

// runningVM is what a VM pod of the test is known to run: the same pod,
// container and QEMU, and a guest up for at least up seconds, until the
// test changes it.
type runningVM struct {
	name     string
	uid      types.UID
	ctr      string // the CRI id of its container
	qemu     string // the pid of its QEMU
	up       float64
	restarts int
	logWant  string // a line its container's log holds
}

// testRestartsUnderLoad runs ten VM pods (nine plain ones and a
// StatefulSet's VM that suspends on stop) and, under that load:
//
//   - restarts containerd while three pods run a long exec and the
//     StatefulSet's pod is being deleted, its VM saving its state;
//   - restarts the kubelet while three pods run a long exec;
//   - kills one pod's shim.
//
// After each restart every VM is the one that ran before (same
// container and QEMU, no restart, its guest's uptime grown) and answers
// exec, logs, port-forward and HTTP on its pod IP. The long execs'
// commands run to their end in the guest across containerd's restart;
// across the kubelet's, containerd ends them (longExecsEnded), and the
// test logs how. The StatefulSet's next pod resumes the saved state.
// After the kill the kubelet brings the pod
// back with a new sandbox and container, and nothing of the old ones is
// left; the other VMs run on untouched. Once everything is deleted the
// node is as it was before.
func (k *kubeCluster) testRestartsUnderLoad(t *testing.T) {
	began := time.Now()
	var timeline []string
	mark := func(what string) {
		timeline = append(timeline, fmt.Sprintf("%6.1f s  %s", time.Since(began).Seconds(), what))
	}
	defer func() { t.Logf("timeline:\n%s", strings.Join(timeline, "\n")) }()
	before := k.node.state(t)

	vms := k.startLoad(t)
	mark(fmt.Sprintf("%d VM pods Ready", len(vms)))
	var ok bool
	vms, ok = k.containerdRestart(t, vms, mark)
	if !ok {
		return
	}
	if !t.Run("KubeletRestart", func(t *testing.T) { k.kubeletRestart(t, vms, mark) }) {
		return
	}
	if !t.Run("ShimKilled", func(t *testing.T) { k.shimKilled(t, vms, mark) }) {
		return
	}

	ctx, cancel := context.WithTimeout(context.Background(), kubePhaseTimeout)
	defer cancel()
	var names []string
	for i := range kubeLoadPods {
		names = append(names, fmt.Sprintf("load-%d", i))
	}
	fg := metav1.DeletePropagationForeground
	if err := k.client.AppsV1().StatefulSets(kubeNamespace).Delete(ctx, kubeRestartsApp, metav1.DeleteOptions{PropagationPolicy: &fg}); err != nil {
		t.Errorf("delete statefulset %s: %v", kubeRestartsApp, err)
	}
	k.deletePods(ctx, t, names...)
	var after nodeState
	err := k.poll(ctx, "the pods to go and the node to be as it was", time.Second, func() (bool, error) {
		left, err := k.client.CoreV1().Pods(kubeNamespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		after = k.node.state(t)
		return len(left.Items) == 0 && after.equal(before), nil
	})
	if err != nil {
		t.Errorf("after deleting every pod: %v; what the node holds that it did not before:\n%s", err, after.diff(before))
	}
	mark("every pod deleted, the node as it was")
}

// startLoad starts the nine plain VM pods and the StatefulSet of one VM
// that suspends on stop, waits until all ten are Ready, and returns what
// each runs.
func (k *kubeCluster) startLoad(t *testing.T) []*runningVM {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), burstReadyBound(kubeLoadPods+1))
	defer cancel()
	var names []string
	for i := range kubeLoadPods {
		pod := vmPod(fmt.Sprintf("load-%d", i), imageKernelAgent)
		pod.Spec.Containers[0].ReadinessProbe = httpProbe(8080)
		k.createPod(ctx, t, pod)
		names = append(names, pod.Name)
	}
	k.localVolume(ctx, t, kubeRestartsApp, k.restartsVolume(), k.node.name)
	k.statefulSet(ctx, t, kubeRestartsApp)
	names = append(names, kubeRestartsApp+"-0")
	var vms []*runningVM
	for _, name := range names {
		vm := k.runningVM(ctx, t, k.waitPod(ctx, t, name, "Ready", podReady))
		vm.logWant = markerBooted
		if name == kubeRestartsApp+"-0" {
			vm.logWant = "VMSHIM-DISK-BOOTS"
		}
		vms = append(vms, vm)
	}
	return vms
}

// restartsVolume is the directory of the suspending VM's volume.
func (k *kubeCluster) restartsVolume() string {
	return filepath.Join(k.dir, "volumes", kubeRestartsApp)
}

// runningVM reads what pod p runs: its container, QEMU and guest uptime.
func (k *kubeCluster) runningVM(ctx context.Context, t *testing.T, p *corev1.Pod) *runningVM {
	t.Helper()
	vm := &runningVM{name: p.Name, uid: p.UID, ctr: containerID(p), restarts: restarts(p)}
	vm.qemu = qemuOf(vm.ctr)
	if vm.qemu == "" {
		t.Fatalf("pod %s: no QEMU runs its container %s", p.Name, vm.ctr)
	}
	vm.up = k.guestUptime(ctx, t, p.Name)
	return vm
}

// qemuOf returns the pid of the QEMU that runs container id, "" if none.
func qemuOf(id string) string {
	for _, p := range vmProcesses() {
		if p.kind == "qemu" && strings.Contains(p.args, "guest="+id+",") {
			return p.pid
		}
	}
	return ""
}

// containerdRestart restarts containerd while the first kubeLongExecs
// pods run a long exec and the StatefulSet's pod is being deleted, its
// VM saving its state on its volume. Every other VM must run on as it
// was, the long execs' commands run to their end, and the StatefulSet's
// next pod resume the saved VM, which it returns in the old one's place.
func (k *kubeCluster) containerdRestart(t *testing.T, vms []*runningVM, mark func(string)) ([]*runningVM, bool) {
	var resumed *runningVM
	ok := t.Run("ContainerdRestart", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), kubePhaseTimeout)
		defer cancel()
		suspending := vms[len(vms)-1]
		const marker = "vmshim-marker-in-ram"
		k.guestExec(ctx, t, suspending.name, "sh", "-c", "echo "+marker+" >/run/marker")
		first, err := k.client.CoreV1().Pods(kubeNamespace).Get(ctx, suspending.name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		sandbox := k.node.sandboxID(ctx, t, string(first.UID))
		execs := k.startLongExecs(ctx, t, "containerd", vms[:kubeLongExecs])
		mark("long execs in flight")

		// The kubelet stops the deleted pod's container: the shim pauses
		// the VM and writes its state on the volume, in the background of
		// containerd's stop call. containerd is restarted once the save
		// has begun.
		terminated := k.watchTerminated(ctx, t, first)
		if err := k.client.CoreV1().Pods(kubeNamespace).Delete(ctx, first.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatalf("delete pod %s: %v", first.Name, err)
		}
		vol := k.restartsVolume()
		var saving string
		if err := k.poll(ctx, "the save of "+first.Name+" to begin", 10*time.Millisecond, func() (bool, error) {
			for _, f := range []string{"vmshim-state.part", "vmshim-state"} {
				if _, err := os.Stat(filepath.Join(vol, f)); err == nil {
					saving = f
					return true, nil
				}
			}
			return false, nil
		}); err != nil {
			t.Fatalf("%v\n%s", err, k.describe(first.Name, first))
		}
		mark("the suspending VM's save began (" + saving + " on its volume)")
		restarted := time.Now()
		if err := k.node.daemon.restart(); err != nil {
			t.Fatalf("restart containerd: %v\n%s", err, k.node.daemon.logTail())
		}
		mark("containerd restarted")
		t.Logf("containerd was stopped once %s was on the volume", saving)

		for _, vm := range vms[:len(vms)-1] {
			t.Run(vm.name, func(t *testing.T) { k.runsOn(ctx, t, vm) })
		}
		mark("the 9 other VMs checked")
		k.longExecsRanOn(ctx, t, execs, restarted)
		mark("the long execs' commands ended")

		select {
		case cs := <-terminated:
			if cs == nil {
				t.Errorf("pod %s: its container was never seen terminated", first.Name)
			} else if cs.ExitCode != 0 {
				t.Errorf("pod %s: the suspended VM exited %d (%s: %s), want 0", first.Name, cs.ExitCode, cs.Reason, cs.Message)
			}
		case <-ctx.Done():
			t.Errorf("pod %s: the watch never saw it deleted", first.Name)
		}
		second := k.waitPod(ctx, t, first.Name, "Ready again", func(p *corev1.Pod) bool { return p.UID != first.UID && podReady(p) })
		logs, err := k.kubectlOK(ctx, "-n", kubeNamespace, "logs", second.Name)
		if err != nil {
			t.Fatal(err)
		}
		resumedLine := "vmshim: resumed the state saved on volume /data"
		if line := lineWith(logs, resumedLine); line == "" {
			t.Errorf("pod %s: the next pod did not resume the saved state:\n%s", second.Name, logs)
		} else {
			t.Logf("%s", line)
		}
		if got := strings.TrimSpace(k.guestExec(ctx, t, second.Name, "cat", "/run/marker")); got != marker {
			t.Errorf("pod %s: the marker in the guest's RAM is %q, want %q", second.Name, got, marker)
		}
		if _, err := os.Stat(filepath.Join(vol, "vmshim-state")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("pod %s: the state is still on the volume after the resume: %v", second.Name, err)
		}
		// Ready comes from the guest agent; the guest takes the new
		// pod's address once its carrier is back and its lease renewed,
		// and the checks after each restart reach it there.
		k.waitGuestAddress(ctx, t, second.Name, second.Status.PodIP, first.Status.PodIP)
		resumed = k.runningVM(ctx, t, second)
		resumed.logWant = resumedLine
		if resumed.up < suspending.up {
			t.Errorf("pod %s: guest uptime %.1f s, %.1f s before the save: it booted again", second.Name, resumed.up, suspending.up)
		}
		k.assertPodGone(ctx, t, k.node, string(first.UID), sandbox, suspending.ctr)
		mark("the StatefulSet's next pod resumed the saved VM")
	})
	if !ok || resumed == nil {
		return vms, false
	}
	return append(slices.Clone(vms[:len(vms)-1]), resumed), true
}

// kubeletRestart restarts the kubelet while the first kubeLongExecs pods
// run a long exec: every VM must run on as it was once the new kubelet
// serves exec, and each long exec's shell must be gone from its guest
// (containerd ends it when its stream goes with the kubelet).
func (k *kubeCluster) kubeletRestart(t *testing.T, vms []*runningVM, mark func(string)) {
	ctx, cancel := context.WithTimeout(context.Background(), kubePhaseTimeout)
	defer cancel()
	execs := k.startLongExecs(ctx, t, "kubelet", vms[:kubeLongExecs])
	mark("long execs in flight")
	restarted := time.Now()
	if err := k.restartKubelet(k.node); err != nil {
		t.Fatalf("restart the kubelet: %v", err)
	}
	if err := k.waitNodeReady(ctx, k.node.name); err != nil {
		t.Fatalf("%v\n%s", err, k.logTail(k.node.stem, 3000))
	}
	for _, vm := range vms {
		k.waitExec(ctx, t, vm.name)
	}
	mark("the kubelet restarted, exec answers in every pod")
	for _, vm := range vms {
		t.Run(vm.name, func(t *testing.T) { k.runsOn(ctx, t, vm) })
	}
	mark("the 10 VMs checked")
	k.longExecsEnded(ctx, t, execs, restarted)
	mark("the long execs' shells gone")
}

// waitExec waits until `kubectl exec` of the pod answers: a kubelet
// that has just started serves a pod's exec only once it has the pod
// from the API server ("pod does not exist" before).
func (k *kubeCluster) waitExec(ctx context.Context, t *testing.T, pod string) {
	t.Helper()
	last, err := k.pollExec(ctx, "kubectl exec of pod "+pod+" to answer", pod, exitedZero, "true")
	if err != nil {
		t.Fatalf("%v: last exec: %s\n--- kubelet log:\n%s", err, last, k.logTail(k.node.stem, 3000))
	}
}

// shimKilled kills the shim of the last plain VM pod with SIGKILL. The
// kubelet must bring the pod back, Ready, with a new sandbox and
// container; the old sandbox's QEMU, shim, pause process, network
// namespace, cgroups, jail claims and runtime dirs must go; the other
// VMs run on untouched.
func (k *kubeCluster) shimKilled(t *testing.T, vms []*runningVM, mark func(string)) {
	ctx, cancel := context.WithTimeout(context.Background(), kubePhaseTimeout)
	defer cancel()
	n := k.node
	victim := vms[kubeLoadPods-1]
	sandbox := n.sandboxID(ctx, t, string(victim.uid))
	netns := n.sandboxNetns(ctx, t, sandbox)
	if netns == "" {
		t.Fatalf("pod %s: sandbox %s has no network namespace path in its status", victim.name, sandbox)
	}
	shims := shimsOf(sandbox)
	if len(shims) != 1 {
		t.Fatalf("pod %s: the shims of sandbox %s: %v, want one", victim.name, sandbox, shims)
	}
	pid, _, _ := strings.Cut(shims[0], ":")
	shim, err := strconv.Atoi(pid)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(shim, syscall.SIGKILL); err != nil {
		t.Fatalf("kill the shim of pod %s (pid %d): %v", victim.name, shim, err)
	}
	mark(fmt.Sprintf("the shim of %s killed", victim.name))

	p := k.waitPod(ctx, t, victim.name, "Ready in a new container", func(p *corev1.Pod) bool {
		return containerID(p) != victim.ctr && podReady(p)
	})
	mark(fmt.Sprintf("%s Ready again", victim.name))
	now := n.readySandbox(ctx, t, string(victim.uid))
	t.Logf("pod %s: the kubelet made sandbox %s and container %s for it (restart count %d); they were %s and %s",
		p.Name, now, containerID(p), restarts(p), sandbox, victim.ctr)
	if p.UID != victim.uid || now == sandbox {
		t.Errorf("pod %s: uid %s sandbox %s, want uid %s in a new sandbox (not %s)", p.Name, p.UID, now, victim.uid, sandbox)
	}
	if restarts(p) != victim.restarts+1 {
		t.Errorf("pod %s: restart count %d, want %d", p.Name, restarts(p), victim.restarts+1)
	}
	var left []string
	goneCtx, cancelGone := context.WithTimeout(ctx, kubeLeftBound)
	defer cancelGone()
	err = k.poll(goneCtx, "what the killed shim's pod held to go", 500*time.Millisecond, func() (bool, error) {
		left = n.heldBy(t, netns, sandbox, victim.ctr)
		return len(left) == 0, nil
	})
	if err != nil {
		t.Errorf("pod %s: %v; left of sandbox %s and container %s:\n%s", victim.name, err, sandbox, victim.ctr, strings.Join(left, "\n"))
	}
	mark("nothing of the old sandbox left")

	for _, vm := range vms {
		if vm == victim {
			continue
		}
		t.Run(vm.name, func(t *testing.T) { k.runsOn(ctx, t, vm) })
	}
	*victim = *k.runningVM(ctx, t, p)
	victim.logWant = markerBooted
	t.Run(victim.name, func(t *testing.T) { k.runsOn(ctx, t, victim) })
	mark("the 10 VMs checked")
}

// heldBy lists what node n still holds of a sandbox and its containers
// (ids): processes naming them (QEMU, shim; the pause process names the
// network namespace), the network namespace at netns, cgroups, mounts,
// runtime dirs and jail claims.
func (n *kubeNode) heldBy(t *testing.T, netns string, ids ...string) []string {
	t.Helper()
	var left []string
	for _, p := range processesMentioning(netns) {
		left = append(left, "process "+p)
	}
	if _, err := os.Lstat(netns); !errors.Is(err, os.ErrNotExist) {
		left = append(left, fmt.Sprintf("network namespace %s (%v)", netns, err))
	}
	claims := jailClaims(t)
	for _, id := range ids {
		for _, p := range processesMentioning(id) {
			left = append(left, "process "+p)
		}
		for _, dir := range n.cgroupsLeft() {
			if filepath.Base(dir) == id {
				left = append(left, "cgroup "+dir)
			}
		}
		for _, dir := range []string{n.daemon.dir, n.rootDir} {
			for _, m := range mountsUnder(dir) {
				// containerd's CRI keeps its record of the old sandbox,
				// its /dev/shm mount among it, until the kubelet removes
				// the sandbox: only with the pod, as the sandbox holds the
				// dead container the kubelet keeps for `logs --previous`.
				// The node's state once the pods are deleted covers it.
				if strings.HasSuffix(m, "/sandboxes/"+id+"/shm") {
					continue
				}
				if strings.Contains(m, id) {
					left = append(left, "mount "+m)
				}
			}
		}
		if _, err := os.Stat(shimRuntimeDir(criNamespace, id)); err == nil {
			left = append(left, "runtime dir "+shimRuntimeDir(criNamespace, id))
		}
		if jid, ok := claims[criNamespace+"/"+id]; ok {
			left = append(left, "jail id "+jid)
		}
	}
	return left
}

// runsOn checks that vm runs on as it ran: its pod Ready, with the same
// uid, container and restart count, the same QEMU, and a guest whose
// uptime grew since the last look (it did not boot again); and that
// exec, logs, port-forward and HTTP on its pod IP reach it. It records
// the uptime.
func (k *kubeCluster) runsOn(ctx context.Context, t *testing.T, vm *runningVM) {
	t.Helper()
	p := k.waitPod(ctx, t, vm.name, "Ready", podReady)
	if p.UID != vm.uid || containerID(p) != vm.ctr || restarts(p) != vm.restarts {
		t.Errorf("pod %s: uid %s, container %s, %d restarts; want %s, %s, %d", vm.name, p.UID, containerID(p), restarts(p), vm.uid, vm.ctr, vm.restarts)
	}
	if q := qemuOf(vm.ctr); q != vm.qemu {
		t.Errorf("pod %s: QEMU pid %q, want %s (the one that ran before)", vm.name, q, vm.qemu)
	}
	up := k.guestUptime(ctx, t, vm.name)
	if up <= vm.up {
		t.Errorf("pod %s: guest uptime %.1f s, %.1f s before: the guest booted again", vm.name, up, vm.up)
	}
	vm.up = up
	logs, err := k.kubectlOK(ctx, "-n", kubeNamespace, "logs", vm.name)
	if err != nil {
		t.Errorf("pod %s: %v", vm.name, err)
	} else if lineWith(logs, vm.logWant) == "" {
		t.Errorf("pod %s: kubectl logs has no %q:\n%s", vm.name, vm.logWant, logs)
	}
	// The guest wrote its page at boot with the address it had then: a
	// resumed one keeps its first pod's, and answers on its new one.
	want := "VMSHIM-HTTP-OK " + vm.name + " "
	k.portForward(ctx, t, vm.name, want)
	if body := k.httpGet(ctx, t, p.Status.PodIP, 8080); !strings.Contains(body, want) {
		t.Errorf("pod %s: http://%s:8080/ served %q, want %q", vm.name, p.Status.PodIP, body, want)
	}
}

// longExec is a `kubectl exec` whose command runs in the guest for
// kubeLongExecSleep seconds, in flight across a restart. The command
// leaves /run/MARK.started in the guest when it starts and /run/MARK.done
// when it ends.
type longExec struct {
	pod, mark string
	out       *consoleOut
	ended     chan struct{} // closed when kubectl has ended, with err
	err       error
	at        time.Time // when kubectl ended
}

// startLongExecs starts a long exec in each VM and waits until each
// command runs in its guest.
func (k *kubeCluster) startLongExecs(ctx context.Context, t *testing.T, mark string, vms []*runningVM) []*longExec {
	t.Helper()
	var execs []*longExec
	for _, vm := range vms {
		e := &longExec{pod: vm.name, mark: "vmshim-long-exec-" + mark, out: newConsoleOut(), ended: make(chan struct{})}
		cmd := fmt.Sprintf("touch /run/%[1]s.started; sleep %[2]d; touch /run/%[1]s.done; echo VMSHIM-EXEC-DONE", e.mark, kubeLongExecSleep)
		done := k.startKubectl(t, nil, e.out, "-n", kubeNamespace, "exec", vm.name, "--", "sh", "-c", cmd)
		go func() {
			e.err = <-done
			e.at = time.Now()
			close(e.ended)
		}()
		execs = append(execs, e)
	}
	for _, e := range execs {
		k.waitGuestFile(ctx, t, e.pod, "/run/"+e.mark+".started", "the long exec to start")
	}
	return execs
}

// longExecsRanOn waits until each long exec's command has run to its
// end in the guest, and logs how its kubectl ended, and when.
//
// containerd's CRI runs an exec for the stream its streaming server
// serves, and the stream goes with containerd: kubectl ends at once, with
// exit 0 and no output, as the kubelet closes the stream without a
// status. Nothing kills the exec: the shim runs it to its end, and drops
// its output when no reader of its fifos comes (the new containerd knows
// nothing of it).
func (k *kubeCluster) longExecsRanOn(ctx context.Context, t *testing.T, execs []*longExec, restarted time.Time) {
	t.Helper()
	for _, e := range execs {
		k.waitGuestFile(ctx, t, e.pod, "/run/"+e.mark+".done", "the long exec's command to run to its end")
		t.Logf("pod %s: the long exec's command ran to its end in the guest; %s", e.pod, e.kubectlEnd(restarted))
	}
}

// longExecsEnded waits until each long exec's shell has gone from the
// guest, and logs whether it ran to its end and how its kubectl ended.
//
// When the kubelet goes, its stream to containerd's streaming server
// goes with it, and containerd's CRI ends the exec whose client went
// away: its Kill fails on the cancelled context ("failed to kill exec
// …: context canceled"), and its deferred Delete with WithProcessKill
// sends SIGKILL, which the shim passes to the shell in the guest (its
// sleep, a child, runs on to its end, as a runc container's would).
// kubectl sees the stream close abnormally, or, through the API
// server's stream translation, waits on.
func (k *kubeCluster) longExecsEnded(ctx context.Context, t *testing.T, execs []*longExec, restarted time.Time) {
	t.Helper()
	for _, e := range execs {
		// The pattern's brackets keep the check's own command line from
		// matching it.
		shell := strings.Replace(e.mark+".done", ".done", "[.]done", 1)
		last, err := k.pollExec(ctx, fmt.Sprintf("pod %s: the long exec's shell to go", e.pod), e.pod,
			func(out string, code int) bool { return code == 0 && strings.TrimSpace(out) == "" },
			"sh", "-c", "grep -ls '"+shell+"' /proc/[0-9]*/cmdline; exit 0")
		if err != nil {
			t.Errorf("%v: last exec: %s", err, last)
			continue
		}
		out, _, code := k.kubectlRun(ctx, "", "-n", kubeNamespace, "exec", e.pod, "--", "sh", "-c", "test -e /run/"+e.mark+".done && echo ran")
		how := "was killed before its end"
		if code == 0 && strings.Contains(out, "ran") {
			how = "ran to its end"
		}
		t.Logf("pod %s: the long exec's command %s; %s", e.pod, how, e.kubectlEnd(restarted))
	}
}

// kubectlEnd says how and when, from restarted, the long exec's kubectl
// ended, or that it runs on.
func (e *longExec) kubectlEnd(restarted time.Time) string {
	select {
	case <-e.ended:
		return fmt.Sprintf("its kubectl ended %.1f s after the restart: %v; stdout %q", e.at.Sub(restarted).Seconds(), e.err, e.out.String())
	default:
		return fmt.Sprintf("its kubectl runs on %.1f s after the restart; stdout %q", time.Since(restarted).Seconds(), e.out.String())
	}
}

// waitGuestFile waits until path exists in the pod's guest.
func (k *kubeCluster) waitGuestFile(ctx context.Context, t *testing.T, pod, path, what string) {
	t.Helper()
	if last, err := k.pollExec(ctx, fmt.Sprintf("pod %s: %s (%s)", pod, what, path), pod, exitedZero, "test", "-e", path); err != nil {
		t.Errorf("%v: last exec: %s", err, last)
	}
}

// pollExec runs `kubectl exec POD -- ARGV` every half second, each run
// within kubeExecTimeout, until done holds for its stdout and exit code;
// it returns the last run's exit code and output, for a failure's
// message.
func (k *kubeCluster) pollExec(ctx context.Context, what, pod string, done func(out string, code int) bool, argv ...string) (string, error) {
	var last string
	err := k.poll(ctx, what, 500*time.Millisecond, func() (bool, error) {
		cctx, cancel := context.WithTimeout(ctx, kubeExecTimeout)
		defer cancel()
		out, errOut, code := k.kubectlRun(cctx, "", append([]string{"-n", kubeNamespace, "exec", pod, "--"}, argv...)...)
		last = fmt.Sprintf("exit %d %s%s", code, out, errOut)
		return done(out, code), nil
	})
	return last, err
}

// exitedZero is pollExec's done for a command that must succeed.
func exitedZero(_ string, code int) bool { return code == 0 }

// readySandbox returns the id of pod uid's one ready sandbox on node n.
func (n *kubeNode) readySandbox(ctx context.Context, t *testing.T, uid string) string {
	t.Helper()
	list, err := n.cri.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{
		LabelSelector: map[string]string{"io.kubernetes.pod.uid": uid},
		State:         &runtimeapi.PodSandboxStateValue{State: runtimeapi.PodSandboxState_SANDBOX_READY},
	}})
	if err != nil || len(list.Items) != 1 {
		t.Fatalf("ready sandboxes of pod %s: %v, %v", uid, list, err)
	}
	return list.Items[0].Id
}
