package integration

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// kubeletConfig is the KubeletConfiguration of the test node. What this
// host needs: cgroup v1 allowed, swap tolerated, the cgroupfs driver under
// a cgroup root of the test's own. Pod logs and volume plugins under the
// test's directory, image garbage collection off (the suite's images are
// never pulled again), no iptables chains in the suite's namespace, and a
// crash-loop back-off capped at 10 s so that restarts come quickly.
const kubeletConfig = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: %[1]s
port: 10250
readOnlyPort: 0
healthzPort: 0
tlsCertFile: %[2]s.crt
tlsPrivateKeyFile: %[2]s.key
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: %[7]s
authorization:
  mode: Webhook
containerRuntimeEndpoint: unix://%[3]s
cgroupDriver: cgroupfs
cgroupRoot: %[4]s
cgroupsPerQOS: true
failCgroupV1: false
failSwapOn: false
podLogsDir: %[5]s/pod-logs
containerLogMaxSize: 10Mi
containerLogMaxFiles: 2
volumePluginDir: %[5]s/volume-plugins
resolvConf: %[5]s/resolv.conf
clusterDNS: [%[6]s]
clusterDomain: cluster.local
makeIPTablesUtilChains: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%%
  imagefs.available: 1%%
  nodefs.inodesFree: 1%%
crashLoopBackOff:
  maxContainerRestartPeriod: 10s
`

// kubeletSysctls are the machine-wide sysctls the kubelet sets when they
// differ, with the values it wants. In the kubelet's mount namespace each
// is a file already holding that value, so the host's stay as they are.
var kubeletSysctls = map[string]string{
	"vm/overcommit_memory":      "1",
	"vm/panic_on_oom":           "0",
	"kernel/panic":              "10",
	"kernel/panic_on_oops":      "1",
	"kernel/keys/root_maxkeys":  "1000000",
	"kernel/keys/root_maxbytes": "25000000",
}

// kubeletWrapper runs in a mount namespace of its own (a copy of the
// host's, propagation unchanged) and execs the kubelet. There it puts the
// sysctl files over /proc/sys, a directory of the test's over /var/log
// (the kubelet hard-codes /var/log/containers) and an overlay over
// /var/lib whose writes go to the test's directory (the device plugin
// manager hard-codes /var/lib/kubelet/device-plugins). The host's mounts
// are private, so none of this reaches the host; the kubelet's root dir
// is a shared mount, so the volumes the kubelet mounts there reach
// containerd.
const kubeletWrapper = `set -eu
dir=$1
shift
for f in $(cd "$dir/sysctl" && find . -type f); do
	mount --bind "$dir/sysctl/$f" "/proc/sys/$f"
done
mount --bind "$dir/var-log" /var/log
mount -t overlay overlay -o "lowerdir=/var/lib,upperdir=$dir/var-lib/upper,workdir=$dir/var-lib/work" /var/lib
exec "$@"
`

// kubeNode is one node of the cluster: a containerd and the kubelet
// that runs its pods on it, both in the containerd's network namespace,
// whose CNI bridge holds the node's address.
type kubeNode struct {
	name       string
	ip         string // the node's address: its CNI bridge's gateway
	stem       string // names its files: STEM.crt and STEM-serving.crt (its kubelet's certificates), logs/STEM.log
	daemon     *daemon
	netns      string // path of the daemon's network namespace
	dir        string // the node's files: kubelet config, sysctls, pod logs
	rootDir    string // the kubelet's --root-dir, a shared bind mount
	cgroupRoot string // the kubelet's cgroupRoot
	criConn    *grpc.ClientConn
	cri        runtimeapi.RuntimeServiceClient // the daemon's CRI, the kubelet's runtime
	kubelet    *kubeProc
}

// newKubeNode describes node name at ip on daemon d; stem names its
// files, certificates and cgroup root apart from other nodes'.
func (k *kubeCluster) newKubeNode(name, ip, stem string, d *daemon) *kubeNode {
	return &kubeNode{
		name:       name,
		ip:         ip,
		stem:       stem,
		daemon:     d,
		netns:      "/run/netns/" + d.netns,
		dir:        filepath.Join(k.dir, stem),
		rootDir:    filepath.Join(k.dir, stem, "root"),
		cgroupRoot: "/vmshim-" + stem + "-" + strings.TrimPrefix(filepath.Base(env.daemon.dir), "vmshim-it-"),
	}
}

// connect makes the node's CRI client.
func (n *kubeNode) connect() error {
	var err error
	if n.criConn, err = grpc.NewClient("unix://"+n.daemon.address, grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
		return fmt.Errorf("cri client of %s: %w", n.name, err)
	}
	n.cri = runtimeapi.NewRuntimeServiceClient(n.criConn)
	return nil
}

// bridgeAddress gives the node's CNI bridge its gateway address before
// the kubelet starts, so the node has a non-loopback IP; the bridge
// plugin later finds the bridge and the address it would have made.
func (n *kubeNode) bridgeAddress() error {
	ns := n.daemon.netns
	if exec.Command("ip", "-n", ns, "link", "show", kubeBridge).Run() != nil {
		if out, err := exec.Command("ip", "-n", ns, "link", "add", kubeBridge, "mtu", "1400", "type", "bridge").CombinedOutput(); err != nil {
			return fmt.Errorf("add bridge %s: %v: %s", kubeBridge, err, out)
		}
	}
	out, err := exec.Command("ip", "-n", ns, "-o", "addr", "show", "dev", kubeBridge).CombinedOutput()
	if err != nil {
		return fmt.Errorf("addresses of %s: %v: %s", kubeBridge, err, out)
	}
	if !strings.Contains(string(out), " "+n.ip+"/") {
		if out, err := exec.Command("ip", "-n", ns, "addr", "add", n.ip+"/24", "dev", kubeBridge).CombinedOutput(); err != nil {
			return fmt.Errorf("address %s on %s: %v: %s", n.ip, kubeBridge, err, out)
		}
	}
	if out, err := exec.Command("ip", "-n", ns, "link", "set", kubeBridge, "up").CombinedOutput(); err != nil {
		return fmt.Errorf("set %s up: %v: %s", kubeBridge, err, out)
	}
	return nil
}

// startKubelet prepares the node (certificates, cgroup root, root dir,
// sysctl files, resolv.conf) and runs its kubelet.
func (k *kubeCluster) startKubelet(server string, n *kubeNode) error {
	if err := k.pki.nodeCerts(n.stem, n.name, net.ParseIP(n.ip)); err != nil {
		return err
	}
	if _, err := k.pki.kubeconfig(n.stem, server); err != nil {
		return err
	}
	node := n.dir
	for _, d := range []string{"pod-logs", "volume-plugins", "var-log", "var-lib/upper", "var-lib/work", "sysctl"} {
		if err := os.MkdirAll(filepath.Join(node, d), 0o755); err != nil {
			return err
		}
	}
	for name, value := range kubeletSysctls {
		f := filepath.Join(node, "sysctl", name)
		if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(f, []byte(value+"\n"), 0o644); err != nil {
			return err
		}
	}
	resolv := fmt.Sprintf("nameserver %s\nsearch %s.svc.cluster.local svc.cluster.local cluster.local\n", kubeDNSIP, kubeNamespace)
	if err := os.WriteFile(filepath.Join(node, "resolv.conf"), []byte(resolv), 0o644); err != nil {
		return err
	}
	body := fmt.Sprintf(kubeletConfig, n.ip, k.pki.path(n.stem+"-serving"), n.daemon.address, n.cgroupRoot, node, kubeDNSIP, k.pki.path("ca.crt"))
	if err := os.WriteFile(filepath.Join(node, "kubelet.yaml"), []byte(body), 0o644); err != nil {
		return err
	}
	if err := n.makeCgroupRoot(); err != nil {
		return err
	}
	if err := os.MkdirAll(n.rootDir, 0o750); err != nil {
		return err
	}
	if err := syscall.Mount(n.rootDir, n.rootDir, "", syscall.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind mount %s: %w", n.rootDir, err)
	}
	if err := syscall.Mount("", n.rootDir, "", syscall.MS_SHARED, ""); err != nil {
		return fmt.Errorf("make %s shared: %w", n.rootDir, err)
	}
	return k.runKubelet(n)
}

// runKubelet runs the kubelet of node n, prepared by startKubelet, in a
// mount namespace of its own (kubeletWrapper).
func (k *kubeCluster) runKubelet(n *kubeNode) error {
	var err error
	n.kubelet, err = k.runIn(n.netns, n.stem, "unshare", "--mount", "--propagation", "unchanged", "--",
		"sh", "-c", kubeletWrapper, "kubelet-wrapper", n.dir,
		filepath.Join(k.bin, "kubelet"),
		"--config", filepath.Join(n.dir, "kubelet.yaml"),
		"--kubeconfig", k.pki.path(n.stem+".kubeconfig"),
		"--root-dir", n.rootDir,
		"--node-ip", n.ip,
		"--hostname-override", n.name,
		"--node-labels", kubeNodeLabel,
		"--v", "2")
	return err
}

// restartKubelet stops the kubelet of node n (SIGTERM to its process
// group, SIGKILL after 10 s) and runs it again with the same
// configuration and root dir, as a node's service manager restarts it.
// Its pods' containers go on running. The caller waits for the node to
// be Ready again.
func (k *kubeCluster) restartKubelet(n *kubeNode) error {
	old := n.kubelet
	old.stop()
	k.procs = slices.DeleteFunc(k.procs, func(p *kubeProc) bool { return p == old })
	return k.runKubelet(n)
}

// cgroupHierarchies lists the mounted cgroup hierarchies.
func cgroupHierarchies() []string {
	entries, _ := os.ReadDir(cgroupRoot)
	var out []string
	for _, e := range entries {
		if e.IsDir() {
			out = append(out, filepath.Join(cgroupRoot, e.Name()))
		}
	}
	return out
}

// makeCgroupRoot creates the kubelet's cgroup root in every hierarchy
// (the kubelet requires it to exist), the cpuset one with its parent's
// CPUs and memory nodes.
func (n *kubeNode) makeCgroupRoot() error {
	for _, h := range cgroupHierarchies() {
		dir := filepath.Join(h, n.cgroupRoot)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("cgroup root: %w", err)
		}
		if filepath.Base(h) != "cpuset" {
			continue
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			v, err := os.ReadFile(filepath.Join(h, f))
			if err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(dir, f), v, 0); err != nil {
				return fmt.Errorf("cgroup root %s: %w", f, err)
			}
		}
	}
	return nil
}

// cgroupsLeft lists the cgroups left at or below the kubelet's root in
// any hierarchy, deepest first.
func (n *kubeNode) cgroupsLeft() []string {
	var out []string
	for _, h := range cgroupHierarchies() {
		_ = filepath.WalkDir(filepath.Join(h, n.cgroupRoot), func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				out = append(out, p)
			}
			return nil
		})
	}
	sort.Slice(out, func(i, j int) bool { return strings.Count(out[i], "/") > strings.Count(out[j], "/") })
	return out
}

// stop deletes what the tests left in the cluster, stops every component
// (the kubelet first, etcd last) and removes the node's cgroups, mounts
// and files. It reports what it could not remove.
func (k *kubeCluster) stop(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if k.client != nil && k.exited() == nil {
		k.drain(ctx, t)
	}
	for i := len(k.procs) - 1; i >= 0; i-- {
		k.procs[i].stop()
	}
	k.node.clean(ctx, t)
	for _, p := range processesMentioning(k.dir) {
		t.Errorf("process left by the cluster: %s", p)
	}
	if os.Getenv("VMSHIM_KEEP") != "" {
		t.Logf("cluster files kept in %s", k.dir)
		return
	}
	unmountUnder(k.dir)
	if left := mountsUnder(k.dir); len(left) > 0 {
		t.Errorf("mounts left under %s: %v", k.dir, left)
	}
	if err := os.RemoveAll(k.dir); err != nil {
		t.Errorf("remove %s: %v", k.dir, err)
	}
}

// drain deletes every pod and Deployment in the tests' namespace and
// waits until the kubelet has stopped their sandboxes.
func (k *kubeCluster) drain(ctx context.Context, t *testing.T) {
	zero := int64(0)
	opts := metav1.DeleteOptions{GracePeriodSeconds: &zero}
	if err := k.client.AppsV1().Deployments(kubeNamespace).DeleteCollection(ctx, opts, metav1.ListOptions{}); err != nil {
		t.Errorf("delete deployments: %v", err)
	}
	if err := k.client.CoreV1().Pods(kubeNamespace).DeleteCollection(ctx, opts, metav1.ListOptions{}); err != nil {
		t.Errorf("delete pods: %v", err)
	}
	wait, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := k.poll(wait, "the pods to go", time.Second, func() (bool, error) {
		pods, err := k.client.CoreV1().Pods(kubeNamespace).List(ctx, metav1.ListOptions{})
		return err == nil && len(pods.Items) == 0, err
	}); err != nil {
		t.Errorf("drain: %v", err)
	}
}

// clean removes, once its kubelet has stopped, what the node's kubelet
// leaves behind: the sandboxes it had not collected and its cgroups.
func (n *kubeNode) clean(ctx context.Context, t *testing.T) {
	n.removeSandboxes(ctx, t)
	if n.criConn != nil {
		n.criConn.Close()
	}
	for _, dir := range n.cgroupsLeft() {
		if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Errorf("remove cgroup %s: %v", dir, err)
		}
	}
}

// removeSandboxes stops and removes, through the CRI, any pod sandbox the
// kubelet made and had not removed when it stopped: the kubelet removes
// the sandboxes of deleted pods only at its periodic garbage collection.
func (n *kubeNode) removeSandboxes(ctx context.Context, t *testing.T) {
	if n.cri == nil {
		return
	}
	list, err := n.cri.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{
		LabelSelector: map[string]string{"io.kubernetes.pod.namespace": kubeNamespace},
	}})
	if err != nil {
		t.Errorf("list sandboxes: %v", err)
		return
	}
	for _, sb := range list.Items {
		if _, err := n.cri.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: sb.Id}); err != nil {
			t.Errorf("stop sandbox %s of pod %s: %v", sb.Id, sb.Metadata.GetName(), err)
		}
		if _, err := n.cri.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sb.Id}); err != nil {
			t.Errorf("remove sandbox %s of pod %s: %v", sb.Id, sb.Metadata.GetName(), err)
		}
	}
	t.Logf("%s: removed %d stopped sandboxes the kubelet had not collected yet", n.name, len(list.Items))
}

// stop ends a component: SIGTERM, then SIGKILL to its process group
// after 10 s.
func (p *kubeProc) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}
