package integration

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// criNamespace is the containerd namespace of the CRI.
const criNamespace = "k8s.io"

// runtimeHandler is the CRI runtime handler (a RuntimeClass's handler).
const runtimeHandler = "vm"

// CNI network configurations of the test daemons. The networks live in the
// daemon's own network namespace; @DIR@ becomes the daemon's directory.
const (
	bridgeCNI = `{"cniVersion": "1.0.0", "name": "vmshim-bridge", "plugins": [{
  "type": "bridge", "bridge": "vmshim-br0", "isGateway": true, "ipMasq": false, "mtu": 1400,
  "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.88.0.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}],
           "dataDir": "@DIR@/ipam"}}]}`
	ptpCNI = `{"cniVersion": "1.0.0", "name": "vmshim-ptp", "plugins": [{
  "type": "ptp", "ipMasq": false, "mtu": 1400,
  "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.89.0.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}],
           "dataDir": "@DIR@/ipam"}}]}`
)

// cri is a CRI API client of a test daemon.
type cri struct {
	d       *daemon
	conn    *grpc.ClientConn
	runtime runtimeapi.RuntimeServiceClient
	logDir  string
}

// newCRI connects to the daemon's CRI endpoint.
func newCRI(t *testing.T, d *daemon) *cri {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+d.address, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("cri client: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	return &cri{d: d, conn: conn, runtime: runtimeapi.NewRuntimeServiceClient(conn), logDir: t.TempDir()}
}

// pod is a running CRI pod sandbox.
type pod struct {
	c       *cri
	id      string
	name    string
	config  *runtimeapi.PodSandboxConfig
	cgroup  *podCgroup
	removed bool
}

// runPod runs a pod sandbox with the vm runtime handler.
func (c *cri) runPod(ctx context.Context, t *testing.T, name string) *pod {
	t.Helper()
	return c.runPodLimited(ctx, t, name, 0)
}

// runPodLimited runs a pod sandbox in its own pod cgroup, as the kubelet
// does; a memLimit above zero is the pod cgroup's memory limit (the sum
// of its containers' limits and the RuntimeClass overhead).
func (c *cri) runPodLimited(ctx context.Context, t *testing.T, name string, memLimit int64) *pod {
	t.Helper()
	return c.runPodWith(ctx, t, name, memLimit, nil)
}

// runPodWith is runPodLimited with the sandbox config changed by edit
// (nil for none) before the pod runs.
func (c *cri) runPodWith(ctx context.Context, t *testing.T, name string, memLimit int64, edit func(*runtimeapi.PodSandboxConfig)) *pod {
	t.Helper()
	return c.runPodOn(ctx, t, runtimeHandler, name, memLimit, edit)
}

// runPodOn is runPodWith with the given runtime handler.
func (c *cri) runPodOn(ctx context.Context, t *testing.T, handler, name string, memLimit int64, edit func(*runtimeapi.PodSandboxConfig)) *pod {
	t.Helper()
	uid := uniqueID(t)
	pc := newPodCgroup(t, "pod"+uid, memLimit)
	cfg := &runtimeapi.PodSandboxConfig{
		Metadata:     &runtimeapi.PodSandboxMetadata{Name: name, Uid: uid, Namespace: "default"},
		Hostname:     name,
		LogDirectory: filepath.Join(c.logDir, name),
		DnsConfig:    &runtimeapi.DNSConfig{Servers: []string{"10.96.0.10"}, Searches: []string{"default.svc.cluster.local", "svc.cluster.local"}},
		Linux:        &runtimeapi.LinuxPodSandboxConfig{CgroupParent: pc.path},
	}
	if edit != nil {
		edit(cfg)
	}
	resp, err := c.runtime.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: cfg, RuntimeHandler: handler})
	if err != nil {
		pc.remove(t)
		t.Fatalf("RunPodSandbox: %v\ncontainerd log:\n%s", err, c.d.logTail())
	}
	p := &pod{c: c, id: resp.PodSandboxId, name: name, config: cfg, cgroup: pc}
	t.Cleanup(func() { p.remove(t) })
	return p
}

// ip returns the pod's IP as PodSandboxStatus reports it.
func (p *pod) ip(ctx context.Context, t *testing.T) string {
	t.Helper()
	st, err := p.c.runtime.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: p.id})
	if err != nil {
		t.Fatalf("PodSandboxStatus: %v", err)
	}
	return st.GetStatus().GetNetwork().GetIp()
}

// netnsPath returns the path of the pod's network namespace.
func (p *pod) netnsPath(ctx context.Context, t *testing.T) string {
	t.Helper()
	st, err := p.c.runtime.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: p.id, Verbose: true})
	if err != nil {
		t.Fatalf("PodSandboxStatus: %v", err)
	}
	info := st.GetInfo()["info"]
	const key = `"NetNSPath":"`
	i := strings.Index(info, key)
	if i < 0 {
		t.Fatalf("no NetNSPath in sandbox info: %s", info)
	}
	rest := info[i+len(key):]
	return rest[:strings.IndexByte(rest, '"')]
}

// startVM creates and starts a VM container in the pod.
func (p *pod) startVM(ctx context.Context, t *testing.T, image string, annotations map[string]string) *criContainer {
	t.Helper()
	c := p.createVM(ctx, t, image, annotations)
	if _, err := p.c.runtime.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: c.id}); err != nil {
		t.Fatalf("StartContainer: %v", err)
	}
	return c
}

// createVM creates a VM container in the pod.
func (p *pod) createVM(ctx context.Context, t *testing.T, image string, annotations map[string]string) *criContainer {
	t.Helper()
	return p.createVMWith(ctx, t, image, func(cfg *runtimeapi.ContainerConfig) { cfg.Annotations = annotations })
}

// createVMWith creates a VM container whose config edit adjusts.
func (p *pod) createVMWith(ctx context.Context, t *testing.T, image string, edit func(*runtimeapi.ContainerConfig)) *criContainer {
	t.Helper()
	name := fmt.Sprintf("vm-%d", time.Now().UnixNano()%100000)
	cfg := &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: name},
		Image:    &runtimeapi.ImageSpec{Image: image},
		LogPath:  name + ".log",
	}
	edit(cfg)
	created, err := p.c.runtime.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: p.id, Config: cfg, SandboxConfig: p.config})
	if err != nil {
		t.Fatalf("CreateContainer: %v\ncontainerd log:\n%s", err, p.c.d.logTail())
	}
	return &criContainer{p: p, id: created.ContainerId, log: filepath.Join(p.config.LogDirectory, cfg.LogPath)}
}

// remove stops and removes the pod, as the kubelet does.
func (p *pod) remove(t *testing.T) {
	if p.removed {
		return
	}
	p.removed = true
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := p.c.runtime.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: p.id}); err != nil {
		t.Errorf("StopPodSandbox %s: %v", p.name, err)
	}
	if _, err := p.c.runtime.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: p.id}); err != nil {
		t.Errorf("RemovePodSandbox %s: %v", p.name, err)
	}
	// The kubelet removes the pod cgroup once the pod is gone; the
	// runtime must have removed the containers' cgroups inside it.
	if p.cgroup != nil {
		p.cgroup.remove(t)
	}
}

// criContainer is a container started through the CRI.
type criContainer struct {
	p   *pod
	id  string
	log string
}

// waitLog waits until the container's CRI log has a line containing
// marker and returns that line's content.
func (c *criContainer) waitLog(ctx context.Context, t *testing.T, marker string) string {
	t.Helper()
	for {
		if line, ok := findLogLine(c.log, marker); ok {
			return line
		}
		select {
		case <-ctx.Done():
			data, _ := os.ReadFile(c.log)
			t.Fatalf("log never showed %q: %v\nlog:\n%s", marker, ctx.Err(), data)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// findLogLine scans a CRI log file ("TIMESTAMP STREAM TAG content" lines)
// for content containing marker.
func findLogLine(path, marker string) (string, bool) {
	f, err := os.Open(path)
	if err != nil {
		return "", false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), " ", 4)
		if len(parts) == 4 && strings.Contains(parts[3], marker) {
			return strings.TrimRight(parts[3], "\r"), true
		}
	}
	return "", false
}

// stop stops the container with a timeout, as StopContainer does.
func (c *criContainer) stop(ctx context.Context, t *testing.T, timeout int64) {
	t.Helper()
	if _, err := c.p.c.runtime.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: c.id, Timeout: timeout}); err != nil {
		t.Fatalf("StopContainer: %v", err)
	}
}

// leaseFields parses a VMSHIM-LEASE line's key=value fields.
func leaseFields(line string) map[string]string {
	f := map[string]string{}
	for _, kv := range strings.Fields(line) {
		if k, v, ok := strings.Cut(kv, "="); ok {
			f[k] = v
		}
	}
	return f
}
