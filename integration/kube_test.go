package integration

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// TestKube runs VM pods on a real cluster (etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler and a kubelet on the suite's
// containerd, in its network namespace; the last case adds a second
// node) and drives them through the API server with client-go and
// kubectl, as users do. The cluster is started once for all the cases
// and removed after them.
func TestKube(t *testing.T) {
	k := startKube(t)
	t.Run("RuntimeClass", k.testRuntimeClass)
	t.Run("Readiness", k.testReadiness)
	t.Run("AgentPod", k.testAgentPod)
	t.Run("RouterOnlyPortForward", k.testRouterOnlyPortForward)
	t.Run("Restart", k.testRestart)
	t.Run("DeadGuest", k.testDeadGuest)
	t.Run("OOMKilled", k.testOOMKilled)
	t.Run("BadInput", k.testBadInput)
	t.Run("MixedPod", k.testMixedPod)
	t.Run("Deployment", k.testDeployment)
	t.Run("Soak", k.testSoak)
	t.Run("Burst", k.testBurst)
	t.Run("RestartsUnderLoad", k.testRestartsUnderLoad)
	t.Run("Drain", k.testDrain)
}

// testRuntimeClass: deploy/runtimeclass.yaml, applied unmodified when the
// cluster started, is what the API server holds; applying it again
// changes nothing; the node carries the label its nodeSelector selects.
func (k *kubeCluster) testRuntimeClass(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	data, err := os.ReadFile(runtimeClassManifest())
	if err != nil {
		t.Fatal(err)
	}
	var want nodev1.RuntimeClass
	if err := yaml.UnmarshalStrict(data, &want); err != nil {
		t.Fatalf("parse %s: %v", runtimeClassManifest(), err)
	}
	got, err := k.client.NodeV1().RuntimeClasses().Get(ctx, want.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get RuntimeClass %s: %v", want.Name, err)
	}
	if got.Handler != want.Handler || !equality.Semantic.DeepEqual(got.Overhead, want.Overhead) ||
		!equality.Semantic.DeepEqual(got.Scheduling, want.Scheduling) {
		t.Errorf("RuntimeClass %s: handler %q overhead %+v scheduling %+v, want %q %+v %+v",
			got.Name, got.Handler, got.Overhead, got.Scheduling, want.Handler, want.Overhead, want.Scheduling)
	}
	out, err := k.kubectlOK(ctx, "apply", "-f", runtimeClassManifest())
	if err != nil || !strings.Contains(out, "unchanged") {
		t.Errorf("apply again: %q, %v; want unchanged", out, err)
	}
	node, err := k.client.CoreV1().Nodes().Get(ctx, kubeNodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for key, v := range want.Scheduling.NodeSelector {
		if node.Labels[key] != v {
			t.Errorf("node %s: label %s=%q, want %q (the RuntimeClass's nodeSelector)", node.Name, key, node.Labels[key], v)
		}
	}
	t.Logf("RuntimeClass %s: handler %s, overhead %v, nodeSelector %v", got.Name, got.Handler, got.Overhead.PodFixed, got.Scheduling.NodeSelector)
}

// testReadiness: a VM pod becomes Running, then Ready once its exec
// readiness probe (through the guest agent) passes; another becomes
// Ready through an HTTP probe of the guest's httpd on the pod IP. Each
// guest serves its page on the IP the API server shows for the pod.
func (k *kubeCluster) testReadiness(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), kubeTimeout)
	defer cancel()
	execPod := vmPod("ready-exec", imageKernelAgent)
	execPod.Spec.Containers[0].ReadinessProbe = execProbe(guestServes...)
	httpPod := vmPod("ready-http", imageKernelWait)
	httpPod.Spec.Containers[0].ReadinessProbe = httpProbe(8080)
	start := time.Now()
	k.createPod(ctx, t, execPod)
	k.createPod(ctx, t, httpPod)
	for _, name := range []string{execPod.Name, httpPod.Name} {
		p := k.waitPod(ctx, t, name, "Ready", podReady)
		started := p.Status.ContainerStatuses[0].State.Running.StartedAt
		var ready metav1.Time
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady {
				ready = c.LastTransitionTime
			}
		}
		if ready.Before(&started) {
			t.Errorf("pod %s Ready at %v, before its container started at %v", name, ready, started)
		}
		t.Logf("pod %s: Running at +%v, Ready at +%v, IP %s", name, started.Sub(start).Round(time.Second),
			ready.Sub(start).Round(time.Second), p.Status.PodIP)
		want := fmt.Sprintf("VMSHIM-HTTP-OK %s %s", name, p.Status.PodIP)
		if body := k.httpGet(ctx, t, p.Status.PodIP, 8080); !strings.Contains(body, want) {
			t.Errorf("http://%s:8080/ served %q, want %q", p.Status.PodIP, body, want)
		}
	}
	k.deletePods(ctx, t, execPod.Name, httpPod.Name)
}

// httpGet fetches / from ip:port inside the cluster's network namespace.
func (k *kubeCluster) httpGet(ctx context.Context, t *testing.T, ip string, port int) string {
	t.Helper()
	client := &http.Client{Transport: &http.Transport{DialContext: k.dial, DisableKeepAlives: true}, Timeout: 10 * time.Second}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://%s:%d/", ip, port), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Errorf("GET %s: %v", req.URL, err)
		return ""
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return string(body)
}

// deletePods deletes the pods with their grace period and waits until
// the API server no longer has them.
func (k *kubeCluster) deletePods(ctx context.Context, t *testing.T, names ...string) {
	t.Helper()
	for _, name := range names {
		if err := k.client.CoreV1().Pods(kubeNamespace).Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete pod %s: %v", name, err)
		}
	}
	for _, name := range names {
		if err := k.poll(ctx, "pod "+name+" to go", 500*time.Millisecond, func() (bool, error) {
			_, err := k.client.CoreV1().Pods(kubeNamespace).Get(ctx, name, metav1.GetOptions{})
			return apierrors.IsNotFound(err), nil
		}); err != nil {
			t.Errorf("%v\n%s", err, k.describe(name, nil))
		}
	}
}

// testRestart: a guest that powers itself off exits 0; under
// restartPolicy Always the kubelet boots it again, the restart count
// grows, and `kubectl logs --previous` shows the last boot's console.
func (k *kubeCluster) testRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), kubeTimeout)
	defer cancel()
	pod := vmPod("poweroff", imageKernelOff)
	pod.Spec.RestartPolicy = corev1.RestartPolicyAlways
	start := time.Now()
	k.createPod(ctx, t, pod)
	p := k.waitPod(ctx, t, pod.Name, "restarted twice", func(p *corev1.Pod) bool {
		return len(p.Status.ContainerStatuses) > 0 && p.Status.ContainerStatuses[0].RestartCount >= 2
	})
	cs := p.Status.ContainerStatuses[0]
	t.Logf("restart count %d after %v", cs.RestartCount, time.Since(start).Round(time.Second))
	if last := cs.LastTerminationState.Terminated; last == nil || last.ExitCode != 0 || last.Reason != "Completed" {
		t.Errorf("last termination %+v, want exit 0 Completed", cs.LastTerminationState)
	}
	out, err := k.kubectlOK(ctx, "-n", kubeNamespace, "logs", "--previous", pod.Name)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, markerBooted) || !strings.Contains(out, markerPoweroff) {
		t.Errorf("kubectl logs --previous: want %s and %s, got:\n%s", markerBooted, markerPoweroff, out)
	}
	k.deletePods(ctx, t, pod.Name)
}

// testOOMKilled: on a RuntimeClass whose handler gives QEMU no memory
// beyond guest RAM (vm-tight), a guest that fills its RAM gets QEMU
// OOM-killed, and the pod's status says OOMKilled.
func (k *kubeCluster) testOOMKilled(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), kubeTimeout)
	defer cancel()
	vm, err := k.client.NodeV1().RuntimeClasses().Get(ctx, "vm", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rc := &nodev1.RuntimeClass{
		ObjectMeta: metav1.ObjectMeta{Name: tightHandler},
		Handler:    tightHandler,
		Overhead:   vm.Overhead,
		Scheduling: vm.Scheduling,
	}
	if _, err := k.client.NodeV1().RuntimeClasses().Create(ctx, rc, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create RuntimeClass %s: %v", rc.Name, err)
	}
	defer k.client.NodeV1().RuntimeClasses().Delete(context.Background(), rc.Name, metav1.DeleteOptions{})
	pod := vmPod("oom", imageKernelAgent)
	pod.Spec.RuntimeClassName = &rc.Name
	pod.Spec.RestartPolicy = corev1.RestartPolicyNever
	pod.Spec.Containers[0].ReadinessProbe = execProbe(guestServes...)
	k.runReadyPod(ctx, t, pod)
	_, errOut, code := k.kubectlRun(ctx, "", append([]string{"-n", kubeNamespace, "exec", pod.Name, "--"}, fillGuestRAM...)...)
	t.Logf("the fill ended with exit %d: %s", code, strings.TrimSpace(errOut))
	p := k.waitPod(ctx, t, pod.Name, "terminated", func(p *corev1.Pod) bool {
		return len(p.Status.ContainerStatuses) > 0 && p.Status.ContainerStatuses[0].State.Terminated != nil
	})
	term := p.Status.ContainerStatuses[0].State.Terminated
	t.Logf("container terminated: exit %d, reason %s, pod phase %s", term.ExitCode, term.Reason, p.Status.Phase)
	if term.Reason != "OOMKilled" || term.ExitCode != 137 {
		t.Errorf("terminated %+v, want OOMKilled with exit 137", term)
	}
	out, err := k.kubectlOK(ctx, "-n", kubeNamespace, "get", "pod", pod.Name)
	if err != nil || !strings.Contains(out, "OOMKilled") {
		t.Errorf("kubectl get pod: %q, %v; want OOMKilled", out, err)
	}
	k.deletePods(ctx, t, pod.Name)
}

// testBadInput: a bad vmshim.io annotation and an image that is no VM
// image make the pod fail with a one-line reason in its events, as
// `kubectl describe pod` shows them.
func (k *kubeCluster) testBadInput(t *testing.T) {
	cases := []struct {
		name string
		pod  func() *corev1.Pod
		want string
	}{
		{"bad-memory", func() *corev1.Pod {
			p := vmPod("bad-memory", imageKernelWait)
			p.Annotations = map[string]string{"vmshim.io/memory": "lots"}
			return p
		}, "vmshim.io/memory"},
		// An image with no VM runs under runc; this one's command is a
		// text file, which runc cannot run.
		{"not-a-vm", func() *corev1.Pod {
			p := vmPod("not-a-vm", pauseImage)
			p.Spec.Containers[0].Command = []string{"/pause"}
			return p
		}, "runc create failed"},
		// A service mesh's init container redirects the pod's inbound TCP.
		{"meshed", func() *corev1.Pod {
			p := vmPod("meshed", imageKernelWait)
			init := corev1.Container{
				Name: "mesh-init", Image: iptablesImage, ImagePullPolicy: corev1.PullNever,
				Command:         []string{"iptables-nft", "-t", "nat", "-A", "PREROUTING", "-p", "tcp", "-j", "REDIRECT", "--to-ports", "15006"},
				SecurityContext: &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"NET_ADMIN", "NET_RAW"}}},
			}
			p.Spec.InitContainers = []corev1.Container{init}
			return p
		}, "steers traffic through a proxy (nf_tables ip table nat chain PREROUTING"},
	}
	ctx, cancel := context.WithTimeout(context.Background(), kubeTimeout)
	importIptables(ctx, t, criNamespace)
	cancel()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), kubeTimeout)
			defer cancel()
			pod := tc.pod()
			pod.Spec.RestartPolicy = corev1.RestartPolicyNever
			k.createPod(ctx, t, pod)
			var failed *corev1.Event
			if err := k.poll(ctx, "a Failed event for "+pod.Name, 500*time.Millisecond, func() (bool, error) {
				for _, e := range k.events(ctx, pod.Name) {
					if e.Type == corev1.EventTypeWarning && e.Reason == "Failed" {
						failed = &e
						return true, nil
					}
				}
				return false, nil
			}); err != nil {
				t.Fatalf("%v\n%s", err, k.describe(pod.Name, nil))
			}
			t.Logf("event %s: %s", failed.Reason, failed.Message)
			if strings.Contains(failed.Message, "\n") || !strings.Contains(failed.Message, tc.want) {
				t.Errorf("event message %q: want one line naming %q", failed.Message, tc.want)
			}
			out, err := k.kubectlOK(ctx, "-n", kubeNamespace, "describe", "pod", pod.Name)
			if err != nil || !strings.Contains(out, tc.want) {
				t.Errorf("kubectl describe pod does not show %q: %v\n%s", tc.want, err, out)
			}
			k.deletePods(ctx, t, pod.Name)
		})
	}
}

// testDeployment: a Deployment of three VM replicas, scheduled by the
// scheduler onto the labelled node, becomes available; every guest
// reaches every other one by pod IP (ping and HTTP, run in the guest
// through `kubectl exec`). Deleting the Deployment removes its pods.
func (k *kubeCluster) testDeployment(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), kubeTimeout)
	defer cancel()
	const replicas = 3
	tmpl := vmPod("web", imageKernelAgent)
	tmpl.Spec.Containers[0].ReadinessProbe = execProbe(guestServes...)
	n := int32(replicas)
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: kubeNamespace},
		Spec: appsv1.DeploymentSpec{
			Replicas: &n,
			Selector: &metav1.LabelSelector{MatchLabels: maps.Clone(tmpl.Labels)},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: tmpl.Labels}, Spec: tmpl.Spec},
		},
	}
	start := time.Now()
	if _, err := k.client.AppsV1().Deployments(kubeNamespace).Create(ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create deployment: %v", err)
	}
	if err := k.poll(ctx, "deployment web available", time.Second, func() (bool, error) {
		got, err := k.client.AppsV1().Deployments(kubeNamespace).Get(ctx, d.Name, metav1.GetOptions{})
		return err == nil && got.Status.AvailableReplicas == replicas, err
	}); err != nil {
		t.Fatalf("%v\n%s", err, k.describe("web", nil))
	}
	pods, err := k.client.CoreV1().Pods(kubeNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
	if err != nil || len(pods.Items) != replicas {
		t.Fatalf("pods of the deployment: %v, %v", pods, err)
	}
	t.Logf("%d replicas available after %v", replicas, time.Since(start).Round(time.Second))
	for _, from := range pods.Items {
		for _, to := range pods.Items {
			if from.Name == to.Name {
				continue
			}
			ip := to.Status.PodIP
			if out, errOut, code := k.kubectlRun(ctx, "", "-n", kubeNamespace, "exec", from.Name, "--", "ping", "-c", "1", "-W", "3", ip); code != 0 {
				t.Errorf("%s: ping %s (%s): exit %d: %s%s", from.Name, to.Name, ip, code, out, errOut)
			}
			want := fmt.Sprintf("VMSHIM-HTTP-OK %s %s", to.Name, ip)
			out, errOut, code := k.kubectlRun(ctx, "", "-n", kubeNamespace, "exec", from.Name, "--",
				"timeout", "10", "wget", "-q", "-O", "-", "http://"+ip+":8080/")
			if code != 0 || !strings.Contains(out, want) {
				t.Errorf("%s: wget http://%s:8080/: exit %d, %q %s; want %q", from.Name, ip, code, out, errOut, want)
			}
		}
	}
	if !t.Failed() {
		t.Logf("each of the %d guests reached the other %d by ping and HTTP on their pod IPs", replicas, replicas-1)
	}
	fg := metav1.DeletePropagationForeground
	if err := k.client.AppsV1().Deployments(kubeNamespace).Delete(ctx, d.Name, metav1.DeleteOptions{PropagationPolicy: &fg}); err != nil {
		t.Fatalf("delete deployment: %v", err)
	}
	if err := k.poll(ctx, "the deployment's pods to go", time.Second, func() (bool, error) {
		left, err := k.client.CoreV1().Pods(kubeNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
		return err == nil && len(left.Items) == 0, err
	}); err != nil {
		t.Errorf("%v", err)
	}
}
