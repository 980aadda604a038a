package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Environment the Makefile passes in for the Kubernetes tests.
const (
	envKube         = "VMSHIM_KUBE"          // directory holding kube-apiserver, ..., kubelet, kubectl
	envEtcd         = "VMSHIM_ETCD"          // directory holding etcd
	envKubeRequired = "VMSHIM_KUBE_REQUIRED" // 1: missing binaries fail the tests instead of skipping them
)

// The cluster's fixed names and addresses, and its first node's. They live
// in the suite daemon's network namespace only (the second node's, which
// a test adds, in kube_drain_test.go).
const (
	kubeNodeName   = "vmshim-node"
	kubeNodeIP     = "10.88.0.1" // the CNI bridge's gateway address (bridgeCNI)
	kubeBridge     = "vmshim-br0"
	kubeServiceNet = "10.96.0.0/16"
	kubeServiceIP  = "10.96.0.1" // the first address of kubeServiceNet: the "kubernetes" Service
	kubeDNSIP      = "10.96.0.10"
	kubeAPIPort    = 6443
	kubeNamespace  = "vmshim-e2e" // where the tests' objects live
	kubeNodeLabel  = "vmshim.io/runtime=true"
)

// kubeCommands are the Kubernetes binaries the cluster needs, from envKube.
var kubeCommands = []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kubectl"}

// kubeCluster is etcd, kube-apiserver, kube-controller-manager,
// kube-scheduler and a kubelet on the suite's containerd, all in the
// suite daemon's network namespace; a test may add a second node
// (addNode).
type kubeCluster struct {
	dir    string // everything the cluster writes, below the daemon's dir
	bin    string // directory of the Kubernetes commands
	etcd   string // the etcd binary
	netns  string // path of the network namespace
	pki    *kubePKI
	admin  string      // the admin's kubeconfig
	node   *kubeNode   // the node on the suite's containerd, always there
	nodes  []*kubeNode // every node, the first one first
	procs  []*kubeProc
	rest   *rest.Config
	client *kubernetes.Clientset
}

// kubeProc is one running component.
type kubeProc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{} // closed once cmd has been reaped
}

// kubeRequired tells whether missing Kubernetes binaries are a failure:
// under `make test` and in CI they are.
func kubeRequired() bool {
	if os.Getenv(envKubeRequired) == "1" {
		return true
	}
	ci := os.Getenv("CI")
	return ci != "" && ci != "0" && ci != "false"
}

// kubeBinaries checks that every binary the cluster needs is there and
// returns the Kubernetes and etcd directories.
func kubeBinaries() (string, string, error) {
	bin, etcdDir := os.Getenv(envKube), os.Getenv(envEtcd)
	if bin == "" || etcdDir == "" {
		return "", "", fmt.Errorf("%s or %s is not set (make integration sets them)", envKube, envEtcd)
	}
	files := []string{filepath.Join(etcdDir, "etcd")}
	for _, c := range kubeCommands {
		files = append(files, filepath.Join(bin, c))
	}
	for _, f := range files {
		if st, err := os.Stat(f); err != nil || st.Mode()&0o111 == 0 {
			return "", "", fmt.Errorf("%s is missing: run integration/setup/kube.sh (make setup)", f)
		}
	}
	return bin, etcdDir, nil
}

// startKube starts the cluster for a test and stops it when the test
// ends. Without the binaries it skips the test, or fails it when they
// are required.
func startKube(t *testing.T) *kubeCluster {
	t.Helper()
	bin, etcdDir, err := kubeBinaries()
	if err != nil {
		if kubeRequired() {
			t.Fatalf("kubernetes tests: %v", err)
		}
		t.Skipf("kubernetes tests skipped: %v", err)
	}
	k := &kubeCluster{
		dir:   filepath.Join(env.daemon.dir, "kube"),
		bin:   bin,
		etcd:  filepath.Join(etcdDir, "etcd"),
		netns: "/run/netns/" + env.daemon.netns,
	}
	k.node = k.newKubeNode(kubeNodeName, kubeNodeIP, "kubelet", env.daemon)
	k.nodes = []*kubeNode{k.node}
	start := time.Now()
	t.Cleanup(func() { k.stop(t) })
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	if err := k.start(ctx); err != nil {
		t.Fatalf("start the cluster: %v\n%s", err, k.logTails())
	}
	t.Logf("cluster up in %v: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet (node %s, %s)",
		time.Since(start).Round(time.Millisecond), kubeNodeName, kubeNodeIP)
	return k
}

// start brings every component up in order and waits until the node is
// Ready and the test namespace can take pods.
func (k *kubeCluster) start(ctx context.Context) error {
	if err := os.MkdirAll(filepath.Join(k.dir, "logs"), 0o755); err != nil {
		return err
	}
	if err := k.node.bridgeAddress(); err != nil {
		return err
	}
	if err := k.node.connect(); err != nil {
		return err
	}
	var err error
	if k.pki, err = newKubePKI(filepath.Join(k.dir, "pki")); err != nil {
		return err
	}
	if err := k.pki.clusterCerts(net.ParseIP(kubeNodeIP), net.ParseIP(kubeServiceIP)); err != nil {
		return err
	}
	server := kubeAPIServer()
	if k.admin, err = k.pki.kubeconfig("admin", server); err != nil {
		return err
	}
	if err := k.startEtcd(); err != nil {
		return err
	}
	if err := k.startAPIServer(); err != nil {
		return err
	}
	if err := k.connect(server); err != nil {
		return err
	}
	if err := k.waitAPIServer(ctx); err != nil {
		return err
	}
	if err := k.startControllers(server); err != nil {
		return err
	}
	if err := k.startKubelet(server, k.node); err != nil {
		return err
	}
	if err := k.waitNodeReady(ctx, kubeNodeName); err != nil {
		return err
	}
	return k.prepareNamespace(ctx)
}

// kubeAPIServer is the API server's URL.
func kubeAPIServer() string { return fmt.Sprintf("https://%s:%d", kubeNodeIP, kubeAPIPort) }

// run starts a component of the control plane in the cluster's network
// namespace, its output in logs/NAME.log.
func (k *kubeCluster) run(name string, argv ...string) error {
	_, err := k.runIn(k.netns, name, argv...)
	return err
}

// runIn starts a component in network namespace netns, its output in
// logs/NAME.log. The cluster waits on it and stops it with the rest.
func (k *kubeCluster) runIn(netns, name string, argv ...string) (*kubeProc, error) {
	logPath := filepath.Join(k.dir, "logs", name+".log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.Command("nsenter", append([]string{"--net=" + netns, "--"}, argv...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &kubeProc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	k.procs = append(k.procs, p)
	return p, nil
}

// startEtcd runs etcd on 127.0.0.1 of the namespace, its data on disk
// without fsync (the cluster lives as long as the test).
func (k *kubeCluster) startEtcd() error {
	return k.run("etcd", k.etcd,
		"--name", "vmshim",
		"--data-dir", filepath.Join(k.dir, "etcd"),
		"--listen-client-urls", "http://127.0.0.1:2379",
		"--advertise-client-urls", "http://127.0.0.1:2379",
		"--listen-peer-urls", "http://127.0.0.1:2380",
		"--initial-advertise-peer-urls", "http://127.0.0.1:2380",
		"--initial-cluster", "vmshim=http://127.0.0.1:2380",
		"--unsafe-no-fsync",
		"--log-level", "warn")
}

// startAPIServer runs kube-apiserver on its secure port only, with the
// default admission plugins and Node and RBAC authorization.
func (k *kubeCluster) startAPIServer() error {
	p := k.pki.path
	return k.run("kube-apiserver", filepath.Join(k.bin, "kube-apiserver"),
		"--etcd-servers", "http://127.0.0.1:2379",
		"--advertise-address", kubeNodeIP,
		"--bind-address", kubeNodeIP,
		"--secure-port", fmt.Sprint(kubeAPIPort),
		"--tls-cert-file", p("apiserver.crt"),
		"--tls-private-key-file", p("apiserver.key"),
		"--client-ca-file", p("ca.crt"),
		"--kubelet-client-certificate", p("apiserver-kubelet-client.crt"),
		"--kubelet-client-key", p("apiserver-kubelet-client.key"),
		"--kubelet-certificate-authority", p("ca.crt"),
		"--kubelet-preferred-address-types", "InternalIP",
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file", p("sa.pub"),
		"--service-account-signing-key-file", p("sa.key"),
		"--service-cluster-ip-range", kubeServiceNet,
		"--authorization-mode", "Node,RBAC",
		"--cert-dir", filepath.Join(k.dir, "apiserver"),
		"--profiling=false")
}

// startControllers runs kube-controller-manager and kube-scheduler,
// neither serving anything, without leader election.
func (k *kubeCluster) startControllers(server string) error {
	cm, err := k.pki.kubeconfig("controller-manager", server)
	if err != nil {
		return err
	}
	sched, err := k.pki.kubeconfig("scheduler", server)
	if err != nil {
		return err
	}
	p := k.pki.path
	if err := k.run("kube-controller-manager", filepath.Join(k.bin, "kube-controller-manager"),
		"--kubeconfig", cm,
		"--authentication-kubeconfig", cm,
		"--authorization-kubeconfig", cm,
		"--secure-port", "0",
		"--leader-elect=false",
		"--use-service-account-credentials",
		"--service-account-private-key-file", p("sa.key"),
		"--root-ca-file", p("ca.crt"),
		"--service-cluster-ip-range", kubeServiceNet,
		"--cert-dir", filepath.Join(k.dir, "controller-manager"),
		"--profiling=false"); err != nil {
		return err
	}
	return k.run("kube-scheduler", filepath.Join(k.bin, "kube-scheduler"),
		"--kubeconfig", sched,
		"--authentication-kubeconfig", sched,
		"--authorization-kubeconfig", sched,
		"--secure-port", "0",
		"--leader-elect=false",
		"--profiling=false")
}

// connect makes the admin's client. Its connections are dialled in the
// cluster's network namespace, where the API server listens.
func (k *kubeCluster) connect(server string) error {
	cert, err := os.ReadFile(k.pki.path("admin.crt"))
	if err != nil {
		return err
	}
	key, err := os.ReadFile(k.pki.path("admin.key"))
	if err != nil {
		return err
	}
	k.rest = &rest.Config{
		Host:            server,
		TLSClientConfig: rest.TLSClientConfig{CAData: k.pki.caPEM(), CertData: cert, KeyData: key},
		Dial:            k.dial,
		QPS:             50,
		Burst:           100,
	}
	k.client, err = kubernetes.NewForConfig(k.rest)
	return err
}

// dial opens a TCP connection from inside the cluster's network namespace.
func (k *kubeCluster) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var conn net.Conn
	err := inNetns(k.netns, func() error {
		var err error
		conn, err = (&net.Dialer{}).DialContext(ctx, network, addr)
		return err
	})
	return conn, err
}

// exited returns the first component that is no longer running.
func (k *kubeCluster) exited() *kubeProc {
	for _, p := range k.procs {
		select {
		case <-p.done:
			return p
		default:
		}
	}
	return nil
}

// poll calls check every interval until it returns true, an error, or a
// component exits, or ctx ends.
func (k *kubeCluster) poll(ctx context.Context, what string, interval time.Duration, check func() (bool, error)) error {
	var last error
	for {
		ok, err := check()
		if ok {
			return nil
		}
		if err != nil {
			last = err
		}
		if p := k.exited(); p != nil {
			return fmt.Errorf("%s exited while waiting for %s", p.name, what)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w (last: %v)", what, ctx.Err(), last)
		case <-time.After(interval):
		}
	}
}

// waitAPIServer waits until kube-apiserver answers /readyz.
func (k *kubeCluster) waitAPIServer(ctx context.Context) error {
	return k.poll(ctx, "kube-apiserver /readyz", 250*time.Millisecond, func() (bool, error) {
		body, err := k.client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err == nil && string(body) == "ok", err
	})
}

// waitNodeReady waits until a kubelet's node is registered and Ready.
func (k *kubeCluster) waitNodeReady(ctx context.Context, name string) error {
	return k.poll(ctx, "node "+name+" Ready", 500*time.Millisecond, func() (bool, error) {
		n, err := k.client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c.Status == corev1.ConditionTrue, fmt.Errorf("node %s: %s", c.Reason, c.Message)
			}
		}
		return false, nil
	})
}

// prepareNamespace makes the tests' namespace, waits for what pods in it
// need (its default service account and the cluster's CA in
// kube-root-ca.crt, which the controller manager creates), and applies
// the RuntimeClass from deploy/ as it is.
func (k *kubeCluster) prepareNamespace(ctx context.Context) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: kubeNamespace}}
	if _, err := k.client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace %s: %w", kubeNamespace, err)
	}
	if err := k.poll(ctx, "service account "+kubeNamespace+"/default", 250*time.Millisecond, func() (bool, error) {
		_, err := k.client.CoreV1().ServiceAccounts(kubeNamespace).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, err
	}); err != nil {
		return err
	}
	if err := k.poll(ctx, "config map "+kubeNamespace+"/kube-root-ca.crt", 250*time.Millisecond, func() (bool, error) {
		_, err := k.client.CoreV1().ConfigMaps(kubeNamespace).Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
		return err == nil, err
	}); err != nil {
		return err
	}
	out, err := k.kubectlOK(ctx, "apply", "-f", runtimeClassManifest())
	if err != nil {
		return fmt.Errorf("kubectl apply the RuntimeClass: %w", err)
	}
	if !strings.Contains(out, "runtimeclass.node.k8s.io/vm") {
		return fmt.Errorf("kubectl apply the RuntimeClass: %q", out)
	}
	return nil
}

// runtimeClassManifest is the path of deploy/runtimeclass.yaml.
func runtimeClassManifest() string {
	wd, _ := os.Getwd()
	return filepath.Join(filepath.Dir(wd), "deploy", "runtimeclass.yaml")
}

// kubectl returns a kubectl command run as the admin in the cluster's
// network namespace, its discovery cache in the cluster's directory.
func (k *kubeCluster) kubectl(ctx context.Context, args ...string) *exec.Cmd {
	argv := append([]string{"--net=" + k.netns, "--", filepath.Join(k.bin, "kubectl"),
		"--kubeconfig", k.admin, "--cache-dir", filepath.Join(k.dir, "kubectl-cache")}, args...)
	return exec.CommandContext(ctx, "nsenter", argv...)
}

// kubectlRun runs kubectl and returns its stdout, stderr and exit code
// (-1 when it did not exit normally).
func (k *kubeCluster) kubectlRun(ctx context.Context, stdin string, args ...string) (string, string, int) {
	cmd := k.kubectl(ctx, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = strings.NewReader(stdin), &stdout, &stderr
	err := cmd.Run()
	code := 0
	if err != nil {
		code = -1
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		}
		if code == -1 {
			fmt.Fprintf(&stderr, "\n%v", err)
		}
	}
	return stdout.String(), stderr.String(), code
}

// kubectlOK runs kubectl, which must succeed, and returns its stdout.
func (k *kubeCluster) kubectlOK(ctx context.Context, args ...string) (string, error) {
	out, errOut, code := k.kubectlRun(ctx, "", args...)
	if code != 0 {
		return out, fmt.Errorf("kubectl %s: exit %d: %s", strings.Join(args, " "), code, strings.TrimSpace(errOut))
	}
	return out, nil
}

// logTails returns the end of every component's log, for failures.
func (k *kubeCluster) logTails() string {
	var b strings.Builder
	for _, p := range k.procs {
		fmt.Fprintf(&b, "--- %s (%s):\n%s\n", p.name, p.log, tailFile(p.log, 3000))
	}
	return b.String()
}

// logTail returns the end of one component's log.
func (k *kubeCluster) logTail(name string, n int) string {
	return tailFile(filepath.Join(k.dir, "logs", name+".log"), n)
}

// tailFile returns at most the last n bytes of a file.
func tailFile(path string, n int) string {
	data, _ := os.ReadFile(path)
	if len(data) > n {
		data = data[len(data)-n:]
	}
	return string(data)
}
