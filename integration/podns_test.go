package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// sandboxInfo is what containerd's verbose PodSandboxStatus says of a
// sandbox's process and spec.
type sandboxInfo struct {
	Pid  int         `json:"pid"`
	Spec *specs.Spec `json:"runtimeSpec"`
}

// sandbox returns the pod's sandbox process and spec, as the CRI knows
// them.
func (p *pod) sandbox(ctx context.Context, t *testing.T) sandboxInfo {
	t.Helper()
	st, err := p.c.runtime.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: p.id, Verbose: true})
	if err != nil {
		t.Fatalf("PodSandboxStatus: %v", err)
	}
	var info sandboxInfo
	if err := json.Unmarshal([]byte(st.GetInfo()["info"]), &info); err != nil || info.Pid <= 0 {
		t.Fatalf("sandbox info: pid %d, %v", info.Pid, err)
	}
	return info
}

// nsOf is readlink of /proc/PID/ns/KIND ("self" for the test's).
func nsOf(t *testing.T, pid, kind string) string {
	t.Helper()
	l, err := os.Readlink("/proc/" + pid + "/ns/" + kind)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// nsHostname is the host name process pid's UTS namespace holds, read by
// entering it.
func nsHostname(ctx context.Context, t *testing.T, pid string) string {
	t.Helper()
	out, err := exec.CommandContext(ctx, "nsenter", "-t", pid, "-u", "hostname").CombinedOutput()
	if err != nil {
		t.Fatalf("nsenter -t %s -u hostname: %v: %s", pid, err, out)
	}
	return strings.TrimSpace(string(out))
}

// TestCRISandboxNamespaces runs VM pods as the kubelet asks for them and
// checks the namespaces the CRI hands the pod's containers through the
// sandbox's pause process: a pod of its own IPC, UTS (holding the pod's
// hostname) and PID namespaces, of which the pause process is PID 1 (with
// shareProcessNamespace as without); a hostIPC, hostPID, hostNetwork pod
// in the node's, whose host name stays. The VM of the first pod boots
// and gets its lease as before.
func TestCRISandboxNamespaces(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*bootTimeout)
	defer cancel()
	c := newCRI(t, env.daemon)
	hostName, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	self := map[string]string{}
	for _, kind := range []string{"ipc", "uts", "pid", "net"} {
		self[kind] = nsOf(t, "self", kind)
	}
	nsMode := func(net, pid, ipc runtimeapi.NamespaceMode) func(*runtimeapi.PodSandboxConfig) {
		return func(cfg *runtimeapi.PodSandboxConfig) {
			cfg.Linux.SecurityContext = &runtimeapi.LinuxSandboxSecurityContext{
				NamespaceOptions: &runtimeapi.NamespaceOption{Network: net, Pid: pid, Ipc: ipc},
			}
		}
	}
	pod, node := runtimeapi.NamespaceMode_POD, runtimeapi.NamespaceMode_NODE
	for _, tc := range []struct {
		name string
		edit func(*runtimeapi.PodSandboxConfig)
		own  bool // ipc, uts and pid of the pod's own
		vm   bool
	}{
		{name: "ns-default", own: true, vm: true},
		{name: "ns-shared-pid", edit: nsMode(pod, pod, pod), own: true},
		{name: "ns-host", edit: nsMode(node, node, node)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := c.runPodWith(ctx, t, tc.name, 0, tc.edit)
			info := p.sandbox(ctx, t)
			pid := fmt.Sprint(info.Pid)
			t.Logf("sandbox pid %d, spec namespaces %+v", info.Pid, info.Spec.Linux.Namespaces)
			if argv, err := procCmdline(info.Pid); err != nil || argv[0] != "vmshim-pause" {
				t.Fatalf("sandbox process %s runs %q (%v), not vmshim-pause", pid, argv, err)
			}
			for _, kind := range []string{"ipc", "uts", "pid"} {
				if got := nsOf(t, pid, kind); (got != self[kind]) != tc.own {
					t.Errorf("pause process's %s namespace %s, the host's %s; want one of the pod's own: %v", kind, got, self[kind], tc.own)
				}
			}
			nspid := strings.Fields(secStatus(t, info.Pid)["NSpid"])
			if tc.own {
				if got := nsHostname(ctx, t, pid); got != tc.name {
					t.Errorf("hostname in the pod's uts namespace %q, want %q", got, tc.name)
				}
				if len(nspid) != 2 || nspid[1] != "1" {
					t.Errorf("pause process's NSpid %q, want PID 1 of the pod's pid namespace", nspid)
				}
			} else {
				if !sameFile(t, "/proc/"+pid+"/ns/net", "/run/netns/"+env.daemon.netns) {
					t.Errorf("hostNetwork pod's pause process is in netns %s, not the node's (containerd's)", nsOf(t, pid, "net"))
				}
				if len(nspid) != 1 {
					t.Errorf("hostPID pod's pause process's NSpid %q, want the host's pid alone", nspid)
				}
			}
			if got, err := os.Hostname(); err != nil || got != hostName {
				t.Errorf("node's host name %q (%v), was %q", got, err, hostName)
			}
			if tc.vm {
				vm := p.startVM(ctx, t, imageKernelWaitCRI, nil)
				lease := leaseFields(vm.waitLog(ctx, t, "VMSHIM-LEASE"))
				if lease["hostname"] != tc.name || lease["ip"] != p.ip(ctx, t) {
					t.Errorf("lease %v, want hostname %s and the pod's ip", lease, tc.name)
				}
			}
			p.remove(t)
			waitGone(ctx, t, "pause process "+pid, func() bool {
				_, err := os.Stat("/proc/" + pid)
				return os.IsNotExist(err)
			})
		})
	}
}

// sameFile reports whether paths a and b lead to the same file (for
// namespaces: the same namespace).
func sameFile(t *testing.T, a, b string) bool {
	t.Helper()
	fa, err := os.Stat(a)
	if err != nil {
		t.Fatal(err)
	}
	fb, err := os.Stat(b)
	if err != nil {
		t.Fatal(err)
	}
	return os.SameFile(fa, fb)
}
