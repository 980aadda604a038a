package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/intstr"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// kubeGuestMemory is the guest RAM of the Kubernetes tests' VMs: the
// container's memory limit.
const kubeGuestMemory = "256Mi"

// kubeTimeout bounds each Kubernetes test case.
const kubeTimeout = 4 * time.Minute

// vmPod returns a pod running image as a VM through the RuntimeClass
// "vm": one container "vm", the image never pulled (the suite imported
// it), guest RAM from the memory limit.
func vmPod(name, image string) *corev1.Pod {
	vm := "vm"
	grace := int64(30)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: kubeNamespace, Labels: map[string]string{"app": name}},
		Spec: corev1.PodSpec{
			RuntimeClassName:              &vm,
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name:            "vm",
				Image:           image,
				ImagePullPolicy: corev1.PullNever,
				Resources: corev1.ResourceRequirements{
					Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(kubeGuestMemory)},
				},
			}},
		},
	}
}

// execProbe is a readiness probe that runs cmd in the guest through its
// agent.
func execProbe(cmd ...string) *corev1.Probe {
	return &corev1.Probe{
		ProbeHandler:  corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: cmd}},
		PeriodSeconds: 2, TimeoutSeconds: 10, FailureThreshold: 3,
	}
}

// httpProbe is a readiness probe that fetches / from the guest's httpd.
func httpProbe(port int) *corev1.Probe {
	return &corev1.Probe{
		ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/", Port: intstr.FromInt(port)}},
		PeriodSeconds: 2, TimeoutSeconds: 5, FailureThreshold: 3,
	}
}

// guestServes is the exec probe of a guest whose httpd serves its page:
// the guest has its lease and network.
var guestServes = []string{"grep", "-q", "VMSHIM-HTTP-OK", "/www/index.html"}

// createPod creates the pod and deletes it (without waiting) when the
// test ends, unless the test deleted it itself.
func (k *kubeCluster) createPod(ctx context.Context, t *testing.T, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	created, err := k.client.CoreV1().Pods(kubeNamespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod %s: %v", pod.Name, err)
	}
	t.Cleanup(func() {
		zero := int64(0)
		err := k.client.CoreV1().Pods(kubeNamespace).Delete(context.Background(), pod.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete pod %s: %v", pod.Name, err)
		}
	})
	return created
}

// waitPod polls the pod until cond holds and returns it. On timeout it
// fails the test with the pod's status, its events and the kubelet's log.
func (k *kubeCluster) waitPod(ctx context.Context, t *testing.T, name, what string, cond func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	var last *corev1.Pod
	err := k.poll(ctx, fmt.Sprintf("pod %s %s", name, what), 500*time.Millisecond, func() (bool, error) {
		p, err := k.client.CoreV1().Pods(kubeNamespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		last = p
		return cond(p), nil
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, k.describe(name, last))
	}
	return last
}

// describe returns what explains a pod's state: its status, its events
// and the end of its node's kubelet log (the first node's when it has
// none yet).
func (k *kubeCluster) describe(name string, p *corev1.Pod) string {
	var b strings.Builder
	if p != nil {
		fmt.Fprintf(&b, "phase %s, conditions:", p.Status.Phase)
		for _, c := range p.Status.Conditions {
			fmt.Fprintf(&b, " %s=%s(%s)", c.Type, c.Status, c.Message)
		}
		for _, cs := range p.Status.ContainerStatuses {
			fmt.Fprintf(&b, "\ncontainer %s: restarts %d, state %+v, last %+v", cs.Name, cs.RestartCount, cs.State, cs.LastTerminationState)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, e := range k.events(ctx, name) {
		fmt.Fprintf(&b, "\nevent %s %s: %s", e.Type, e.Reason, e.Message)
	}
	n := k.node
	for _, m := range k.nodes {
		if p != nil && m.name == p.Spec.NodeName {
			n = m
		}
	}
	fmt.Fprintf(&b, "\n--- kubelet log of %s:\n%s", n.name, k.logTail(n.stem, 4000))
	return b.String()
}

// events returns the events about pod name, oldest first.
func (k *kubeCluster) events(ctx context.Context, name string) []corev1.Event {
	list, err := k.client.CoreV1().Events(kubeNamespace).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("involvedObject.name", name).String(),
	})
	if err != nil {
		return nil
	}
	return list.Items
}

// podReady tells whether the pod's Ready condition is true.
func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// podRunning tells whether the pod is Running with its container started.
func podRunning(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodRunning && len(p.Status.ContainerStatuses) > 0 &&
		p.Status.ContainerStatuses[0].State.Running != nil
}

// runReadyPod creates the pod and waits until it is Ready.
func (k *kubeCluster) runReadyPod(ctx context.Context, t *testing.T, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	k.createPod(ctx, t, pod)
	return k.waitPod(ctx, t, pod.Name, "Ready", podReady)
}

// containerID returns the CRI id of the pod's first container.
func containerID(p *corev1.Pod) string {
	if len(p.Status.ContainerStatuses) == 0 {
		return ""
	}
	_, id, _ := strings.Cut(p.Status.ContainerStatuses[0].ContainerID, "://")
	return id
}

// podCgroupDirs lists the pod's cgroup directories under the kubelet's
// cgroup root, in any hierarchy and QoS class.
func (n *kubeNode) podCgroupDirs(uid string) []string {
	var out []string
	for _, dir := range n.cgroupsLeft() {
		if strings.HasSuffix(dir, "/pod"+uid) {
			out = append(out, dir)
		}
	}
	return out
}

// assertPodGone checks that nothing of the pod is left running or
// mounted on node n: no process naming its ids (QEMU, shim), no runtime
// dir or jail id claimed for them, no mount naming its ids or uid, no
// network namespace of its sandbox, no pod cgroup, no kubelet pod
// directory, and its sandbox stopped. The kubelet removes the last ones
// in its housekeeping, so they are waited for. (The stopped sandbox's
// record goes at the kubelet's next garbage collection.)
func (k *kubeCluster) assertPodGone(ctx context.Context, t *testing.T, n *kubeNode, uid string, ids ...string) {
	t.Helper()
	err := k.poll(ctx, "the pod's cgroups and directories to go", 500*time.Millisecond, func() (bool, error) {
		_, err := os.Stat(filepath.Join(n.rootDir, "pods", uid))
		return len(n.podCgroupDirs(uid)) == 0 && os.IsNotExist(err), nil
	})
	if err != nil {
		t.Errorf("%s: %v: cgroups %v", n.name, err, n.podCgroupDirs(uid))
	}
	claims := jailClaims(t)
	for _, id := range ids {
		if procs := processesMentioning(id); len(procs) != 0 {
			t.Errorf("processes left for %s: %v", id, procs)
		}
		if _, err := os.Stat(shimRuntimeDir(criNamespace, id)); err == nil {
			t.Errorf("runtime dir left for %s", id)
		}
		if jid, ok := claims[criNamespace+"/"+id]; ok {
			t.Errorf("jail id %s still claimed for %s", jid, id)
		}
	}
	for _, dir := range []string{n.daemon.dir, n.rootDir} {
		for _, m := range mountsUnder(dir) {
			for _, s := range append([]string{uid}, ids...) {
				if strings.Contains(m, s) {
					t.Errorf("%s: mount left: %s", n.name, m)
				}
			}
		}
	}
	sandboxes, err := n.cri.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{
		LabelSelector: map[string]string{"io.kubernetes.pod.uid": uid},
	}})
	if err != nil {
		t.Errorf("list sandboxes: %v", err)
		return
	}
	for _, sb := range sandboxes.Items {
		if sb.State != runtimeapi.PodSandboxState_SANDBOX_NOTREADY {
			t.Errorf("%s: sandbox %s of pod %s is still %v", n.name, sb.Id, uid, sb.State)
		}
		if netns := n.sandboxNetns(ctx, t, sb.Id); netns != "" {
			if _, err := os.Lstat(netns); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s: network namespace %s of sandbox %s is still there (%v)", n.name, netns, sb.Id, err)
			}
		}
	}
	containers, err := n.cri.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{
		LabelSelector: map[string]string{"io.kubernetes.pod.uid": uid},
	}})
	if err != nil {
		t.Errorf("list containers: %v", err)
		return
	}
	for _, c := range containers.Containers {
		if c.State != runtimeapi.ContainerState_CONTAINER_EXITED {
			t.Errorf("%s: container %s of pod %s is still %v", n.name, c.Id, uid, c.State)
		}
	}
}

// jailClaims maps the owner of each jail id claimed on the machine
// (NAMESPACE/ID of a container) to the id.
func jailClaims(t *testing.T) map[string]string {
	t.Helper()
	entries, err := os.ReadDir(secIDsDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Errorf("jail claims: %v", err)
	}
	claims := make(map[string]string)
	for _, e := range entries {
		owner, err := os.ReadFile(filepath.Join(secIDsDir, e.Name()))
		if err == nil {
			claims[strings.TrimSpace(string(owner))] = e.Name()
		}
	}
	return claims
}

// sandboxNetns returns the path of a sandbox's network namespace, as
// containerd's verbose sandbox status gives it ("" when it gives none).
func (n *kubeNode) sandboxNetns(ctx context.Context, t *testing.T, id string) string {
	t.Helper()
	st, err := n.cri.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: id, Verbose: true})
	if err != nil {
		t.Errorf("%s: status of sandbox %s: %v", n.name, id, err)
		return ""
	}
	// containerd's sandbox record holds the path; its runtime spec names
	// the same namespace.
	var info struct {
		Record struct {
			Metadata struct{ NetNSPath string }
		} `json:"sandboxMetadata"`
		Spec *specs.Spec `json:"runtimeSpec"`
	}
	if raw, ok := st.Info["info"]; ok {
		if err := json.Unmarshal([]byte(raw), &info); err != nil {
			t.Errorf("%s: verbose status of sandbox %s: %v", n.name, id, err)
		}
	}
	if path := info.Record.Metadata.NetNSPath; path != "" {
		return path
	}
	if info.Spec != nil && info.Spec.Linux != nil {
		for _, ns := range info.Spec.Linux.Namespaces {
			if ns.Type == specs.NetworkNamespace {
				return ns.Path
			}
		}
	}
	return ""
}

// sandboxID returns the id of the pod's one sandbox on node n.
func (n *kubeNode) sandboxID(ctx context.Context, t *testing.T, uid string) string {
	t.Helper()
	list, err := n.cri.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{
		LabelSelector: map[string]string{"io.kubernetes.pod.uid": uid},
	}})
	if err != nil || len(list.Items) != 1 {
		t.Fatalf("sandboxes of pod %s: %v, %v", uid, list, err)
	}
	return list.Items[0].Id
}
