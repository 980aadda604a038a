package integration

import (
	"context"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// The burst test: a Deployment of VM pods scaled from 0 to N and back to
// 0, twice, for each N of envKubeBurst, on the suite's node.
const (
	// envKubeBurst lists the burst sizes, comma-separated: 10 by
	// default (make test), 10,20,30 in make test-reliability and make
	// bench.
	envKubeBurst = "VMSHIM_KUBE_BURST"
	// kubeBurstApp names the Deployment and labels its pods.
	kubeBurstApp = "burst"
	// kubeBurstRounds is how often each size is scaled up and down.
	kubeBurstRounds = 2
	// kubeBurstReadyBase and kubeBurstReadyPerPod bound how long N pods
	// may take to be Ready: a guest's boot is CPU-bound under TCG, and
	// they share the node's two cores.
	kubeBurstReadyBase   = 2 * time.Minute
	kubeBurstReadyPerPod = 10 * time.Second
	// kubeBurstGoneBound bounds how long the node takes to be as it was
	// once the Deployment is at 0: the pods' grace, then the kubelet's
	// housekeeping.
	kubeBurstGoneBound = 3 * time.Minute
)

// testBurst scales a Deployment of kernel-booted VM pods (each Ready when
// its guest's httpd answers the kubelet's probe) from 0 to N and back to
// 0, twice for each N of envKubeBurst. Every pod must become Ready and
// every pod go, and the node must be left as it was: processes, mounts
// (network namespaces among them), links and qdiscs in the node's network
// namespace, cgroups under the kubelet's root, jail claims, shim runtime
// dirs, containerd's task bundles and the disk cache. It logs how long
// all N took to be Ready (make bench's burst section reports the same).
func (k *kubeCluster) testBurst(t *testing.T) {
	k.bursts(t, envInts(t, envKubeBurst, "10"))
}

// burstRun is one round of a burst: N pods scaled up, Ready, scaled down
// and gone.
type burstRun struct {
	Pods  int `json:"pods"`
	Round int `json:"round"`
	// ReadyS is from the scale to N until all N pods were Ready; GoneS
	// from the scale to 0 until no pod was left and the node held nothing
	// it did not hold before.
	ReadyS float64 `json:"all_ready_s"`
	GoneS  float64 `json:"node_clean_s"`
}

// bursts runs kubeBurstRounds rounds for each of sizes, in order, with
// one Deployment, and stops at the first round that fails.
func (k *kubeCluster) bursts(t *testing.T, sizes []int) []burstRun {
	t.Helper()
	before := k.node.state(t)
	tmpl := vmPod(kubeBurstApp, imageKernelAgent)
	tmpl.Spec.Containers[0].ReadinessProbe = httpProbe(8080)
	zero := int32(0)
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: kubeBurstApp, Namespace: kubeNamespace},
		Spec: appsv1.DeploymentSpec{
			Replicas: &zero,
			Selector: &metav1.LabelSelector{MatchLabels: maps.Clone(tmpl.Labels)},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: tmpl.Labels}, Spec: tmpl.Spec},
		},
	}
	var bound time.Duration
	for _, size := range sizes {
		bound += kubeBurstRounds * (burstReadyBound(size) + kubeBurstGoneBound)
	}
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	deps := k.client.AppsV1().Deployments(kubeNamespace)
	if _, err := deps.Create(ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create deployment: %v", err)
	}
	defer func() {
		fg := metav1.DeletePropagationForeground
		if err := deps.Delete(context.Background(), d.Name, metav1.DeleteOptions{PropagationPolicy: &fg}); err != nil {
			t.Errorf("delete deployment: %v", err)
		}
	}()
	var runs []burstRun
	var rows []string
	defer func() { t.Logf("bursts:\n%s", strings.Join(rows, "\n")) }()
	for _, size := range sizes {
		for round := range kubeBurstRounds {
			ready, gone, ok := k.burst(ctx, t, size, before)
			runs = append(runs, burstRun{Pods: size, Round: round + 1, ReadyS: ready.Seconds(), GoneS: gone.Seconds()})
			rows = append(rows, fmt.Sprintf("N=%d round %d: all Ready %.1f s after the scale to %d; node as it was %.1f s after the scale to 0",
				size, round+1, ready.Seconds(), size, gone.Seconds()))
			t.Log(rows[len(rows)-1])
			if !ok {
				return runs
			}
		}
	}
	return runs
}

// burst scales the Deployment to size, waits until every pod is Ready,
// scales it to 0, and waits until no pod is left and the node is as it
// was before. It returns both times and whether the round may go on.
func (k *kubeCluster) burst(ctx context.Context, t *testing.T, size int, before nodeState) (ready, gone time.Duration, ok bool) {
	t.Helper()
	deps := k.client.AppsV1().Deployments(kubeNamespace)
	// A merge patch of the replicas, as kubectl scale sends: a read and
	// an update would race the Deployment's controller, which writes the
	// object too (a conflict).
	scale := func(n int) {
		patch := []byte(fmt.Sprintf(`{"spec":{"replicas":%d}}`, n))
		if _, err := deps.Patch(ctx, kubeBurstApp, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatalf("scale %s to %d: %v", kubeBurstApp, n, err)
		}
	}
	list := func() []corev1.Pod {
		pods, err := k.client.CoreV1().Pods(kubeNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app=" + kubeBurstApp})
		if err != nil {
			return nil
		}
		return pods.Items
	}

	start := time.Now()
	scale(size)
	readyCtx, cancel := context.WithTimeout(ctx, burstReadyBound(size))
	err := k.poll(readyCtx, fmt.Sprintf("%d pods of %s Ready", size, kubeBurstApp), time.Second, func() (bool, error) {
		n := 0
		for _, p := range list() {
			if podReady(&p) {
				n++
			}
		}
		return n == size, nil
	})
	cancel()
	ready = time.Since(start)
	if err != nil {
		var states []string
		for _, p := range list() {
			why := p.Status.Reason
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodScheduled && c.Status != corev1.ConditionTrue {
					why += " " + c.Message
				}
			}
			states = append(states, fmt.Sprintf("%s %s ready=%v restarts=%d %s", p.Name, p.Status.Phase, podReady(&p), restarts(&p), why))
		}
		t.Errorf("N=%d: %v after %.0f s:\n%s", size, err, ready.Seconds(), strings.Join(states, "\n"))
	}
	for _, p := range list() {
		if r := restarts(&p); r != 0 {
			t.Errorf("N=%d: pod %s restarted %d times", size, p.Name, r)
		}
	}

	start = time.Now()
	scale(0)
	goneCtx, cancel := context.WithTimeout(ctx, kubeBurstGoneBound)
	defer cancel()
	var after nodeState
	err = k.poll(goneCtx, fmt.Sprintf("the %d pods of %s to go and the node to be as it was", size, kubeBurstApp), time.Second, func() (bool, error) {
		after = k.node.state(t)
		return len(list()) == 0 && after.equal(before), nil
	})
	gone = time.Since(start)
	if err != nil {
		var left []string
		for _, p := range list() {
			left = append(left, fmt.Sprintf("%s %s %s", p.Name, p.Status.Phase, p.Status.Reason))
		}
		t.Errorf("N=%d: %v after %.0f s: pods left: %v; what the node holds that it did not before:\n%s",
			size, err, gone.Seconds(), left, after.diff(before))
		return ready, gone, false
	}
	return ready, gone, !t.Failed()
}

// burstReadyBound is how long size pods may take to be Ready.
func burstReadyBound(size int) time.Duration {
	return kubeBurstReadyBase + time.Duration(size)*kubeBurstReadyPerPod
}

// restarts sums the restarts of a pod's containers.
func restarts(p *corev1.Pod) int {
	n := 0
	for _, s := range p.Status.ContainerStatuses {
		n += int(s.RestartCount)
	}
	return n
}

// nodeState is what a node holds of its pods, each part a sorted list.
type nodeState map[string][]string

// state reads what node n holds of its pods: the processes of VM pods
// (QEMU, shims, pause processes), the mounts under the daemon's and the
// kubelet's directories (pods' network namespaces are mounts under the
// daemon's state), the links and qdiscs of the node's network namespace,
// the pods' cgroups under the kubelet's root, the jail ids claimed, the
// shims' runtime dirs, containerd's task bundles (of the kubelet's
// namespace and of the one the tests use as ctr does) and every file
// and directory of the disk cache.
func (n *kubeNode) state(t *testing.T) nodeState {
	t.Helper()
	s := nodeState{}
	for _, p := range vmProcesses() {
		s["process"] = append(s["process"], p.pid+" "+p.args)
	}
	s["mount"] = append(mountsUnder(n.daemon.dir), mountsUnder(n.rootDir)...)
	netns := "/run/netns/" + n.daemon.netns
	s["link"] = linesOf(t, "nsenter", "--net="+netns, "--", "ip", "-o", "link", "show")
	for i, l := range s["link"] { // "3: veth1234@if2: <...> ... link/ether ..." -> "veth1234@if2"
		if f := strings.Fields(l); len(f) > 1 {
			s["link"][i] = strings.TrimSuffix(f[1], ":")
		}
	}
	s["qdisc"] = linesOf(t, "nsenter", "--net="+netns, "--", "tc", "qdisc", "show")
	// The kubelet's QoS cgroups (kubepods, kubepods/burstable) stay for
	// its lifetime once made; a pod's are below them, named pod<UID>.
	s["cgroup"] = slices.DeleteFunc(n.cgroupsLeft(), func(p string) bool { return !strings.Contains(p, "/pod") })
	s["jail claim"] = slices.Collect(maps.Keys(jailClaims(t)))
	// The node's boot slots are made once, by the first paced boot, and
	// kept.
	s["runtime dir"] = slices.DeleteFunc(dirNames("/run/vmshim"), func(n string) bool { return n == "boot-slots" })
	for _, ns := range []string{criNamespace, testNamespace} { // the kubelet's and ctr's
		for _, b := range dirNames(filepath.Join(n.daemon.dir, "state", "io.containerd.runtime.v2.task", ns)) {
			s["task bundle"] = append(s["task bundle"], ns+"/"+b)
		}
	}
	s["disk cache"] = treeNames(filepath.Join(n.daemon.dir, "disks"))
	for k := range s {
		slices.Sort(s[k])
	}
	return s
}

// equal reports whether s holds nothing that before did not.
func (s nodeState) equal(before nodeState) bool { return s.diff(before) == "" }

// diff lists, part by part, what s holds that before did not.
func (s nodeState) diff(before nodeState) string {
	var b strings.Builder
	for _, part := range slices.Sorted(maps.Keys(s)) {
		for _, v := range s[part] {
			if !slices.Contains(before[part], v) {
				fmt.Fprintf(&b, "  %s: %s\n", part, v)
			}
		}
	}
	return b.String()
}

// linesOf runs argv and returns its output's lines.
func linesOf(t *testing.T, argv ...string) []string {
	t.Helper()
	out, err := exec.Command(argv[0], argv[1:]...).Output()
	if err != nil {
		t.Errorf("%s: %v", strings.Join(argv, " "), err)
	}
	return strings.FieldsFunc(strings.TrimSpace(string(out)), func(r rune) bool { return r == '\n' })
}

// treeNames lists the paths below dir, relative to it; none when it does
// not exist. Entries that vanish during the walk are not listed.
func treeNames(dir string) []string {
	var out []string
	_ = filepath.WalkDir(dir, func(path string, _ fs.DirEntry, err error) error {
		if err == nil && path != dir {
			rel, _ := filepath.Rel(dir, path)
			out = append(out, rel)
		}
		return nil
	})
	return out
}

// dirNames lists the names in dir; none when it does not exist.
func dirNames(dir string) []string {
	entries, _ := os.ReadDir(dir)
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}
