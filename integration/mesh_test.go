package integration

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// iptablesImage is an ordinary image with busybox and the node's own
// iptables (both backends), as a service mesh's init container has.
const iptablesImage = "localhost/vmshim-test/iptables:1"

// importIptables builds iptablesImage from the node's files (Debian's
// iptables, which `make setup` installs: its two programs, the shared
// libraries they load and their extensions) and imports it into ns.
func importIptables(ctx context.Context, t *testing.T, ns string) {
	t.Helper()
	files := []string{"/bin/busybox"}
	for _, prog := range []string{"/usr/sbin/xtables-nft-multi", "/usr/sbin/xtables-legacy-multi"} {
		files = append(files, prog)
		out, err := exec.Command("ldd", prog).Output()
		if err != nil {
			t.Skipf("ldd %s: %v (make setup installs Debian's iptables)", prog, err)
		}
		for _, f := range strings.Fields(string(out)) {
			if strings.HasPrefix(f, "/") {
				files = append(files, f)
			}
		}
	}
	ext, err := filepath.Glob("/usr/lib/x86_64-linux-gnu/xtables/*.so")
	if err != nil || len(ext) == 0 {
		t.Skipf("no iptables extensions under /usr/lib/x86_64-linux-gnu/xtables: %v", err)
	}
	// The node's files (symlinks followed), the programs' names, and
	// the lock iptables takes in /run.
	entries := map[string]layerEntry{"run/xtables.lock": layerFile(nil)}
	for _, f := range append(files, ext...) {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		entries[f[1:]] = layerProgram(data)
	}
	for _, cmd := range []string{"iptables", "ip6tables"} {
		entries["usr/sbin/"+cmd+"-nft"] = layerLink("xtables-nft-multi")
		entries["usr/sbin/"+cmd+"-legacy"] = layerLink("xtables-legacy-multi")
	}
	archive := filepath.Join(t.TempDir(), "iptables.tar")
	if err := writeLinkArchive(archive, iptablesImage, entries); err != nil {
		t.Fatal(err)
	}
	if err := importArchives(ctx, env.daemon, ns, archive); err != nil {
		t.Fatal(err)
	}
}

// TestMixedPodMesh: what a service mesh's injection does to a VM pod.
// An init container installs iptables rules that redirect every inbound
// TCP port to a proxy's (as istio-init does, through nf_tables and, for
// IPv6, x_tables) and a proxy sidecar listens there. A VM container is
// then refused in one line that says why, and leaves nothing; with
// vmshim.io/mesh: bypass it runs, and what docs/kubernetes.md says
// holds: the guest's port is reached directly, past the redirect, the
// proxy's own port is the proxy's, and a sidecar's port the mesh
// redirects is reset.
func TestMixedPodMesh(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*bootTimeout)
	defer cancel()
	importBusybox(ctx, t, criNamespace)
	importIptables(ctx, t, criNamespace)
	p := newCRI(t, env.daemon).runPod(ctx, t, "mesh")

	initCfg := &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: "mesh-init"},
		Image:    &runtimeapi.ImageSpec{Image: iptablesImage},
		Command: []string{"/bin/busybox", "sh", "-c", "set -e; " +
			"iptables-nft -t nat -N MESH_INBOUND; " +
			"iptables-nft -t nat -A MESH_INBOUND -p tcp --dport 15006 -j RETURN; " +
			"iptables-nft -t nat -A MESH_INBOUND -p tcp -j REDIRECT --to-ports 15006; " +
			"iptables-nft -t nat -A PREROUTING -p tcp -j MESH_INBOUND; " +
			"ip6tables-legacy -t nat -A PREROUTING -p tcp -j REDIRECT --to-ports 15006; " +
			"echo mesh-init done"},
		LogPath: "mesh-init.log",
		Linux: &runtimeapi.LinuxContainerConfig{SecurityContext: &runtimeapi.LinuxContainerSecurityContext{
			Capabilities: &runtimeapi.Capability{AddCapabilities: []string{"NET_ADMIN", "NET_RAW"}},
		}},
	}
	created, err := p.c.runtime.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: p.id, Config: initCfg, SandboxConfig: p.config})
	if err != nil {
		t.Fatalf("CreateContainer mesh-init: %v", err)
	}
	init := &criContainer{p: p, id: created.ContainerId, log: filepath.Join(p.config.LogDirectory, initCfg.LogPath)}
	if _, err := p.c.runtime.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: init.id}); err != nil {
		t.Fatalf("StartContainer mesh-init: %v", err)
	}
	if st := init.waitExited(ctx, t); st.ExitCode != 0 {
		data, _ := os.ReadFile(init.log)
		t.Fatalf("mesh-init: exit %d; log:\n%s", st.ExitCode, data)
	}
	proxy := p.startOrdinary(ctx, t, "proxy", "", "sh", "-c",
		"/bin/busybox mkdir -p /www && echo VMSHIM-PROXY-OK >/www/index.html && exec /bin/busybox httpd -f -p 15006 -h /www")
	p.startOrdinary(ctx, t, "web", "", "sh", "-c",
		"/bin/busybox mkdir -p /w && echo VMSHIM-SIDECAR-OK >/w/index.html && exec /bin/busybox httpd -f -p 8081 -h /w")
	waitGone(ctx, t, "the proxy's server", func() bool {
		r, err := proxy.execSync(ctx, t, 10, "/bin/busybox", "wget", "-q", "-O-", "http://127.0.0.1:15006/")
		return err == nil && r.ExitCode == 0
	})

	// Refused when its task is made (StartContainer), in one line that
	// names the rules and the ways out.
	refused := p.createVM(ctx, t, imageKernelWaitCRI, nil)
	_, err = p.c.runtime.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: refused.id})
	switch {
	case err == nil:
		out, _ := exec.Command("nsenter", "--net="+p.netnsPath(ctx, t), "iptables-nft-save").CombinedOutput()
		t.Fatalf("a VM in a pod whose netns redirects inbound TCP started; its rules:\n%s", out)
	case strings.Contains(err.Error(), "\n"):
		t.Errorf("refusal is not one line: %q", err)
	}
	for _, want := range []string{"steers traffic through a proxy", "nf_tables ip table nat chain PREROUTING",
		"ip6tables-legacy table nat chain PREROUTING", "sidecar.istio.io/inject", "vmshim.io/mesh: bypass"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not say %q", err, want)
		}
	}
	if _, err := p.c.runtime.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: refused.id}); err != nil {
		t.Errorf("RemoveContainer of the refused VM: %v", err)
	}
	// Nothing of it is left: no QEMU, no shim, no tap in the pod's netns.
	if left := processesMentioning(refused.id); len(left) != 0 {
		t.Errorf("processes of the refused VM left: %q", left)
	}
	for _, l := range processesMentioning("qemu-system") {
		if strings.Contains(l, p.id) {
			t.Errorf("QEMU left after the refusal: %q", l)
		}
	}
	if out, err := exec.Command("nsenter", "--net="+p.netnsPath(ctx, t), "ip", "link", "show", "vmtap0").CombinedOutput(); err == nil {
		t.Errorf("a tap left in the pod's netns after the refusal: %s", out)
	}

	// Allowed: the VM's port bypasses the redirect, a sidecar's does not.
	vm := p.startVM(ctx, t, imageKernelWaitCRI, map[string]string{"vmshim.io/mesh": "bypass"})
	vm.waitLog(ctx, t, "VMSHIM-HTTP-READY")
	ip := p.ip(ctx, t)
	node := "/run/netns/" + env.daemon.netns
	if body := httpGetAddr(ctx, t, node, net.JoinHostPort(ip, "8080")); !strings.Contains(body, "VMSHIM-HTTP-OK") {
		t.Errorf("GET the guest's :8080 with the mesh bypassed: %q, want the guest's page", body)
	}
	// A sidecar's port the mesh redirects: the classifier passes the
	// SYN to the netns (a socket listens on 8081), netfilter redirects
	// it to the proxy, but the handshake's last ACK, still addressed to
	// 8081, matches no socket and goes to the guest, which resets it.
	got, err := httpGetIn(ctx, node, net.JoinHostPort(ip, "8081"))
	if err == nil || strings.Contains(got, "OK") {
		t.Errorf("GET the sidecar's redirected :8081 with the mesh bypassed: %q, %v; docs/kubernetes.md says it is reset", got, err)
	}
	if body := httpGetAddr(ctx, t, node, net.JoinHostPort(ip, "15006")); !strings.Contains(body, "VMSHIM-PROXY-OK") {
		t.Errorf("GET the proxy's :15006: %q", body)
	}
}
