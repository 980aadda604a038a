package integration

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// envNerdctl names the nerdctl binary the set-up built.
const envNerdctl = "VMSHIM_NERDCTL"

// nerdctlIPAMDir is where the host-local IPAM of nerdctl's default
// "bridge" network keeps its leases (its config names no dataDir).
const nerdctlIPAMDir = "/var/lib/cni/networks/bridge"

// nerdctl runs nerdctl against a test daemon, in the daemon's network
// namespace, with its state and CNI configs in the daemon's directory.
type nerdctl struct {
	bin string
	d   *daemon
}

func (n nerdctl) run(ctx context.Context, args ...string) (string, error) {
	global := []string{
		"--address", n.d.address, "--namespace", testNamespace,
		"--data-root", filepath.Join(n.d.dir, "nerdctl"),
		"--cni-path", "/usr/lib/cni", "--cni-netconfpath", filepath.Join(n.d.dir, "nerdctl-cni"),
		"--cgroup-manager", "cgroupfs", "--snapshotter", "overlayfs",
	}
	cmd := exec.CommandContext(ctx, "nsenter", append([]string{"--net=/run/netns/" + n.d.netns, "--", n.bin}, append(global, args...)...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return strings.TrimSpace(out.String()), err
}

func (n nerdctl) must(ctx context.Context, t *testing.T, args ...string) string {
	t.Helper()
	out, err := n.run(ctx, args...)
	if err != nil {
		t.Fatalf("nerdctl %s: %v\n%s\ncontainerd log:\n%s", strings.Join(args, " "), err, out, n.d.logTail())
	}
	return out
}

// waitLogs polls `nerdctl logs` until it shows marker and returns the line.
func (n nerdctl) waitLogs(ctx context.Context, t *testing.T, name, marker string) string {
	t.Helper()
	var out string
	for {
		out, _ = n.run(ctx, "logs", name)
		for _, line := range strings.Split(out, "\n") {
			if strings.Contains(line, marker) {
				return strings.TrimSpace(line)
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("nerdctl logs %s never showed %q:\n%s", name, marker, out)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// TestNerdctl runs a VM image the way nerdctl users do, on nerdctl's
// default bridge network wired by its OCI hooks: the guest's lease is the
// address nerdctl shows, a published port reaches the guest, logs show the
// console, stop presses the ACPI power button, and rm leaves nothing.
func TestNerdctl(t *testing.T) {
	bin := os.Getenv(envNerdctl)
	if bin == "" {
		t.Fatalf("%s is not set (make integration sets it)", envNerdctl)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*bootTimeout)
	defer cancel()
	n := nerdctl{bin: bin, d: env.daemon}
	_, statErr := os.Stat(nerdctlIPAMDir)
	ipamExisted := statErr == nil

	name := uniqueID(t)
	id := n.must(ctx, t, "run", "-d", "--runtime", runtimeName, "--name", name, "-p", "18080:8080", "--pull", "never", imageKernelWait)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, _ = n.run(ctx, "rm", "-f", name)
		if !ipamExisted {
			_ = os.RemoveAll(nerdctlIPAMDir)
		}
	})

	lease := leaseFields(n.waitLogs(ctx, t, name, "VMSHIM-LEASE"))
	inspected := n.must(ctx, t, "inspect", "--format", "{{.NetworkSettings.IPAddress}}", name)
	t.Logf("nerdctl container %s: lease %v, inspect %s", id, lease, inspected)
	if lease["ip"] == "" || lease["ip"] != inspected {
		t.Errorf("guest lease ip %q, nerdctl inspect shows %q", lease["ip"], inspected)
	}
	if ps := n.must(ctx, t, "ps", "--format", "{{.Names}} {{.Status}}"); !strings.Contains(ps, name+" Up") {
		t.Errorf("nerdctl ps does not show %s up:\n%s", name, ps)
	}
	if _, err := os.Stat(filepath.Join(nerdctlIPAMDir, lease["ip"])); err != nil {
		t.Errorf("no IPAM entry for %s: %v", lease["ip"], err)
	}

	// The published port, from the daemon's namespace to the bridge's
	// address: portmap's DNAT sends it to the pod IP, tc to the guest.
	n.waitLogs(ctx, t, name, "VMSHIM-HTTP-READY")
	nsPath := "/run/netns/" + env.daemon.netns
	if body := httpGetAddr(ctx, t, nsPath, net.JoinHostPort(lease["router"], "18080")); !strings.Contains(body, "VMSHIM-HTTP-OK") {
		t.Errorf("published port 18080 answered %q", body)
	}

	n.must(ctx, t, "stop", "-t", "120", name)
	logs := n.must(ctx, t, "logs", name)
	if !strings.Contains(logs, markerACPI) {
		t.Errorf("nerdctl stop did not press the power button; logs:\n%s", logs)
	}
	// nerdctl warns on stderr that a stopped container has no netns.
	if out := n.must(ctx, t, "inspect", "--format", "{{.State.ExitCode}}", name); lastLine(out) != "0" {
		t.Errorf("exit code after stop %q, want 0", out)
	}
	n.must(ctx, t, "rm", name)

	if out := n.must(ctx, t, "ps", "-a", "--format", "{{.Names}}"); strings.Contains(out, name) {
		t.Errorf("nerdctl ps -a still lists %s", name)
	}
	if _, err := os.Stat(filepath.Join(nerdctlIPAMDir, lease["ip"])); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("IPAM entry for %s left: %v", lease["ip"], err)
	}
	rules, err := exec.CommandContext(ctx, "nsenter", "--net="+nsPath, "iptables-save").CombinedOutput()
	if err != nil {
		t.Fatalf("iptables-save: %v: %s", err, rules)
	}
	// The shim adds no rule. Of the CNI plugins', portmap's go with DEL;
	// the bridge plugin's masquerade rule stays, with Debian's plugins
	// (1.1.1), whatever the runtime: nerdctl's postStop hook calls DEL
	// without the netns, and that bridge plugin then only releases the IP.
	for _, s := range []string{"18080", "CNI-DN-"} {
		if strings.Contains(string(rules), s) {
			t.Errorf("port mapping rule mentioning %q left:\n%s", s, rules)
		}
	}
	assertNothingLeft(ctx, t, id)
}

// lastLine is the last line of s.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}
