package integration

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/pkg/oci"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/vmshim/vmshim/config"
)

// busyboxImage is an ordinary container image (Debian's static busybox),
// with no VM in it: the runc shim runs its containers.
const busyboxImage = "localhost/vmshim-test/busybox:1"

// importBusybox imports busyboxImage into the suite daemon's namespace ns.
func importBusybox(ctx context.Context, t *testing.T, ns string) {
	t.Helper()
	archive := filepath.Join(t.TempDir(), "busybox.tar")
	if err := writeBusyboxArchive(archive, busyboxImage); err != nil {
		t.Fatal(err)
	}
	if err := importArchives(ctx, env.daemon, ns, archive); err != nil {
		t.Fatal(err)
	}
}

// createOrdinary creates a busybox container running cmd in the pod, with
// the host directory dir mounted at /data when dir is not empty.
func (p *pod) createOrdinary(ctx context.Context, t *testing.T, name, dir string, cmd ...string) *criContainer {
	t.Helper()
	cfg := &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: name},
		Image:    &runtimeapi.ImageSpec{Image: busyboxImage},
		Command:  append([]string{"/bin/busybox"}, cmd...),
		LogPath:  name + ".log",
	}
	if dir != "" {
		cfg.Mounts = []*runtimeapi.Mount{{ContainerPath: "/data", HostPath: dir}}
	}
	// The kubelet gives each container the pod's namespace options.
	if sc := p.config.GetLinux().GetSecurityContext(); sc != nil {
		cfg.Linux = &runtimeapi.LinuxContainerConfig{SecurityContext: &runtimeapi.LinuxContainerSecurityContext{NamespaceOptions: sc.NamespaceOptions}}
	}
	created, err := p.c.runtime.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: p.id, Config: cfg, SandboxConfig: p.config})
	if err != nil {
		t.Fatalf("CreateContainer %s: %v\ncontainerd log:\n%s", name, err, p.c.d.logTail())
	}
	return &criContainer{p: p, id: created.ContainerId, log: filepath.Join(p.config.LogDirectory, cfg.LogPath)}
}

// startOrdinary is createOrdinary, then StartContainer.
func (p *pod) startOrdinary(ctx context.Context, t *testing.T, name, dir string, cmd ...string) *criContainer {
	t.Helper()
	c := p.createOrdinary(ctx, t, name, dir, cmd...)
	if _, err := p.c.runtime.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: c.id}); err != nil {
		t.Fatalf("StartContainer %s: %v\ncontainerd log:\n%s", name, err, p.c.d.logTail())
	}
	return c
}

// runcShimsOf lists the runc shim processes started for container id.
func runcShimsOf(id string) []string {
	var out []string
	for _, p := range processesMentioning("containerd-shim-runc-v2 ") {
		if strings.Contains(p, " -id "+id+" ") {
			out = append(out, p)
		}
	}
	return out
}

// TestMixedPod runs ordinary containers beside a VM in one VM pod, as
// the kubelet orders them: an init container writes into a volume and
// exits, the VM boots, a sidecar runs beside it and answers exec. The
// ordinary containers run under containerd's runc shim, one for the pod;
// the pod's removal leaves no runc shim behind.
func TestMixedPod(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*bootTimeout)
	defer cancel()
	importBusybox(ctx, t, criNamespace)
	c := newCRI(t, env.daemon)
	// As the kubelet runs a pod without shareProcessNamespace: each
	// container has a PID namespace of its own.
	p := c.runPodWith(ctx, t, "mixed", 0, func(cfg *runtimeapi.PodSandboxConfig) {
		cfg.Linux.SecurityContext = &runtimeapi.LinuxSandboxSecurityContext{
			NamespaceOptions: &runtimeapi.NamespaceOption{Pid: runtimeapi.NamespaceMode_CONTAINER},
		}
	})
	dir := t.TempDir()
	// As the kubelet makes an emptyDir: the VM's jail id writes it too.
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}

	// The init container: runs, writes, exits 0, before the VM.
	init := p.startOrdinary(ctx, t, "init", dir, "sh", "-c", "echo from-init >/data/greeting && echo init done")
	if st := init.waitExited(ctx, t); st.ExitCode != 0 {
		t.Fatalf("init container: exit %d (%s), want 0", st.ExitCode, st.Message)
	}
	init.waitLog(ctx, t, "init done")
	if b, err := os.ReadFile(filepath.Join(dir, "greeting")); err != nil || string(b) != "from-init\n" {
		t.Fatalf("what the init container wrote: %q, %v", b, err)
	}
	shims := runcShimsOf(init.id)
	if len(shims) != 1 {
		t.Fatalf("runc shims of the pod: %q, want one, started for the first ordinary container", shims)
	}
	if vmShims := shimsOf(init.id); len(vmShims) != 0 {
		t.Errorf("a VM shim of its own for the init container: %v", vmShims)
	}

	// The VM boots after it and sees what it wrote in the volume.
	vm := p.createVMWith(ctx, t, imageKernelAgent, func(cfg *runtimeapi.ContainerConfig) {
		cfg.Mounts = []*runtimeapi.Mount{{ContainerPath: "/data", HostPath: dir}}
	})
	if _, err := c.runtime.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: vm.id}); err != nil {
		t.Fatalf("StartContainer of the VM: %v", err)
	}
	vm.waitLog(ctx, t, markerAgent)
	mount := "mkdir -p /mnt/data && mount -t 9p -o trans=virtio,version=9p2000.L " + config.ShareTagPrefix + "0 /mnt/data && cat /mnt/data/greeting"
	if out := vm.mustExec(ctx, t, "sh", "-c", mount); out != "from-init\n" {
		t.Errorf("the volume in the guest: %q, want what the init container wrote", out)
	}

	// The sidecar runs beside the VM, under the same runc shim.
	side := p.startOrdinary(ctx, t, "side", dir, "sleep", "3600")
	if st := side.status(ctx, t); st.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("sidecar state %v, want running", st.State)
	}
	if got := side.mustExec(ctx, t, "/bin/busybox", "cat", "/data/greeting"); got != "from-init\n" {
		t.Errorf("sidecar reads %q from the volume, want the init container's", got)
	}
	if got := strings.TrimSpace(side.mustExec(ctx, t, "/bin/busybox", "sh", "-c", "echo $$; cat /proc/1/cmdline | tr '\\0' ' '")); !strings.Contains(got, "sleep 3600") {
		t.Errorf("sidecar's pid 1: %q, want its own sleep", got)
	}
	// It is in the pod's own UTS and IPC namespaces, the sandbox's.
	if got := strings.TrimSpace(side.mustExec(ctx, t, "/bin/busybox", "hostname")); got != "mixed" {
		t.Errorf("sidecar's hostname %q, want the pod's", got)
	}
	hostIPC, err := os.Readlink("/proc/self/ns/ipc")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(side.mustExec(ctx, t, "/bin/busybox", "readlink", "/proc/self/ns/ipc")); got == hostIPC || got == "" {
		t.Errorf("sidecar's ipc namespace %q: the host's is %q", got, hostIPC)
	}
	if got := runcShimsOf(init.id); len(got) != 1 || got[0] != shims[0] {
		t.Errorf("runc shims after the sidecar: %q, want the pod's one %q", got, shims)
	}
	if st := vm.status(ctx, t); st.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Errorf("VM state %v beside the sidecar, want running", st.State)
	}

	side.stop(ctx, t, 2)
	if st := side.waitExited(ctx, t); st.ExitCode == 0 {
		t.Errorf("stopped sidecar: exit %d, want a signal's", st.ExitCode)
	}
	vm.stop(ctx, t, 30)
	vm.waitExited(ctx, t)
	p.remove(t)
	deadline := time.Now().Add(10 * time.Second)
	for len(runcShimsOf(init.id)) > 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if left := runcShimsOf(init.id); len(left) != 0 {
		t.Errorf("runc shim left after the pod's removal: %q", left)
	}
	if left := processesMentioning(p.id); len(left) != 0 {
		t.Errorf("processes left after the pod's removal: %q", left)
	}
}

// TestCtrOrdinary runs an ordinary image with ctr's runtime option set to
// the VM runtime: it runs under runc, its exit code comes back, and its
// delete leaves no runc shim.
func TestCtrOrdinary(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	importBusybox(ctx, t, testNamespace)
	id := uniqueID(t)
	v, err := createVM(ctx, t, id, busyboxImage, nil, oci.WithProcessArgs("/bin/busybox", "sh", "-c", "echo ordinary; exit 7"))
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	v.start(ctx, t)
	if code := v.waitExit(ctx, t); code != 7 {
		t.Errorf("exit %d, want 7", code)
	}
	v.console.waitFor(ctx, t, "ordinary")
	v.remove(t)
	if left := runcShimsOf(id); len(left) != 0 {
		t.Errorf("runc shim left after delete: %q", left)
	}
}

// TestMixedPodShimKilled kills the VM shim of a pod whose sidecar runs
// under the runc shim: containerd's delete action for the sidecar has the
// runc shim remove it, and once the pod is removed no runc shim, sidecar
// process or record is left.
func TestMixedPodShimKilled(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*bootTimeout)
	defer cancel()
	importBusybox(ctx, t, criNamespace)
	p := newCRI(t, env.daemon).runPod(ctx, t, "mixedkill")
	side := p.startOrdinary(ctx, t, "side", "", "sleep", "3601")
	if st := side.status(ctx, t); st.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("sidecar state %v, want running", st.State)
	}
	killPodShim(t, p)
	side.waitExited(ctx, t)
	waitGone(ctx, t, "the sidecar's sleep", func() bool { return len(processesMentioning("sleep 3601")) == 0 })
	p.remove(t)
	waitGone(ctx, t, "the runc shim", func() bool { return len(runcShimsOf(side.id)) == 0 })
	if left := processesMentioning(p.id); len(left) != 0 {
		t.Errorf("processes left after the pod's removal: %q", left)
	}
}

// TestMixedPodNetwork runs a sidecar HTTP server beside a VM that owns the
// pod's IP: from the node's network, the sidecar's port reaches the
// sidecar and the guest's port the guest; the sidecar's own connections
// out of the pod get their replies; it reaches the guest at the pod IP;
// and port-forward reaches either.
func TestMixedPodNetwork(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*bootTimeout)
	defer cancel()
	importBusybox(ctx, t, criNamespace)
	p := newCRI(t, env.daemon).runPod(ctx, t, "mixednet")
	vm := p.startVM(ctx, t, imageKernelWaitCRI, nil)
	vm.waitLog(ctx, t, "VMSHIM-HTTP-READY")
	side := p.startOrdinary(ctx, t, "web", "", "sh", "-c",
		"/bin/busybox mkdir -p /www && echo VMSHIM-SIDECAR-OK >/www/index.html && exec /bin/busybox httpd -f -p 8081 -h /www")
	ip := p.ip(ctx, t)
	node := "/run/netns/" + env.daemon.netns
	// The sidecar's server is up once a GET from the pod's own netns works.
	waitGone(ctx, t, "the sidecar's server", func() bool {
		r, err := side.execSync(ctx, t, 10, "/bin/busybox", "wget", "-q", "-O-", "http://127.0.0.1:8081/")
		return err == nil && r.ExitCode == 0
	})

	if body := httpGetAddr(ctx, t, node, net.JoinHostPort(ip, "8081")); !strings.Contains(body, "VMSHIM-SIDECAR-OK") {
		t.Errorf("GET the pod's :8081 from the node: %q, want the sidecar's page", body)
	}
	if body := httpGetAddr(ctx, t, node, net.JoinHostPort(ip, "8080")); !strings.Contains(body, "VMSHIM-HTTP-OK") {
		t.Errorf("GET the pod's :8080 from the node: %q, want the guest's page", body)
	}

	// Out of the pod: the node answers the sidecar.
	serveIn(t, node, "tcp", net.JoinHostPort(bridgeGateway, "18091"), func(c net.Conn) {
		defer c.Close()
		// The request is read whole before the answer: a socket closed
		// with a request unread resets the connection, answer and all.
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
			return
		}
		_, _ = io.WriteString(c, "HTTP/1.0 200 OK\r\n\r\nVMSHIM-FROM-THE-NODE\n")
	})
	if out := side.mustExec(ctx, t, "/bin/busybox", "wget", "-q", "-O-", "http://"+net.JoinHostPort(bridgeGateway, "18091")+"/"); !strings.Contains(out, "VMSHIM-FROM-THE-NODE") {
		t.Errorf("the sidecar's GET out of the pod: %q", out)
	}
	// From the sidecar, the pod IP is the guest.
	if out := side.mustExec(ctx, t, "/bin/busybox", "wget", "-q", "-O-", "http://"+net.JoinHostPort(ip, "8080")+"/"); !strings.Contains(out, "VMSHIM-HTTP-OK") {
		t.Errorf("the sidecar's GET of the guest at the pod IP: %q", out)
	}
	// Port-forward: the sidecar's port to it, the guest's to the guest.
	if body := p.portForward(ctx, t, 8081, "GET / HTTP/1.0\r\n\r\n"); !strings.Contains(body, "VMSHIM-SIDECAR-OK") {
		t.Errorf("port-forward to :8081: %q, want the sidecar's page", body)
	}
	if body := p.portForward(ctx, t, 8080, "GET / HTTP/1.0\r\n\r\n"); !strings.Contains(body, "VMSHIM-HTTP-OK") {
		t.Errorf("port-forward to :8080: %q, want the guest's page", body)
	}
	if st := vm.status(ctx, t); st.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Errorf("VM state %v, want running", st.State)
	}
}
