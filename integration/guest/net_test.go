package guest_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// Network markers (init.sh and udhcpc.sh).
const (
	markerLease     = "VMSHIM-LEASE "
	markerRenew     = "VMSHIM-RENEW "
	markerHTTPReady = "VMSHIM-HTTP-READY"
	markerGateway   = "VMSHIM-GATEWAY-"
	markerPeer      = "VMSHIM-PEER-"
	markerWarning   = "VMSHIM-GUEST-WARNING"
)

// The test network: t0 in the test netns is the guest's link, with the
// gateway address and a link-local address the guest reaches on-link.
const (
	netGuestMAC = "52:54:00:76:6d:01"
	netGuestIP  = "10.88.0.5"
	netGateway  = "10.88.0.1"
	netLinkNet  = "169.254.1.1"
	netHostname = "pod-a"
	// netRoutes is option 121 as the guest's udhcpc reports it. Option 3
	// names another router (10.88.0.254); the guest must use this one.
	netRoutes = "0.0.0.0/0 10.88.0.1 169.254.1.1/32 0.0.0.0 10.88.0.0/24 0.0.0.0"
	// netPeerBody is what the netns serves on netGateway:8080 as the
	// guest's vmshim.test.peer.
	netPeerBody = "vmshim-test-peer " + netGateway
)

// udhcpdConf is busybox udhcpd's configuration for the guest's lease; %s
// is the temp dir. The lease is short so the test sees a renewal.
const udhcpdConf = `interface t0
start 10.88.0.5
end 10.88.0.5
max_leases 1
lease_file %[1]s/udhcpd.leases
pidfile %[1]s/udhcpd.pid
min_lease 10
static_lease ` + netGuestMAC + ` ` + netGuestIP + `
opt subnet 255.255.255.0
opt router 10.88.0.254
opt staticroutes 0.0.0.0/0 10.88.0.1
opt staticroutes 169.254.1.1/32 0.0.0.0
opt staticroutes 10.88.0.0/24 0.0.0.0
opt dns 10.96.0.10 10.96.0.11
opt domain cluster.local
opt search svc.cluster.local cluster.local
opt hostname ` + netHostname + `
opt mtu 1400
opt lease 16
`

// testNetns is a network namespace made for one test, with the daemons
// running in it.
type testNetns struct {
	t    *testing.T
	name string
	path string
	mu   sync.Mutex // guards out
	out  strings.Builder
}

// newTestNetns creates a network namespace holding the tap t0 (the
// gateway's and a link-local address on it, up), and removes it when the
// test ends. Nothing of it touches the host's network.
func newTestNetns(t *testing.T) *testNetns {
	t.Helper()
	n := &testNetns{t: t, name: fmt.Sprintf("vmshim-guestnet-%d", os.Getpid())}
	n.path = "/run/netns/" + n.name
	n.ip("netns", "add", n.name)
	t.Cleanup(func() {
		_ = exec.Command("ip", "-n", n.name, "link", "del", "t0").Run()
		if out, err := exec.Command("ip", "netns", "del", n.name).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", n.name, err, out)
		}
	})
	n.ip("-n", n.name, "link", "set", "lo", "up")
	n.ip("-n", n.name, "tuntap", "add", "dev", "t0", "mode", "tap")
	n.ip("-n", n.name, "addr", "add", netGateway+"/24", "dev", "t0")
	n.ip("-n", n.name, "addr", "add", netLinkNet+"/32", "dev", "t0")
	n.ip("-n", n.name, "link", "set", "t0", "up")
	return n
}

// ip runs ip(8) with args, failing the test on error.
func (n *testNetns) ip(args ...string) {
	n.t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		n.t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// Write collects the daemons' output, shown when the test fails.
func (n *testNetns) Write(p []byte) (int, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.out.Write(p)
}

// daemon starts a busybox applet in the netns until the test ends.
func (n *testNetns) daemon(args ...string) {
	n.t.Helper()
	cmd := exec.Command("nsenter", append([]string{"--net=" + n.path, "busybox"}, args...)...)
	cmd.Stdout, cmd.Stderr = n, n
	if err := cmd.Start(); err != nil {
		n.t.Fatalf("busybox %s: %v", args[0], err)
	}
	n.t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if n.t.Failed() {
			n.mu.Lock()
			n.t.Logf("busybox %s in %s:\n%s", args[0], n.name, n.out.String())
			n.mu.Unlock()
		}
	})
}

// fetch gets url from inside the netns with busybox wget, whose -T Debian's
// busybox lacks, so the context bounds it.
func (n *testNetns) fetch(ctx context.Context, url string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "nsenter", "--net="+n.path, "busybox", "wget", "-q", "-O", "-", url).Output()
	if err != nil {
		return "", fmt.Errorf("wget %s: %w", url, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// parseLease splits a VMSHIM-LEASE line into its fields; routes= is the
// rest of the line.
func parseLease(line string) map[string]string {
	f := map[string]string{}
	head, routes, ok := strings.Cut(strings.TrimPrefix(line, markerLease), " routes=")
	if ok {
		f["routes"] = routes
	}
	for _, kv := range strings.Fields(head) {
		if k, v, ok := strings.Cut(kv, "="); ok {
			f[k] = v
		}
	}
	return f
}

func TestParseLease(t *testing.T) {
	got := parseLease("VMSHIM-LEASE if=eth0 ip=10.88.0.5 mask=24 router=- mtu=- dns=a,b search=- hostname=- routes=0.0.0.0/0 10.88.0.1")
	want := map[string]string{"if": "eth0", "ip": "10.88.0.5", "mask": "24", "router": "-", "mtu": "-",
		"dns": "a,b", "search": "-", "hostname": "-", "routes": "0.0.0.0/0 10.88.0.1"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("parseLease = %v, want %v", got, want)
	}
}

// TestGuestNetwork boots the kernel guest with a virtio NIC on a tap in a
// network namespace of its own, answers its DHCP with busybox udhcpd and
// checks the lease it reports, the gateway ping, its HTTP server seen from
// the netns, its fetch from a peer (a server in the netns) and a renewal.
func TestGuestNetwork(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates a network namespace with a tap and a DHCP server")
	}
	for _, tool := range []string{"ip", "nsenter", "busybox"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed", tool)
		}
	}
	dir := guestDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	n := newTestNetns(t)
	tmp := t.TempDir()
	conf := filepath.Join(tmp, "udhcpd.conf")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf(udhcpdConf, tmp)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tmp, "udhcpd.leases"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	www := filepath.Join(tmp, "www")
	if err := os.MkdirAll(www, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(www, "index.html"), []byte(netPeerBody+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	n.daemon("udhcpd", "-f", conf)
	n.daemon("httpd", "-f", "-p", netGateway+":8080", "-h", www)

	v := startVMIn(t, ctx, n.path,
		"-kernel", filepath.Join(dir, "vmlinux"), "-initrd", filepath.Join(dir, "initrd-wait.img"),
		"-append", "console=ttyS0 vmshim.test.peer="+netGateway,
		"-netdev", "tap,id=n0,ifname=t0,script=no,downscript=no",
		"-device", "virtio-net-pci,netdev=n0,mac="+netGuestMAC)
	v.booted("kernel-net")
	booted := time.Now()
	lease := v.waitFor(markerLease, 2*time.Minute)
	t.Logf("kernel-net: %s %.2fs after QEMU started, %.2fs after %s",
		strings.TrimSpace(markerLease), time.Since(v.start).Seconds(), time.Since(booted).Seconds(), markerBooted)

	want := map[string]string{
		"if": "eth0", "ip": netGuestIP, "mask": "24", "router": netGateway, "mtu": "1400",
		"dns": "10.96.0.10,10.96.0.11", "search": "svc.cluster.local,cluster.local",
		"hostname": netHostname, "routes": netRoutes,
	}
	got := parseLease(lease)
	for k, w := range want {
		if got[k] != w {
			t.Errorf("lease %s = %q, want %q (line %q)", k, got[k], w, lease)
		}
	}

	m := v.waitForAll(2*time.Minute, markerHTTPReady, markerGateway, markerPeer)
	if g := m[markerGateway]; g != markerGateway+"OK "+netGateway {
		t.Errorf("gateway check: %q", g)
	}
	if p := m[markerPeer]; p != markerPeer+"OK "+netPeerBody {
		t.Errorf("peer check: %q", p)
	}
	var body string
	var err error
	for i := 0; i < 5; i++ {
		if body, err = n.fetch(ctx, "http://"+netGuestIP+":8080/"); err == nil {
			break
		}
		time.Sleep(time.Second)
	}
	if err != nil {
		t.Errorf("guest http server: %v", err)
	} else if want := "VMSHIM-HTTP-OK " + netHostname + " " + netGuestIP; body != want {
		t.Errorf("guest http server says %q, want %q", body, want)
	}

	// The lease is 16 s: udhcpc renews it within that.
	if r := v.waitFor(markerRenew, time.Minute); r != markerRenew+"if=eth0 ip="+netGuestIP {
		t.Errorf("renewal: %q", r)
	}
	v.send("poweroff")
	v.waitFor(markerPoweroff, 30*time.Second)
	v.waitExit(30 * time.Second)
	v.wholeLines()
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, line := range v.log {
		if strings.HasPrefix(line, markerWarning) {
			t.Errorf("guest warning: %q", line)
		}
	}
}
