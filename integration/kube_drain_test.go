package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
)

// The second node: a containerd and a kubelet of their own in a network
// namespace of their own, whose pod network is routed to the first
// node's over a veth pair between the two namespaces.
const (
	kubeNode2Name = "vmshim-node-2"
	kubeNode2IP   = "10.89.0.1"    // its CNI bridge's gateway (kubeNode2CNI)
	kubePodNet1   = "10.88.0.0/24" // the first node's pod network (bridgeCNI)
	kubePodNet2   = "10.89.0.0/24"
	// The link between the nodes: vmshim-node1 in the first node's
	// namespace, vmshim-node2 in the second's.
	kubeLink1IP = "10.87.0.1"
	kubeLink2IP = "10.87.0.2"
)

// kubeNode2CNI is the second node's network: the first node's, on its
// own subnet.
var kubeNode2CNI = strings.Replace(bridgeCNI, kubePodNet1, kubePodNet2, 1)

// addNode starts the second node (its containerd with the disk guests
// imported, its kubelet) and routes between the two pod networks; it is
// gone, with its Node object, when the test ends.
func (k *kubeCluster) addNode(ctx context.Context, t *testing.T) *kubeNode {
	t.Helper()
	start := time.Now()
	d := criDaemon(ctx, t, daemonOptions{cni: kubeNode2CNI}, "disk-agent.tar")
	n := k.newKubeNode(kubeNode2Name, kubeNode2IP, "kubelet-2", d)
	k.nodes = append(k.nodes, n)
	t.Cleanup(func() { k.removeNode(t, n) })
	if err := n.bridgeAddress(); err != nil {
		t.Fatal(err)
	}
	if err := n.connect(); err != nil {
		t.Fatal(err)
	}
	if err := k.route(n); err != nil {
		t.Fatal(err)
	}
	if err := k.startKubelet(kubeAPIServer(), n); err != nil {
		t.Fatalf("start the kubelet of %s: %v", n.name, err)
	}
	if err := k.waitNodeReady(ctx, n.name); err != nil {
		t.Fatalf("%v\n%s", err, tailFile(n.kubelet.log, 3000))
	}
	t.Logf("node %s (%s) Ready in %v", n.name, n.ip, time.Since(start).Round(time.Millisecond))
	return n
}

// route links the first node's namespace to n's with a veth pair,
// routes each pod network to the other node, and has both namespaces
// forward, as a node's CNI does between nodes.
func (k *kubeCluster) route(n *kubeNode) error {
	ns1, ns2 := env.daemon.netns, n.daemon.netns
	steps := [][]string{
		{"ip", "link", "add", "vmshim-node2", "netns", ns1, "type", "veth", "peer", "name", "vmshim-node1", "netns", ns2},
		{"ip", "-n", ns1, "addr", "add", kubeLink1IP + "/30", "dev", "vmshim-node2"},
		{"ip", "-n", ns2, "addr", "add", kubeLink2IP + "/30", "dev", "vmshim-node1"},
		{"ip", "-n", ns1, "link", "set", "vmshim-node2", "up"},
		{"ip", "-n", ns2, "link", "set", "vmshim-node1", "up"},
		{"ip", "-n", ns1, "route", "replace", kubePodNet2, "via", kubeLink2IP},
		{"ip", "-n", ns2, "route", "replace", kubePodNet1, "via", kubeLink1IP},
		{"nsenter", "--net=/run/netns/" + ns1, "--", "sysctl", "-qw", "net.ipv4.ip_forward=1"},
		{"nsenter", "--net=/run/netns/" + ns2, "--", "sysctl", "-qw", "net.ipv4.ip_forward=1"},
	}
	for _, s := range steps {
		if out, err := exec.Command(s[0], s[1:]...).CombinedOutput(); err != nil {
			return fmt.Errorf("%s: %v: %s", strings.Join(s, " "), err, out)
		}
	}
	return nil
}

// removeNode stops the second node's kubelet, removes what it leaves
// (sandboxes, cgroups, mounts), its Node object and the link to it. Its
// containerd and namespace go with the daemon.
func (k *kubeCluster) removeNode(t *testing.T, n *kubeNode) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if n.kubelet != nil {
		n.kubelet.stop()
		k.procs = slices.DeleteFunc(k.procs, func(p *kubeProc) bool { return p == n.kubelet })
	}
	k.nodes = slices.DeleteFunc(k.nodes, func(m *kubeNode) bool { return m == n })
	n.clean(ctx, t)
	unmountUnder(n.dir)
	for _, p := range processesMentioning(n.dir) {
		t.Errorf("process left by node %s: %s", n.name, p)
	}
	if err := k.client.CoreV1().Nodes().Delete(ctx, n.name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("delete node %s: %v", n.name, err)
	}
	_ = exec.Command("ip", "-n", env.daemon.netns, "link", "delete", "vmshim-node2").Run()
	_ = exec.Command("ip", "-n", env.daemon.netns, "route", "delete", kubePodNet2).Run()
}

// kubeDrainApp names the StatefulSet, its pod's label and its volume.
const kubeDrainApp = "vm-drain"

// testDrain: a StatefulSet of one VM whose root disk is on a local
// PersistentVolume both nodes see, suspended on stop. `kubectl drain` of
// its node moves it to the other: the guest resumes there with its RAM
// (a marker in its tmpfs, a process with the same PID, its uptime), takes
// the new pod's address, answers HTTP on it from the other node's
// network, and the node it left keeps nothing of it.
func (k *kubeCluster) testDrain(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*kubeTimeout)
	defer cancel()
	n2 := k.addNode(ctx, t)
	nodes := map[string]*kubeNode{k.node.name: k.node, n2.name: n2}
	vol := filepath.Join(k.dir, "volumes", kubeDrainApp)
	k.localVolume(ctx, t, kubeDrainApp, vol, k.node.name, n2.name)
	k.statefulSet(ctx, t, kubeDrainApp)

	first := k.waitPod(ctx, t, kubeDrainApp+"-0", "Ready", podReady)
	from, to := nodes[first.Spec.NodeName], n2
	if from == n2 {
		to = k.node
	}
	t.Logf("pod %s runs on %s at %s", first.Name, from.name, first.Status.PodIP)
	const marker = "vmshim-marker-in-ram"
	k.guestExec(ctx, t, first.Name, "sh", "-c", "echo "+marker+" >/run/marker")
	pid := strings.TrimSpace(k.guestExec(ctx, t, first.Name, "sh", "-c", "sleep 86400 </dev/null >/dev/null 2>&1 & echo $!"))
	upBefore := k.guestUptime(ctx, t, first.Name)
	sandbox, ctr := from.sandboxID(ctx, t, string(first.UID)), containerID(first)
	if netns := from.sandboxNetns(ctx, t, sandbox); netns == "" {
		t.Errorf("%s: sandbox %s has no network namespace path in its status", from.name, sandbox)
	} else if _, err := os.Stat(netns); err != nil {
		t.Errorf("%s: network namespace of the running pod: %v", from.name, err)
	}

	began := time.Now()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := k.kubectlOK(ctx, "uncordon", from.name); err != nil {
			t.Errorf("uncordon %s: %v", from.name, err)
		}
	})
	terminated := k.watchTerminated(ctx, t, first)
	out, err := k.kubectlOK(ctx, "drain", from.name, "--pod-selector", "app="+kubeDrainApp, "--timeout", "3m")
	if err != nil {
		t.Fatalf("%v\n%s", err, tailFile(from.daemon.logPath, 3000))
	}
	t.Logf("kubectl drain %s (%v):\n%s", from.name, time.Since(began).Round(time.Millisecond), strings.TrimSpace(out))
	select {
	case cs := <-terminated:
		if cs == nil {
			t.Errorf("%s: the drained pod's container was never seen terminated", from.name)
		} else if cs.ExitCode != 0 {
			t.Errorf("%s: the drained VM exited %d (%s: %s), want 0", from.name, cs.ExitCode, cs.Reason, cs.Message)
		}
	case <-time.After(30 * time.Second):
		t.Errorf("the watch of the drained pod never saw it deleted")
	}

	second := k.waitPod(ctx, t, first.Name, "Ready on "+to.name, func(p *corev1.Pod) bool {
		return p.UID != first.UID && p.Spec.NodeName == to.name && podReady(p)
	})
	t.Logf("pod %s Ready on %s at %s, %v after the drain began", second.Name, to.name, second.Status.PodIP, time.Since(began).Round(time.Millisecond))
	logs, err := k.kubectlOK(ctx, "-n", kubeNamespace, "logs", second.Name)
	if err != nil {
		t.Fatal(err)
	}
	if line := lineWith(logs, "vmshim: resumed the state saved on volume /data"); line == "" {
		t.Errorf("the pod on %s did not resume the state:\n%s", to.name, logs)
	} else {
		t.Logf("%s", line)
	}
	if lineWith(logs, "VMSHIM-DISK-BOOTS") != "" {
		t.Errorf("the guest booted again on %s", to.name)
	}
	if _, err := os.Stat(filepath.Join(vol, "vmshim-state")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the state is still on the volume after the resume: %v", err)
	}
	if got := strings.TrimSpace(k.guestExec(ctx, t, second.Name, "cat", "/run/marker")); got != marker {
		t.Errorf("the marker in the guest's RAM is %q on %s, want %q", got, to.name, marker)
	}
	if got := k.guestExec(ctx, t, second.Name, "cat", "/proc/"+pid+"/cmdline"); !strings.HasPrefix(got, "sleep\x0086400") {
		t.Errorf("process %s on %s runs %q, want the sleep started on %s", pid, to.name, got, from.name)
	}
	if upAfter := k.guestUptime(ctx, t, second.Name); upAfter < upBefore {
		t.Errorf("guest uptime %.1f s on %s, %.1f s on %s: it booted again", upAfter, to.name, upBefore, from.name)
	}
	k.waitGuestAddress(ctx, t, second.Name, second.Status.PodIP, first.Status.PodIP)
	t.Logf("the guest holds %s and no longer %s, %v after the drain began", second.Status.PodIP, first.Status.PodIP, time.Since(began).Round(time.Millisecond))
	// The console goes on: the guest's carrier came back and it took the
	// new pod's lease, which its console says.
	logs, err = k.kubectlOK(ctx, "-n", kubeNamespace, "logs", second.Name)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"VMSHIM-LINK-UP if=eth0", "VMSHIM-LEASE if=eth0 ip=" + second.Status.PodIP + " "} {
		if lineWith(logs, m) == "" {
			t.Errorf("kubectl logs of the resumed guest: no %q", m)
		}
	}
	k.portForward(ctx, t, second.Name, "VMSHIM-HTTP-OK "+second.Name)
	// From the node it left: the request crosses from one pod network
	// to the other.
	if body := httpGet(ctx, t, from.netns, second.Status.PodIP); !strings.Contains(body, "VMSHIM-HTTP-OK") {
		t.Errorf("GET http://%s:8080 from %s: %q", second.Status.PodIP, from.name, body)
	}
	k.assertPodGone(ctx, t, from, string(first.UID), sandbox, ctr)
}

// watchTerminated watches pod p until it is deleted, and sends the last
// terminated state of its first container the API server showed (nil if
// none), which the kubelet writes before it lets the pod go.
func (k *kubeCluster) watchTerminated(ctx context.Context, t *testing.T, p *corev1.Pod) <-chan *corev1.ContainerStateTerminated {
	t.Helper()
	w, err := k.client.CoreV1().Pods(p.Namespace).Watch(ctx, metav1.ListOptions{
		FieldSelector:   fields.OneTermEqualSelector("metadata.name", p.Name).String(),
		ResourceVersion: p.ResourceVersion,
	})
	if err != nil {
		t.Fatalf("watch pod %s: %v", p.Name, err)
	}
	out := make(chan *corev1.ContainerStateTerminated, 1)
	go func() {
		defer w.Stop()
		var last *corev1.ContainerStateTerminated
		defer func() { out <- last }()
		for ev := range w.ResultChan() {
			got, ok := ev.Object.(*corev1.Pod)
			if !ok || got.UID != p.UID {
				continue
			}
			if len(got.Status.ContainerStatuses) > 0 && got.Status.ContainerStatuses[0].State.Terminated != nil {
				last = got.Status.ContainerStatuses[0].State.Terminated
			}
			if ev.Type == watch.Deleted {
				return
			}
		}
	}()
	return out
}

// guestExec runs a command in the pod's guest with kubectl exec, which
// must succeed, and returns its stdout.
func (k *kubeCluster) guestExec(ctx context.Context, t *testing.T, pod string, cmd ...string) string {
	t.Helper()
	out, err := k.kubectlOK(ctx, append([]string{"-n", kubeNamespace, "exec", pod, "--"}, cmd...)...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// guestUptime returns the guest's uptime in seconds.
func (k *kubeCluster) guestUptime(ctx context.Context, t *testing.T, pod string) float64 {
	t.Helper()
	var up float64
	if _, err := fmt.Sscan(k.guestExec(ctx, t, pod, "cat", "/proc/uptime"), &up); err != nil {
		t.Fatalf("guest uptime: %v", err)
	}
	return up
}

// waitGuestAddress waits until the guest's eth0 holds ip and no longer
// old: the resumed guest asks for its address again once its carrier
// comes back.
func (k *kubeCluster) waitGuestAddress(ctx context.Context, t *testing.T, pod, ip, old string) {
	t.Helper()
	wait, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var addrs string
	err := k.poll(wait, "the guest to hold "+ip, time.Second, func() (bool, error) {
		out, err := k.kubectlOK(wait, "-n", kubeNamespace, "exec", pod, "--", "ip", "-4", "-o", "addr", "show", "dev", "eth0")
		addrs = out
		return err == nil && strings.Contains(out, " "+ip+"/") && !strings.Contains(out, " "+old+"/"), err
	})
	if err != nil {
		t.Errorf("%v: eth0 has\n%s", err, addrs)
	}
}

// localVolume makes the StorageClass of local volumes and one local
// PersistentVolume at dir that the named nodes reach (on this machine,
// all of them see the same directory), both named app; they go when the
// test ends.
func (k *kubeCluster) localVolume(ctx context.Context, t *testing.T, app, dir string, nodes ...string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	wait := storagev1.VolumeBindingWaitForFirstConsumer
	retain := corev1.PersistentVolumeReclaimRetain
	sc := &storagev1.StorageClass{
		ObjectMeta:        metav1.ObjectMeta{Name: app},
		Provisioner:       "kubernetes.io/no-provisioner",
		VolumeBindingMode: &wait,
		ReclaimPolicy:     &retain,
	}
	if _, err := k.client.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create storage class: %v", err)
	}
	fs := corev1.PersistentVolumeFilesystem
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: app},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("2Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: retain,
			StorageClassName:              app,
			VolumeMode:                    &fs,
			PersistentVolumeSource:        corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: dir}},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: nodes}},
			}}}},
		},
	}
	if _, err := k.client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create persistent volume: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := k.client.CoreV1().PersistentVolumes().Delete(ctx, pv.Name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("delete persistent volume: %v", err)
		}
		if err := k.client.StorageV1().StorageClasses().Delete(ctx, sc.Name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("delete storage class: %v", err)
		}
	})
}

// statefulSet creates the StatefulSet app of one VM: the disk guest with
// its agent, its root disk on the volume its claim template asks for (of
// the StorageClass app), saved on stop. It is deleted, with its pod and
// claim, when the test ends, unless the test deleted it itself.
func (k *kubeCluster) statefulSet(ctx context.Context, t *testing.T, app string) {
	t.Helper()
	tmpl := vmPod(app, imageDiskAgent)
	tmpl.Annotations = map[string]string{annotationRootDiskVolume: "/data", "vmshim.io/on-stop": "suspend"}
	tmpl.Spec.Containers[0].ReadinessProbe = execProbe(guestServes...)
	tmpl.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "disk", MountPath: "/data"}}
	one := int32(1)
	sc := app
	ss := &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: app, Namespace: kubeNamespace},
		Spec: appsv1.StatefulSetSpec{
			Replicas:    &one,
			ServiceName: app,
			Selector:    &metav1.LabelSelector{MatchLabels: tmpl.Labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: tmpl.Labels, Annotations: tmpl.Annotations},
				Spec:       tmpl.Spec,
			},
			VolumeClaimTemplates: []corev1.PersistentVolumeClaim{{
				ObjectMeta: metav1.ObjectMeta{Name: "disk"},
				Spec: corev1.PersistentVolumeClaimSpec{
					AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
					StorageClassName: &sc,
					Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("2Gi")}},
				},
			}},
		},
	}
	if _, err := k.client.AppsV1().StatefulSets(kubeNamespace).Create(ctx, ss, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create statefulset: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		fg := metav1.DeletePropagationForeground
		if err := k.client.AppsV1().StatefulSets(kubeNamespace).Delete(ctx, ss.Name, metav1.DeleteOptions{PropagationPolicy: &fg}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete statefulset: %v", err)
		}
		if err := k.poll(ctx, "the statefulset's pod to go", time.Second, func() (bool, error) {
			left, err := k.client.CoreV1().Pods(kubeNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app=" + app})
			return err == nil && len(left.Items) == 0, err
		}); err != nil {
			t.Errorf("%v", err)
		}
		claim := "disk-" + app + "-0"
		if err := k.client.CoreV1().PersistentVolumeClaims(kubeNamespace).Delete(ctx, claim, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete claim %s: %v", claim, err)
		}
	})
}

// lineWith returns the first line of text that holds s, or "".
func lineWith(text, s string) string {
	for line := range strings.Lines(text) {
		if strings.Contains(line, s) {
			return strings.TrimSpace(line)
		}
	}
	return ""
}
