package integration

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// testAgentPod runs one VM pod whose guest runs qemu-guest-agent and
// takes console input (stdin), and goes through what users do with a
// running pod: logs, exec, attach, port-forward, an interactive exec,
// an in-place resize, and finally delete.
func (k *kubeCluster) testAgentPod(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), kubeTimeout)
	defer cancel()
	pod := vmPod("agent", imageKernelAgent)
	// One CPU and room to grow guest RAM, for the in-place resize.
	pod.Annotations = map[string]string{"vmshim.io/max-memory": "512Mi"}
	// (A CPU request below the limit keeps room on the 2-CPU node for 2
	// CPUs and the RuntimeClass overhead.)
	pod.Spec.Containers[0].Resources.Limits[corev1.ResourceCPU] = resource.MustParse("1")
	pod.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(kubeCPURequest)}
	pod.Spec.Containers[0].Stdin = true
	pod.Spec.Containers[0].ReadinessProbe = execProbe(guestServes...)
	p := k.runReadyPod(ctx, t, pod)
	t.Run("Logs", func(t *testing.T) { k.testLogs(t, p) })
	t.Run("Exec", func(t *testing.T) { k.testExec(t, p) })
	t.Run("AttachAndFollow", func(t *testing.T) { k.testAttach(t, p) })
	t.Run("PortForward", func(t *testing.T) { k.testPortForward(t, p) })
	t.Run("ExecTTY", func(t *testing.T) { k.testExecTTY(t, p) })
	t.Run("Resize", func(t *testing.T) { k.testResize(t, p) })
	t.Run("Delete", func(t *testing.T) { k.testDelete(t, p) })
}

// testLogs: `kubectl logs` shows the guest's console, markers in order.
func (k *kubeCluster) testLogs(t *testing.T, p *corev1.Pod) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := k.kubectlOK(ctx, "-n", kubeNamespace, "logs", p.Name)
	if err != nil {
		t.Fatal(err)
	}
	at := 0
	for _, m := range []string{markerAgent, markerBooted, "VMSHIM-LEASE if=eth0 ip=" + p.Status.PodIP + " ", "VMSHIM-HTTP-READY"} {
		i := strings.Index(out[at:], m)
		if i < 0 {
			t.Fatalf("kubectl logs: no %q after offset %d:\n%s", m, at, out)
		}
		at += i + len(m)
	}
}

// testExec: `kubectl exec` without a tty runs the command in the guest;
// stdout, stderr, stdin and the exit code come back.
func (k *kubeCluster) testExec(t *testing.T, p *corev1.Pod) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, errOut, code := k.kubectlRun(ctx, "", "-n", kubeNamespace, "exec", p.Name, "--", "sh", "-c", "echo to-stdout; echo to-stderr >&2; exit 7")
	if code != 7 || out != "to-stdout\n" || !strings.Contains(errOut, "to-stderr\n") {
		t.Errorf("kubectl exec exit 7: code %d, stdout %q, stderr %q", code, out, errOut)
	}
	out, errOut, code = k.kubectlRun(ctx, "hello from stdin\n", "-n", kubeNamespace, "exec", "-i", p.Name, "--", "tr", "a-z", "A-Z")
	if code != 0 || out != "HELLO FROM STDIN\n" {
		t.Errorf("kubectl exec -i: code %d, stdout %q, stderr %q", code, out, errOut)
	}
	out, errOut, code = k.kubectlRun(ctx, "", "-n", kubeNamespace, "exec", p.Name, "--", "hostname")
	if code != 0 || strings.TrimSpace(out) != p.Name {
		t.Errorf("kubectl exec hostname: code %d, stdout %q, stderr %q", code, out, errOut)
	}
}

// startKubectl starts a long-running kubectl whose stdout goes to out;
// it is killed when the test ends. The channel gets its exit error.
func (k *kubeCluster) startKubectl(t *testing.T, stdin io.Reader, out io.Writer, args ...string) <-chan error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := k.kubectl(ctx, args...)
	var stderr strings.Builder
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, out, &stderr
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatalf("kubectl %v: %v", args, err)
	}
	done, finished := make(chan error, 1), make(chan struct{})
	go func() {
		err := cmd.Wait()
		if err != nil && stderr.Len() > 0 {
			err = fmt.Errorf("%w: %s", err, strings.TrimSpace(stderr.String()))
		}
		done <- err
		close(finished)
	}()
	t.Cleanup(func() {
		cancel()
		<-finished
	})
	return done
}

// testAttach: `kubectl attach -i` reaches the guest's serial console: a
// line written is read by the guest, whose answer comes back on the
// attach stream and, at the same time, on `kubectl logs -f`. Detaching
// (closing stdin) ends attach and leaves the VM running.
func (k *kubeCluster) testAttach(t *testing.T, p *corev1.Pod) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	follow := newConsoleOut()
	k.startKubectl(t, nil, follow, "-n", kubeNamespace, "logs", "-f", "--tail=1", p.Name)
	attached := newConsoleOut()
	stdinR, stdinW := io.Pipe()
	attachDone := k.startKubectl(t, stdinR, attached, "-n", kubeNamespace, "attach", "-i", p.Name)
	line := fmt.Sprintf("hello-attach-%d", time.Now().UnixNano()%100000)
	answered := make(chan struct{})
	go func() {
		for {
			if _, err := io.WriteString(stdinW, line+"\n"); err != nil {
				return
			}
			select {
			case <-answered:
				return
			case <-time.After(2 * time.Second):
			}
		}
	}()
	attached.waitFor(ctx, t, "VMSHIM-ECHO: "+line)
	close(answered)
	follow.waitFor(ctx, t, "VMSHIM-ECHO: "+line)
	stdinW.Close()
	select {
	case err := <-attachDone:
		if err != nil {
			t.Errorf("kubectl attach after detaching: %v", err)
		}
	case <-ctx.Done():
		t.Errorf("kubectl attach did not end when its stdin closed")
	}
	got, err := k.client.CoreV1().Pods(kubeNamespace).Get(ctx, p.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !podRunning(got) || got.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Errorf("after detaching: %s", k.describe(p.Name, got))
	}
}

// forwardingRE matches kubectl port-forward's line naming its local port.
var forwardingRE = regexp.MustCompile(`Forwarding from 127\.0\.0\.1:(\d+) -> 8080`)

// testPortForward: `kubectl port-forward` (listening on 127.0.0.1 in the
// cluster's namespace) reaches the guest's httpd, for two connections in
// a row.
func (k *kubeCluster) testPortForward(t *testing.T, p *corev1.Pod) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	k.portForward(ctx, t, p.Name, fmt.Sprintf("VMSHIM-HTTP-OK %s %s", p.Name, p.Status.PodIP))
}

// portForward runs `kubectl port-forward` to the pod's port 8080 and
// checks that two connections through it get want from the guest.
func (k *kubeCluster) portForward(ctx context.Context, t *testing.T, pod, want string) {
	t.Helper()
	outR, outW := io.Pipe()
	k.startKubectl(t, nil, outW, "-n", kubeNamespace, "port-forward", "pod/"+pod, ":8080")
	ports := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(outR)
		for sc.Scan() {
			if m := forwardingRE.FindStringSubmatch(sc.Text()); m != nil {
				ports <- m[1]
			}
		}
	}()
	var port string
	select {
	case port = <-ports:
	case <-ctx.Done():
		t.Fatal("kubectl port-forward never said where it listens")
	}
	t.Cleanup(func() { outW.Close() })
	n, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if body := k.httpGet(ctx, t, "127.0.0.1", n); !strings.Contains(body, want) {
			t.Errorf("port-forward connection %d: %q, want %q", i, body, want)
		}
	}
}

// testRouterOnlyPortForward: `kubectl port-forward` reaches a guest
// whose DHCP client, like busybox udhcpc's usual script, applies only the
// router option (3) and ignores the classless routes (121); the guest
// becomes Ready through an HTTP probe first.
func (k *kubeCluster) testRouterOnlyPortForward(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), kubeTimeout)
	defer cancel()
	pod := vmPod("router-only", imageKernelWait)
	pod.Annotations = map[string]string{annotationKernelCmdline: "vmshim.mode=router-only"}
	pod.Spec.Containers[0].ReadinessProbe = httpProbe(8080)
	p := k.runReadyPod(ctx, t, pod)
	k.testPortForward(t, p)
	out, err := k.kubectlOK(ctx, "-n", kubeNamespace, "logs", p.Name)
	if err != nil {
		t.Fatal(err)
	}
	_, routes, _ := strings.Cut(out, "VMSHIM-ROUTES")
	routes, _, _ = strings.Cut(routes, "\n")
	t.Logf("guest routes:%s", routes)
	if routes == "" || !strings.Contains(routes, "default via") || strings.Contains(routes, "169.254.") {
		t.Errorf("guest routes %q: want only the subnet and a default route", routes)
	}
	k.deletePods(ctx, t, p.Name)
}

// kubeCPURequest is the agent pod's CPU request, below its limit.
const kubeCPURequest = "100m"

// testResize: an in-place resize through the pod's resize subresource
// gives the running guest more vCPUs and RAM, and a second one takes them
// back, without a restart: the kubelet calls UpdateContainerResources, and
// the shim hot-plugs (under TCG, onlines) vCPUs and plugs or unplugs
// virtio-mem memory. The pod's status reports the resources in force.
func (k *kubeCluster) testResize(t *testing.T, p *corev1.Pod) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	before := k.guestMemTotal(ctx, t, p.Name)
	for _, step := range []struct {
		cpu, memory string
		cpus        string // the guest's /sys/devices/system/cpu/online
		grow        int64  // MemTotal change from boot, KiB
	}{
		{"2", "384Mi", "0-1", 128 << 10},
		{"1", kubeGuestMemory, "0", 0},
	} {
		patch := fmt.Sprintf(`{"spec":{"containers":[{"name":"vm","resources":{"limits":{"cpu":%q,"memory":%q},"requests":{"cpu":%q,"memory":%q}}}]}}`,
			step.cpu, step.memory, kubeCPURequest, step.memory)
		if _, err := k.client.CoreV1().Pods(kubeNamespace).Patch(ctx, p.Name, types.StrategicMergePatchType, []byte(patch),
			metav1.PatchOptions{}, "resize"); err != nil {
			t.Fatalf("patch resize to cpu %s, memory %s: %v", step.cpu, step.memory, err)
		}
		got := k.waitPod(ctx, t, p.Name, "resized to cpu "+step.cpu+", memory "+step.memory, func(p *corev1.Pod) bool {
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodResizeInProgress && c.Reason == corev1.PodReasonError {
					t.Fatalf("resize to cpu %s, memory %s failed: %s", step.cpu, step.memory, c.Message)
				}
			}
			r := p.Status.ContainerStatuses[0].Resources
			return !resizing(p) && r != nil && r.Limits.Memory().Cmp(resource.MustParse(step.memory)) == 0 &&
				r.Limits.Cpu().Cmp(resource.MustParse(step.cpu)) == 0
		})
		if n := got.Status.ContainerStatuses[0].RestartCount; n != 0 || !podReady(got) {
			t.Errorf("after the resize the pod is Ready=%v with %d restarts, want Ready with none", podReady(got), n)
		}
		deadline := time.Now().Add(resizeSeen)
		var online string
		for time.Now().Before(deadline) {
			out, err := k.kubectlOK(ctx, "-n", kubeNamespace, "exec", p.Name, "--", "cat", "/sys/devices/system/cpu/online")
			if online = strings.TrimSpace(out); err == nil && online == step.cpus {
				break
			}
			time.Sleep(500 * time.Millisecond)
		}
		memTotal := k.guestMemTotal(ctx, t, p.Name)
		t.Logf("cpu %s, memory %s: guest cpus online %s, MemTotal %d KiB", step.cpu, step.memory, online, memTotal)
		if online != step.cpus {
			t.Errorf("cpu %s: guest cpus online %q, want %q", step.cpu, online, step.cpus)
		}
		if memTotal-before != step.grow {
			t.Errorf("memory %s: the guest's MemTotal went from %d to %d KiB, want +%d", step.memory, before, memTotal, step.grow)
		}
	}
}

// guestMemTotal returns MemTotal of the guest's /proc/meminfo, in KiB.
func (k *kubeCluster) guestMemTotal(ctx context.Context, t *testing.T, pod string) int64 {
	t.Helper()
	out, err := k.kubectlOK(ctx, "-n", kubeNamespace, "exec", pod, "--", "sed", "-n", "s/^MemTotal: *\\([0-9]*\\) kB/\\1/p", "/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(out), 10, 64)
	if err != nil {
		t.Fatalf("guest MemTotal %q: %v", out, err)
	}
	return n
}

// resizing tells whether a resize of the pod is pending or in progress.
func resizing(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if (c.Type == corev1.PodResizePending || c.Type == corev1.PodResizeInProgress) && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// testDelete: `kubectl delete` ends the pod within its grace period, the
// guest powering off on the ACPI power button (its console, followed
// with `kubectl logs -f`, says so), and leaves nothing on the node.
func (k *kubeCluster) testDelete(t *testing.T, p *corev1.Pod) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cur, err := k.client.CoreV1().Pods(kubeNamespace).Get(ctx, p.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctr, sandbox := containerID(cur), k.node.sandboxID(ctx, t, string(p.UID))
	console := newConsoleOut()
	followed := k.startKubectl(t, nil, console, "-n", kubeNamespace, "logs", "-f", "--tail=1", p.Name)
	grace := time.Duration(*p.Spec.TerminationGracePeriodSeconds) * time.Second
	start := time.Now()
	out, err := k.kubectlOK(ctx, "-n", kubeNamespace, "delete", "pod", p.Name, "--wait", "--timeout", "2m")
	took := time.Since(start)
	if err != nil {
		t.Fatalf("%v\n%s", err, k.describe(p.Name, nil))
	}
	t.Logf("kubectl delete took %v (grace period %v): %s", took.Round(time.Millisecond), grace, strings.TrimSpace(out))
	if took >= grace {
		t.Errorf("kubectl delete took %v, not within the grace period %v", took, grace)
	}
	select {
	case <-followed:
	case <-ctx.Done():
		t.Errorf("kubectl logs -f did not end with the container")
	}
	if !strings.Contains(console.String(), markerACPI) {
		t.Errorf("the guest did not shut down on the ACPI power button; its last console lines:\n%s", console.String())
	}
	k.assertPodGone(ctx, t, k.node, string(p.UID), sandbox, ctr)
}
