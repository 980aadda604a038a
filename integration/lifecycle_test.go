package integration

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// shimsOf lists the shim processes serving containerd task id.
func shimsOf(id string) []string {
	var out []string
	for _, p := range processesMentioning("containerd-shim-vm-v2 ") {
		if strings.Contains(p, " -id "+id+" ") {
			out = append(out, p)
		}
	}
	return out
}

// status returns a container's CRI status.
func (c *criContainer) status(ctx context.Context, t *testing.T) *runtimeapi.ContainerStatus {
	t.Helper()
	st, err := c.p.c.runtime.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: c.id})
	if err != nil {
		t.Fatalf("ContainerStatus: %v", err)
	}
	return st.GetStatus()
}

// waitExited waits until the CRI reports the container exited.
func (c *criContainer) waitExited(ctx context.Context, t *testing.T) *runtimeapi.ContainerStatus {
	t.Helper()
	for {
		if st := c.status(ctx, t); st.State == runtimeapi.ContainerState_CONTAINER_EXITED {
			return st
		}
		select {
		case <-ctx.Done():
			t.Fatalf("container %s never exited", c.id)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// TestCRILifecycle takes a VM pod through the calls the kubelet makes:
// one shim for the whole pod, status through start, a graceful stop, a
// restart attempt that boots again, a forced stop, removal.
func TestCRILifecycle(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*bootTimeout)
	defer cancel()
	c := newCRI(t, env.daemon)
	p := c.runPod(ctx, t, "life")
	pods, err := c.runtime.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{Id: p.id}})
	if err != nil || len(pods.Items) != 1 || pods.Items[0].State != runtimeapi.PodSandboxState_SANDBOX_READY {
		t.Fatalf("ListPodSandbox: %v %v", pods.GetItems(), err)
	}
	vm := p.startVM(ctx, t, imageKernelWaitCRI, nil)
	if st := vm.status(ctx, t); st.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("state %v, want running", st.State)
	}
	vm.waitLog(ctx, t, "VMSHIM-LEASE")

	// One shim serves the pod: the sandbox's; none was started for the VM.
	if shims := shimsOf(p.id); len(shims) != 1 {
		t.Errorf("shims for the pod: %v, want one", shims)
	}
	if shims := shimsOf(vm.id); len(shims) != 0 {
		t.Errorf("a shim of its own for the VM container: %v", shims)
	}
	shimBefore := shimsOf(p.id)
	logPodMemory(t, p, vm)

	// A second VM cannot share the pod's IP: it fails, clearly.
	second := p.createVM(ctx, t, imageKernelWaitCRI, nil)
	_, err = c.runtime.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: second.id})
	if err == nil || !strings.Contains(err.Error(), "a VM pod has one VM container") {
		t.Errorf("second VM container in the pod: %v, want a one-VM error", err)
	}
	if _, err := c.runtime.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: second.id}); err != nil {
		t.Errorf("RemoveContainer of the refused container: %v", err)
	}

	// A guest that honours ACPI stops cleanly well before the timeout:
	// exit 0, not the 137 of the SIGKILL at the deadline.
	vm.stop(ctx, t, 30)
	st := vm.waitExited(ctx, t)
	if st.ExitCode != 0 || st.Reason != "Completed" {
		t.Errorf("after a graceful stop: exit %d reason %q, want 0 Completed", st.ExitCode, st.Reason)
	}
	vm.waitLog(ctx, t, markerACPI)
	assertCRILog(t, vm.log, markerBooted, "VMSHIM-LEASE", markerACPI)

	// The kubelet restarts a container as a new attempt in the same pod.
	again := p.startVM(ctx, t, imageKernelWaitCRI, nil)
	again.waitLog(ctx, t, markerBooted)
	again.stop(ctx, t, 0) // no grace: stopped at once
	if st := again.waitExited(ctx, t); st.ExitCode != 137 {
		t.Errorf("after a forced stop: exit %d reason %q, want 137", st.ExitCode, st.Reason)
	}
	for _, id := range []string{vm.id, again.id} {
		if _, err := c.runtime.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: id}); err != nil {
			t.Errorf("RemoveContainer: %v", err)
		}
	}
	var list *runtimeapi.ListContainersResponse
	list, err = c.runtime.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{PodSandboxId: p.id}})
	if err != nil || len(list.Containers) != 0 {
		t.Errorf("ListContainers after removal: %v %v", list.GetContainers(), err)
	}
	if shims := shimsOf(p.id); len(shims) != 1 || shims[0] != shimBefore[0] {
		t.Errorf("the pod's shim changed: %v, was %v", shims, shimBefore)
	}
	p.remove(t)
	waitGone(ctx, t, "shim of pod "+p.id, func() bool { return len(shimsOf(p.id)) == 0 })
	assertNothingLeftCRI(t, vm.id, again.id)
}

// TestCRIContainerdRestart restarts containerd under a running VM pod: the
// VM keeps running, its status stays right, its console still reaches the
// log, and the pod can then be stopped.
func TestCRIContainerdRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*bootTimeout)
	defer cancel()
	p, vm := runLeasedVM(ctx, t, "restart")
	qemu := processesMentioning("guest=" + vm.id)

	if err := env.daemon.restart(); err != nil {
		t.Fatalf("restart containerd: %v", err)
	}
	p.c = newCRI(t, env.daemon) // vm.p is p
	if st := vm.status(ctx, t); st.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Errorf("after the restart: state %v, want running", st.State)
	}
	if now := processesMentioning("guest=" + vm.id); len(now) != 1 || len(qemu) != 1 || now[0] != qemu[0] {
		t.Errorf("qemu before the restart %v, after %v", qemu, now)
	}
	// Output the guest writes now still reaches the CRI log.
	vm.stop(ctx, t, 30)
	vm.waitLog(ctx, t, markerACPI)
	if st := vm.waitExited(ctx, t); st.ExitCode != 0 {
		t.Errorf("exit %d after ACPI stop, want 0", st.ExitCode)
	}
	p.remove(t)
	assertNothingLeftCRI(t, vm.id)
}

// TestCRIShimKilled kills a running VM pod's shim: containerd runs the
// delete action for each of its tasks, which must stop QEMU and the pause
// process, give the pod's netns back as CNI left it, unmount, and give
// back the jail ids of both.
func TestCRIShimKilled(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*bootTimeout)
	defer cancel()
	p, vm := runLeasedVM(ctx, t, "shimkill")
	netns := p.netnsPath(ctx, t)
	killPodShim(t, p)
	vm.waitExited(ctx, t)
	waitGone(ctx, t, "qemu of "+vm.id, func() bool { return len(processesMentioning("guest="+vm.id)) == 0 })
	waitGone(ctx, t, "pause process of "+p.id, func() bool { return len(processesMentioning("vmshim-pause "+netns)) == 0 })
	// The netns is as CNI left it: no tap, and eth0 has its address back.
	out, err := exec.Command("nsenter", "--net="+netns, "ip", "-o", "addr", "show").CombinedOutput()
	if err != nil {
		t.Fatalf("ip addr in pod netns: %v %s", err, out)
	}
	restored := false
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		restored = restored || (len(f) > 2 && f[1] == "eth0" && f[2] == "inet")
	}
	if strings.Contains(string(out), "vmtap") || !restored {
		t.Errorf("pod netns not restored:\n%s", out)
	}
	p.remove(t)
	assertNothingLeftCRI(t, vm.id)
	assertNoIDClaims(t, criNamespace+"/"+vm.id, criNamespace+"/"+p.id)
	assertNoCNIErrors(t, env.daemon)
}

// killPodShim kills the pod's one VM shim with SIGKILL.
func killPodShim(t *testing.T, p *pod) {
	t.Helper()
	shims := shimsOf(p.id)
	if len(shims) != 1 {
		t.Fatalf("shims for the pod: %v", shims)
	}
	pid, _, _ := strings.Cut(shims[0], ":")
	if out, err := exec.Command("kill", "-KILL", pid).CombinedOutput(); err != nil {
		t.Fatalf("kill shim: %v %s", err, out)
	}
}

// runLeasedVM runs a pod with a VM container on the suite's daemon and
// waits until the guest has its DHCP lease.
func runLeasedVM(ctx context.Context, t *testing.T, name string) (*pod, *criContainer) {
	t.Helper()
	p := newCRI(t, env.daemon).runPod(ctx, t, name)
	vm := p.startVM(ctx, t, imageKernelWaitCRI, nil)
	vm.waitLog(ctx, t, "VMSHIM-LEASE")
	return p, vm
}

// waitGone waits until gone reports true.
func waitGone(ctx context.Context, t *testing.T, what string, gone func() bool) {
	t.Helper()
	for !gone() {
		select {
		case <-ctx.Done():
			t.Fatalf("%s still there", what)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// assertNothingLeftCRI checks that no process, mount or runtime dir of the
// CRI containers ids remains.
func assertNothingLeftCRI(t *testing.T, ids ...string) {
	t.Helper()
	for _, id := range ids {
		if procs := processesMentioning(id); len(procs) != 0 {
			t.Errorf("processes left for %s: %v", id, procs)
		}
		for _, m := range mountsUnder(env.daemon.dir) {
			if strings.Contains(m, id) {
				t.Errorf("mount left for %s: %s", id, m)
			}
		}
	}
	// The runtime dir is named by a hash of namespace and id.
	for _, id := range ids {
		if _, err := os.Stat(shimRuntimeDir(criNamespace, id)); err == nil {
			t.Errorf("runtime dir left for %s", id)
		}
	}
}

// assertCRILog checks that every line of a CRI log file is a proper CRI
// log line and that the markers appear in order.
func assertCRILog(t *testing.T, path string, markers ...string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	next := 0
	for n := 1; sc.Scan(); n++ {
		parts := strings.SplitN(sc.Text(), " ", 4)
		if len(parts) < 3 {
			t.Errorf("line %d is not a CRI log line: %q", n, sc.Text())
			continue
		}
		if _, err := time.Parse(time.RFC3339Nano, parts[0]); err != nil {
			t.Errorf("line %d: bad timestamp %q", n, parts[0])
		}
		if parts[1] != "stdout" || (parts[2] != "F" && parts[2] != "P") {
			t.Errorf("line %d: stream %q tag %q, want stdout F|P", n, parts[1], parts[2])
		}
		if next < len(markers) && len(parts) == 4 && strings.Contains(parts[3], markers[next]) {
			next++
		}
	}
	if next != len(markers) {
		t.Errorf("markers %v not all in order in %s (found %d)", markers, path, next)
	}
}

// TestCRIQEMUKilled: a VM whose QEMU dies is reported exited with a
// non-zero code, and the pod can run it again.
func TestCRIQEMUKilled(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*bootTimeout)
	defer cancel()
	p, vm := runLeasedVM(ctx, t, "qemukill")
	procs := processesMentioning("guest=" + vm.id)
	if len(procs) != 1 {
		t.Fatalf("qemu processes: %v", procs)
	}
	pid, _, _ := strings.Cut(procs[0], ":")
	if out, err := exec.Command("kill", "-KILL", pid).CombinedOutput(); err != nil {
		t.Fatalf("kill qemu: %v %s", err, out)
	}
	if st := vm.waitExited(ctx, t); st.ExitCode != 137 || st.Reason != "Error" {
		t.Errorf("after qemu was killed: exit %d reason %q, want 137 Error", st.ExitCode, st.Reason)
	}
	again := p.startVM(ctx, t, imageKernelWaitCRI, nil)
	again.waitLog(ctx, t, "VMSHIM-LEASE")
	p.remove(t)
	assertNothingLeftCRI(t, vm.id, again.id)
}

// logPodMemory reports what the running VM pod costs the host beyond guest
// RAM: QEMU's own memory, the shim and the pause process. This is the
// figure the RuntimeClass's overhead.podFixed holds (make bench measures
// it properly).
func logPodMemory(t *testing.T, p *pod, vm *criContainer) {
	const guestMiB = 512 // config default_memory: the test pods set no limit
	qemuPid, err := pidOf("guest=" + vm.id)
	if err != nil {
		t.Errorf("qemu: %v", err)
		return
	}
	q, err := processMemory(qemuPid, guestMiB)
	if err != nil {
		t.Errorf("qemu memory: %v", err)
		return
	}
	total := q.overheadKiB()
	line := fmt.Sprintf("qemu rss %d KiB (guest RAM touched %d KiB, overhead %d KiB)", q.rssKiB, q.guestKiB, q.overheadKiB())
	for name, s := range map[string]string{"shim": "containerd-shim-vm-v2 -namespace " + criNamespace + " -id " + p.id, "pause": "vmshim-pause " + p.netnsPath(context.Background(), t)} {
		pid, err := pidOf(s)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		m, err := processMemory(pid, 0)
		if err != nil {
			t.Errorf("%s memory: %v", name, err)
			continue
		}
		total += m.rssKiB
		line += fmt.Sprintf(", %s rss %d KiB", name, m.rssKiB)
	}
	t.Logf("host memory of one VM pod beyond guest RAM: %d KiB: %s", total, line)
}
