package integration

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The soak: every kind of VM pod, one after another, over and over, for
// a bounded time, with a long-lived VM pod beside them whose shim serves
// exec, exec -it, port-forward and logs all along.
const (
	// envKubeSoak is how long the soak runs its rounds (a Go duration):
	// unset, one round of every kind (make test); make test-reliability
	// sets one hour. A round that has begun is finished.
	envKubeSoak = "VMSHIM_KUBE_SOAK"
	// soakCycleBound bounds one cycle: its pods, the resident's turn and
	// the node's check.
	soakCycleBound = 6 * time.Minute
	// soakCleanBound bounds how long the node may take to be as it was
	// once a cycle's pods are gone: a forced delete leaves the kubelet
	// to stop the pod after the API server has forgotten it.
	soakCleanBound = 3 * time.Minute
	// The resident VM's shim may hold this much more at the end than
	// after its first turn: what a turn starts must end with it.
	soakGoroutineSlack = 10
	soakFDSlack        = 8
	soakRSSSlackKiB    = 24 << 10
	// soakResident names the long-lived VM pod.
	soakResident = "soak-resident"
)

// soakKind is one kind of pod's life, run as one cycle.
type soakKind struct {
	name string
	what string // what the cycle does, for the table
	run  func(s *soak, ctx context.Context, t *testing.T, name string)
}

// soakKinds is a round, in order.
var soakKinds = []soakKind{
	{"kernel", "kernel boot, HTTP probe; exec, HTTP at the pod IP; graceful delete", (*soak).kernelCycle},
	{"disk-forced", "disk boot, exec probe; exec; forced delete (grace 0)", (*soak).diskForcedCycle},
	{"url", "disk by URL from a server on the node; HTTP probe; graceful delete", (*soak).urlCycle},
	{"root-disk", "root disk on an emptyDir volume; a write synced to it; graceful delete", (*soak).rootDiskCycle},
	{"suspend", "suspend on delete to a hostPath volume, resume in a new pod, forced delete", (*soak).suspendCycle},
	{"mixed", "init container, native sidecar and VM; exec and logs on each", (*soak).mixedCycle},
	{"resize", "in-place resize up and down; graceful delete", (*soak).resizeCycle},
	{"ctr", "through containerd's client as ctr: start, SIGTERM, remove", (*soak).ctrCycle},
}

// soak holds the state of one soak run.
type soak struct {
	k        *kubeCluster
	started  time.Time
	base     nodeState // the node with only the resident running
	resident *corev1.Pod
	disk     *diskServer
	diskSum  string
	cached   bool // the URL kind's disk is in the base's disk cache
	tallies  map[string]*soakTally
	samples  []soakSample
}

// soakTally is what the cycles of one kind did.
type soakTally struct {
	ran, failed int
	total, max  time.Duration
}

// soakSample is what the long-lived processes held at one moment.
type soakSample struct {
	at                  time.Duration
	shim, containerd    procUse
	kubelet             procUse
	shimGoroutines      int
	cyclesBefore, round int
}

// procUse is a process's resident memory (KiB) and open fds.
type procUse struct{ rssKiB, fds int }

// testSoak runs rounds of soakKinds through the kubelet (and one through
// containerd's client) until envKubeSoak has passed, with a resident VM
// pod whose exec, exec -it, port-forward and logs are used after every
// cycle. After every cycle the node must hold nothing the resident does
// not (processes, mounts, links, qdiscs, cgroups, jail claims, runtime
// dirs, bundles, the disk cache beyond the one disk the URL kind keeps);
// after every round it samples the resident's shim (RSS, fds, goroutines
// from the stack dump containerd's shim library writes on SIGUSR1),
// containerd and the kubelet. It ends with a table of what ran, what
// failed and what grew, and fails when the resident's shim grew.
func (k *kubeCluster) testSoak(t *testing.T) {
	dur := soakDuration(t)
	s := &soak{k: k, started: time.Now(), tallies: map[string]*soakTally{}}
	ctx, cancel := context.WithTimeout(context.Background(), kubeTimeout)
	defer cancel()
	importBusybox(ctx, t, criNamespace)
	disk := bootDiskFile(t)
	s.disk = startDiskServerAt(t, net.JoinHostPort(k.node.ip, "0"), map[string][]byte{"/soak.qcow2": disk})
	s.diskSum = digestOf(disk)
	empty := k.node.state(t)

	pod := vmPod(soakResident, imageKernelAgent)
	pod.Spec.Containers[0].ReadinessProbe = execProbe(guestServes...)
	s.resident = k.runReadyPod(ctx, t, pod)
	if !t.Run("resident", func(t *testing.T) { s.residentTurn(t) }) {
		t.FailNow()
	}
	s.base = k.node.state(t)
	s.sample(t, 0, 0)

	cycles := 0
	deadline := s.started.Add(dur)
	for round := 1; ; round++ {
		for _, kind := range soakKinds {
			cycles++
			start := time.Now()
			ok := t.Run(fmt.Sprintf("%d-%s", round, kind.name), func(t *testing.T) {
				s.cycle(t, kind, fmt.Sprintf("soak-%s-%d", kind.name, round))
			})
			s.tally(kind.name, time.Since(start), ok)
		}
		s.sample(t, round, cycles)
		if !time.Now().Before(deadline) {
			break
		}
	}
	t.Logf("soak of %v: %d rounds, %d cycles\n%s", time.Since(s.started).Round(time.Second), len(s.samples)-1, cycles, s.table())
	s.checkGrowth(t)

	// The soak outlives the setup's context: the teardown has its own.
	ctx, cancel = context.WithTimeout(context.Background(), soakCleanBound)
	defer cancel()
	k.deletePods(ctx, t, soakResident)
	empty["disk cache"] = s.base["disk cache"] // the URL kind's disk stays cached, by design
	if err := k.poll(ctx, "the node to be as before the soak", time.Second, func() (bool, error) {
		return k.node.state(t).equal(empty), nil
	}); err != nil {
		t.Errorf("%v: what it holds that it did not:\n%s", err, k.node.state(t).diff(empty))
	}
}

// soakDuration reads envKubeSoak: 0 (one round) when unset.
func soakDuration(t *testing.T) time.Duration {
	t.Helper()
	v := os.Getenv(envKubeSoak)
	if v == "" {
		return 0
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		t.Fatalf("%s=%q: want a duration such as 1h", envKubeSoak, v)
	}
	return d
}

// cycle runs one kind's pod life, then the resident's turn, then waits
// until the node is as it was with the resident alone.
func (s *soak) cycle(t *testing.T, kind soakKind, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), soakCycleBound)
	defer cancel()
	kind.run(s, ctx, t, name)
	s.residentTurn(t)
	s.checkNode(ctx, t, kind.name)
}

// checkNode waits until the node holds nothing that it did not hold with
// the resident alone. The first URL cycle adds its disk to the cache,
// which keeps it: the base takes it then, and a later cycle may add
// nothing more.
func (s *soak) checkNode(ctx context.Context, t *testing.T, kind string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, soakCleanBound)
	defer cancel()
	start := time.Now()
	var after nodeState
	err := s.k.poll(ctx, "the node to be as it was", time.Second, func() (bool, error) {
		after = s.k.node.state(t)
		if kind == "url" && !s.cached {
			cache := nodeState{"disk cache": after["disk cache"]}
			t.Logf("the disk cache keeps the URL's disk: %s", strings.TrimSpace(cache.diff(s.base)))
			s.base["disk cache"], s.cached = after["disk cache"], true
		}
		return after.equal(s.base), nil
	})
	if err != nil {
		t.Errorf("%v after %.0f s; what it holds that it did not:\n%s", err, time.Since(start).Seconds(), after.diff(s.base))
	}
}

// tally counts one cycle of kind.
func (s *soak) tally(kind string, d time.Duration, ok bool) {
	n := s.tallies[kind]
	if n == nil {
		n = &soakTally{}
		s.tallies[kind] = n
	}
	n.ran++
	if !ok {
		n.failed++
	}
	n.total += d
	n.max = max(n.max, d)
}

// residentTurn uses the resident pod as users do: exec with and without
// stdin, exec -it on a terminal, port-forward and logs. Its container
// must not have restarted.
func (s *soak) residentTurn(t *testing.T) {
	t.Helper()
	k, p := s.k, s.resident
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	k.testExec(t, p)
	tty := k.startKubectlTTY(ctx, t, 24, 80, "-n", kubeNamespace, "exec", "-it", p.Name, "--", "sh")
	tty.waitFor("# ")
	tty.typ("echo soak-$((6*7))\r")
	tty.waitFor("soak-42")
	tty.typ("exit 5\r")
	tty.exit(ctx, 5)
	k.portForward(ctx, t, p.Name, fmt.Sprintf("VMSHIM-HTTP-OK %s %s", p.Name, p.Status.PodIP))
	if out, err := k.kubectlOK(ctx, "-n", kubeNamespace, "logs", "--tail=200", p.Name); err != nil {
		t.Errorf("kubectl logs %s: %v", p.Name, err)
	} else if len(out) == 0 {
		t.Errorf("kubectl logs %s: nothing", p.Name)
	}
	cur, err := k.client.CoreV1().Pods(kubeNamespace).Get(ctx, p.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if r := restarts(cur); r != 0 || !podReady(cur) {
		t.Errorf("resident pod: ready %v, %d restarts", podReady(cur), r)
	}
}

// kernelCycle: a kernel-booted VM Ready through an HTTP probe; exec; its
// page at the pod IP; a graceful delete.
func (s *soak) kernelCycle(ctx context.Context, t *testing.T, name string) {
	pod := vmPod(name, imageKernelAgent)
	pod.Spec.Containers[0].ReadinessProbe = httpProbe(8080)
	p := s.k.runReadyPod(ctx, t, pod)
	s.guestHostname(ctx, t, p)
	if body := s.k.httpGet(ctx, t, p.Status.PodIP, 8080); !strings.Contains(body, "VMSHIM-HTTP-OK "+name) {
		t.Errorf("http://%s:8080/: %q", p.Status.PodIP, body)
	}
	s.k.deletePods(ctx, t, name)
}

// diskForcedCycle: a disk-booted VM Ready through an exec probe; exec; a
// forced delete, as `kubectl delete --grace-period=0 --force` makes it.
func (s *soak) diskForcedCycle(ctx context.Context, t *testing.T, name string) {
	pod := vmPod(name, imageDiskAgent)
	pod.Spec.Containers[0].ReadinessProbe = execProbe(guestServes...)
	p := s.k.runReadyPod(ctx, t, pod)
	s.guestHostname(ctx, t, p)
	s.forceDelete(ctx, t, name)
}

// urlCycle: a VM whose disk comes by URL from a server on the node, its
// image the pause image; Ready through an HTTP probe; graceful delete.
func (s *soak) urlCycle(ctx context.Context, t *testing.T, name string) {
	pod := vmPod(name, pauseImage)
	pod.Annotations = map[string]string{annotationDiskURL: s.disk.url("/soak.qcow2"), annotationDiskSHA256: s.diskSum}
	pod.Spec.Containers[0].ReadinessProbe = httpProbe(8080)
	p := s.k.runReadyPod(ctx, t, pod)
	if body := s.k.httpGet(ctx, t, p.Status.PodIP, 8080); !strings.Contains(body, "VMSHIM-HTTP-OK") {
		t.Errorf("http://%s:8080/: %q", p.Status.PodIP, body)
	}
	s.k.deletePods(ctx, t, name)
}

// rootDiskCycle: a VM whose root disk the shim keeps on an emptyDir
// volume; a file written and synced in the guest; a graceful delete.
func (s *soak) rootDiskCycle(ctx context.Context, t *testing.T, name string) {
	pod := vmPod(name, imageDiskAgent)
	pod.Annotations = map[string]string{annotationRootDiskVolume: "/data"}
	pod.Spec.Volumes = []corev1.Volume{{Name: "disk", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "disk", MountPath: "/data"}}
	pod.Spec.Containers[0].ReadinessProbe = execProbe(guestServes...)
	p := s.k.runReadyPod(ctx, t, pod)
	if out, err := s.k.kubectlOK(ctx, "-n", kubeNamespace, "exec", p.Name, "--", "sh", "-c", "echo soak >/soak && sync && cat /soak"); err != nil || out != "soak\n" {
		t.Errorf("a write to the root disk: %q, %v", out, err)
	}
	s.k.deletePods(ctx, t, name)
}

// suspendCycle: a VM on a hostPath volume, suspended on delete; the next
// pod on the volume resumes it with its RAM (a marker in its tmpfs); that
// one is deleted by force, and the volume removed.
func (s *soak) suspendCycle(ctx context.Context, t *testing.T, name string) {
	dir := filepath.Join(s.k.dir, "volumes", name)
	t.Cleanup(func() { os.RemoveAll(dir) })
	dirOrCreate := corev1.HostPathDirectoryOrCreate
	mk := func() *corev1.Pod {
		pod := vmPod(name, imageDiskAgent)
		pod.Annotations = map[string]string{annotationRootDiskVolume: "/data", "vmshim.io/on-stop": "suspend"}
		pod.Spec.Volumes = []corev1.Volume{{Name: "disk", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: dir, Type: &dirOrCreate}}}}
		pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "disk", MountPath: "/data"}}
		pod.Spec.Containers[0].ReadinessProbe = execProbe(guestServes...)
		return pod
	}
	first := s.k.runReadyPod(ctx, t, mk())
	marker := fmt.Sprintf("soak-marker-%d", time.Now().UnixNano())
	if _, err := s.k.kubectlOK(ctx, "-n", kubeNamespace, "exec", first.Name, "--", "sh", "-c", "echo "+marker+" >/run/marker"); err != nil {
		t.Fatalf("write the marker: %v", err)
	}
	s.k.deletePods(ctx, t, name)
	if _, err := os.Stat(filepath.Join(dir, "vmshim-state")); err != nil {
		t.Fatalf("no state on the volume after the delete: %v", err)
	}
	second := s.k.runReadyPod(ctx, t, mk())
	logs, err := s.k.kubectlOK(ctx, "-n", kubeNamespace, "logs", second.Name)
	if err != nil {
		t.Fatal(err)
	}
	if lineWith(logs, "vmshim: resumed the state saved on volume /data") == "" {
		t.Errorf("the second pod did not resume the state:\n%s", logs)
	}
	if out, err := s.k.kubectlOK(ctx, "-n", kubeNamespace, "exec", second.Name, "--", "cat", "/run/marker"); err != nil || strings.TrimSpace(out) != marker {
		t.Errorf("the marker in the resumed guest's RAM: %q, %v; want %q", out, err, marker)
	}
	s.forceDelete(ctx, t, name)
}

// mixedCycle: an init container writes into an emptyDir, a native
// sidecar serves it, the VM runs beside them; exec and logs on each
// ordinary container; a graceful delete.
func (s *soak) mixedCycle(ctx context.Context, t *testing.T, name string) {
	always := corev1.ContainerRestartPolicyAlways
	www := []corev1.VolumeMount{{Name: "www", MountPath: "/www"}}
	pod := vmPod(name, imageKernelAgent)
	pod.Spec.Volumes = []corev1.Volume{{Name: "www", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	initC := busyboxContainer("init", "echo VMSHIM-SIDECAR-OK >/www/index.html && echo init done")
	initC.VolumeMounts = www
	side := busyboxContainer("side", "exec /bin/busybox httpd -f -p 8081 -h /www")
	side.RestartPolicy, side.VolumeMounts = &always, www
	pod.Spec.InitContainers = []corev1.Container{initC, side}
	pod.Spec.Containers[0].ReadinessProbe = execProbe(guestServes...)
	p := s.k.runReadyPod(ctx, t, pod)
	if out, err := s.k.kubectlOK(ctx, "-n", kubeNamespace, "logs", name, "-c", "init"); err != nil || !strings.Contains(out, "init done") {
		t.Errorf("kubectl logs -c init: %q, %v", out, err)
	}
	for _, url := range []string{"http://127.0.0.1:8081/", fmt.Sprintf("http://%s:8080/", p.Status.PodIP)} {
		out, err := s.k.kubectlOK(ctx, "-n", kubeNamespace, "exec", name, "-c", "side", "--", "/bin/busybox", "wget", "-q", "-O-", url)
		if err != nil || !strings.Contains(out, "VMSHIM-") {
			t.Errorf("GET %s from the sidecar: %q, %v", url, out, err)
		}
	}
	s.guestHostname(ctx, t, p)
	s.k.deletePods(ctx, t, name)
}

// resizeCycle: the agent guest resized in place up and back
// (testResize), then deleted.
func (s *soak) resizeCycle(ctx context.Context, t *testing.T, name string) {
	pod := vmPod(name, imageKernelAgent)
	pod.Annotations = map[string]string{"vmshim.io/max-memory": "512Mi"}
	pod.Spec.Containers[0].Resources.Limits[corev1.ResourceCPU] = resource.MustParse("1")
	pod.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(kubeCPURequest)}
	pod.Spec.Containers[0].ReadinessProbe = execProbe(guestServes...)
	p := s.k.runReadyPod(ctx, t, pod)
	s.k.testResize(t, p)
	s.k.deletePods(ctx, t, name)
}

// ctrCycle: a VM task through containerd's client, as ctr runs one, in a
// network namespace the shim makes: started, booted, stopped with
// SIGTERM (the guest powers off: exit 0), removed.
func (s *soak) ctrCycle(ctx context.Context, t *testing.T, _ string) {
	v := startVM(ctx, t, imageKernelWait)
	v.console.waitFor(ctx, t, markerBooted)
	if err := v.task.Kill(ctx, syscall.SIGTERM); err != nil {
		t.Fatalf("kill: %v", err)
	}
	if code := v.waitExit(ctx, t); code != 0 {
		t.Errorf("exit %d after SIGTERM, want 0", code)
	}
	v.remove(t)
}

// guestHostname checks that exec reaches the pod's guest.
func (s *soak) guestHostname(ctx context.Context, t *testing.T, p *corev1.Pod) {
	t.Helper()
	if out, err := s.k.kubectlOK(ctx, "-n", kubeNamespace, "exec", p.Name, "-c", "vm", "--", "hostname"); err != nil || strings.TrimSpace(out) != p.Name {
		t.Errorf("kubectl exec %s hostname: %q, %v", p.Name, out, err)
	}
}

// forceDelete deletes the pod with a grace period of 0, as `kubectl
// delete --grace-period=0 --force`: the API server forgets it at once
// and the kubelet stops it after (the cycle's node check waits for that).
func (s *soak) forceDelete(ctx context.Context, t *testing.T, name string) {
	t.Helper()
	if _, err := s.k.kubectlOK(ctx, "-n", kubeNamespace, "delete", "pod", name, "--grace-period=0", "--force"); err != nil {
		t.Errorf("forced delete of %s: %v", name, err)
	}
}

// sample records what the resident's shim, containerd and the kubelet
// hold now.
func (s *soak) sample(t *testing.T, round, cycles int) {
	t.Helper()
	pid := s.residentShim(t)
	smp := soakSample{
		at: time.Since(s.started), round: round, cyclesBefore: cycles,
		shim:           readProcUse(t, pid),
		shimGoroutines: shimGoroutines(t, s.k.node.daemon, pid),
		containerd:     readProcUse(t, s.k.node.daemon.cmd.Process.Pid),
		kubelet:        readProcUse(t, s.k.node.kubelet.cmd.Process.Pid),
	}
	s.samples = append(s.samples, smp)
	t.Logf("round %d (%d cycles, %v): resident shim %d KiB, %d fds, %d goroutines; containerd %d KiB, %d fds; kubelet %d KiB, %d fds",
		round, cycles, smp.at.Round(time.Second), smp.shim.rssKiB, smp.shim.fds, smp.shimGoroutines,
		smp.containerd.rssKiB, smp.containerd.fds, smp.kubelet.rssKiB, smp.kubelet.fds)
}

// residentShim returns the pid of the resident pod's shim: the VM shim
// whose command line names the pod's sandbox.
func (s *soak) residentShim(t *testing.T) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sandbox := s.k.node.sandboxID(ctx, t, string(s.resident.UID))
	shims := shimsOf(sandbox)
	if len(shims) != 1 {
		t.Fatalf("the shims of sandbox %s: %v, want one", sandbox, shims)
	}
	pid, _, _ := strings.Cut(shims[0], ":")
	n, err := strconv.Atoi(pid)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// readProcUse reads pid's resident memory (vmRSS) and counts its open
// fds.
func readProcUse(t *testing.T, pid int) procUse {
	t.Helper()
	entries, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	return procUse{rssKiB: int(vmRSS(t, pid)), fds: len(entries)}
}

// goroutineRE matches the header of one goroutine in a stack dump; in
// the log line that holds the dump, its newlines are escaped.
var goroutineRE = regexp.MustCompile(`goroutine \d+ \[`)

// shimGoroutines counts the goroutines of the shim pid in its stack
// dump (shimStackDump).
func shimGoroutines(t *testing.T, d *daemon, pid int) int {
	t.Helper()
	dump, err := shimStackDump(d, pid, 20*time.Second)
	if err != nil {
		t.Error(err)
		return 0
	}
	return len(goroutineRE.FindAllStringIndex(dump, -1))
}

// checkGrowth fails when the resident's shim holds more at the end than
// after its first turn, beyond the slack.
func (s *soak) checkGrowth(t *testing.T) {
	t.Helper()
	first, last := s.samples[0], s.samples[len(s.samples)-1]
	if g := last.shimGoroutines - first.shimGoroutines; g > soakGoroutineSlack {
		t.Errorf("the resident's shim went from %d to %d goroutines", first.shimGoroutines, last.shimGoroutines)
	}
	if g := last.shim.fds - first.shim.fds; g > soakFDSlack {
		t.Errorf("the resident's shim went from %d to %d fds", first.shim.fds, last.shim.fds)
	}
	if g := last.shim.rssKiB - first.shim.rssKiB; g > soakRSSSlackKiB {
		t.Errorf("the resident's shim went from %d to %d KiB", first.shim.rssKiB, last.shim.rssKiB)
	}
}

// table formats what ran and failed by kind, and the samples' first,
// highest and last figures.
func (s *soak) table() string {
	var b strings.Builder
	fmt.Fprintf(&b, "| kind | what | cycles | failed | mean s | max s |\n|---|---|---|---|---|---|\n")
	for _, kind := range soakKinds {
		n := s.tallies[kind.name]
		if n == nil {
			continue
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %d | %.1f | %.1f |\n", kind.name, kind.what, n.ran, n.failed,
			n.total.Seconds()/float64(n.ran), n.max.Seconds())
	}
	fmt.Fprintf(&b, "\n| process | figure | after the first turn | highest | at the end |\n|---|---|---|---|---|\n")
	row := func(proc, what string, f func(soakSample) int) {
		hi := 0
		for _, smp := range s.samples {
			hi = max(hi, f(smp))
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %d | %d |\n", proc, what, f(s.samples[0]), hi, f(s.samples[len(s.samples)-1]))
	}
	row("resident's shim", "RSS KiB", func(x soakSample) int { return x.shim.rssKiB })
	row("resident's shim", "fds", func(x soakSample) int { return x.shim.fds })
	row("resident's shim", "goroutines", func(x soakSample) int { return x.shimGoroutines })
	row("containerd", "RSS KiB", func(x soakSample) int { return x.containerd.rssKiB })
	row("containerd", "fds", func(x soakSample) int { return x.containerd.fds })
	row("kubelet", "RSS KiB", func(x soakSample) int { return x.kubelet.rssKiB })
	row("kubelet", "fds", func(x soakSample) int { return x.kubelet.fds })
	return b.String()
}
