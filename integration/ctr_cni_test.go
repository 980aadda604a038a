package integration

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	runtimeoptions "github.com/containerd/containerd/api/types/runtimeoptions/v1"
)

// ctrCNI is the network the shim attaches ctr tasks to in TestCtrCNINetwork.
const ctrCNI = `{
  "cniVersion": "1.0.0",
  "name": "vmshim-ctr",
  "plugins": [{
    "type": "bridge", "bridge": "vmshimctr0", "isGateway": true, "ipMasq": false,
    "ipam": {"type": "host-local", "dataDir": "@DIR@/ctr-ipam",
             "ranges": [[{"subnet": "10.91.0.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}]}
  }]
}`

// TestCtrCNINetwork checks config cni_network: a ctr task, whose spec asks
// for a new network namespace and has no hooks, gets a VM with an address
// from that network, reachable from the host side, released when the task
// is deleted, or by the shim's delete action when the shim was killed.
func TestCtrCNINetwork(t *testing.T) {
	cfgPath := writeCNIConfig(t)
	for _, killed := range []bool{false, true} {
		name := "delete"
		if killed {
			name = "shim killed"
		}
		t.Run(name, func(t *testing.T) { testCtrCNI(t, cfgPath, killed) })
	}
}

// writeCNIConfig writes the vmshim-ctr network and a shim config naming it.
func writeCNIConfig(t *testing.T) string {
	dir := env.daemon.dir
	confDir := filepath.Join(dir, "ctr-cni")
	if err := os.MkdirAll(confDir, 0o755); err != nil {
		t.Fatal(err)
	}
	conf := strings.ReplaceAll(ctrCNI, "@DIR@", dir)
	if err := os.WriteFile(filepath.Join(confDir, "10-ctr.conflist"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(dir, "shim-cni.toml")
	cfg := fmt.Sprintf("cni_network = \"vmshim-ctr\"\ncni_conf_dir = %q\ncni_bin_dirs = [\"/usr/lib/cni\"]\n", confDir)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	return cfgPath
}

func testCtrCNI(t *testing.T, cfgPath string, killed bool) {
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	dir := env.daemon.dir
	id := uniqueID(t)
	v, err := createVM(ctx, t, id, imageKernelWait, &runtimeoptions.Options{ConfigPath: cfgPath})
	if err != nil {
		t.Fatalf("create: %v\ncontainerd log:\n%s", err, env.daemon.logTail())
	}
	v.start(ctx, t)
	// The lease line is complete once the next marker follows it.
	v.console.waitFor(ctx, t, "VMSHIM-HTTP-READY")
	var lease map[string]string
	for _, line := range strings.Split(v.console.String(), "\n") {
		if strings.Contains(line, "VMSHIM-LEASE") {
			lease = leaseFields(line)
			break
		}
	}
	ip := net.ParseIP(lease["ip"])
	_, subnet, _ := net.ParseCIDR("10.91.0.0/24")
	if ip == nil || !subnet.Contains(ip) || lease["router"] != "10.91.0.1" {
		t.Fatalf("lease %v, want an address of 10.91.0.0/24 via 10.91.0.1", lease)
	}
	ipamEntry := filepath.Join(dir, "ctr-ipam", "vmshim-ctr", lease["ip"])
	if _, err := os.Stat(ipamEntry); err != nil {
		t.Errorf("no IPAM entry for %s: %v", lease["ip"], err)
	}
	if body := httpGet(ctx, t, "/run/netns/"+env.daemon.netns, lease["ip"]); !strings.Contains(body, "VMSHIM-HTTP-OK") {
		t.Errorf("guest at %s answered %q", lease["ip"], body)
	}

	if killed {
		killShim(ctx, t, v)
	} else {
		if err := v.task.Kill(ctx, syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if code := v.waitExit(ctx, t); code != 0 {
			t.Errorf("exit %d after SIGTERM, want 0", code)
		}
		v.remove(t)
	}
	if _, err := os.Stat(ipamEntry); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("IPAM entry for %s left after delete: %v", lease["ip"], err)
	}
	assertNothingLeft(ctx, t, id)
}
