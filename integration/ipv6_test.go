package integration

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// CNI networks of the IPv6 tests: the bridge plugin with host-local
// ranges, dual-stack and IPv6 alone.
const (
	dualStackCNI = `{"cniVersion": "1.0.0", "name": "vmshim-dual", "plugins": [{
  "type": "bridge", "bridge": "vmshim-br0", "isGateway": true, "ipMasq": false, "mtu": 1400,
  "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.90.0.0/24"}], [{"subnet": "fd00:90::/64"}]],
           "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}], "dataDir": "@DIR@/ipam"}}]}`
	ipv6OnlyCNI = `{"cniVersion": "1.0.0", "name": "vmshim-v6", "plugins": [{
  "type": "bridge", "bridge": "vmshim-br0", "isGateway": true, "ipMasq": false, "mtu": 1400,
  "ipam": {"type": "host-local", "ranges": [[{"subnet": "fd00:91::/64"}]],
           "routes": [{"dst": "::/0"}], "dataDir": "@DIR@/ipam"}}]}`
)

// routedIPv6 is an address of the daemon's netns outside every pod
// prefix: a guest reaches it only through its default route, so through
// the router its pod netns is for it.
const routedIPv6 = "fd00:99::1"

// dns6 is the IPv6 name server the IPv6 tests' pods are given.
const dns6 = "fd00:96::a"

// ipv6Daemon starts a daemon on the CNI network conf with the images the
// IPv6 tests use, the routed address on its loopback and a server there
// that answers every connection to port 9000 with VMSHIM-ROUTED-OK.
func ipv6Daemon(ctx context.Context, t *testing.T, conf string) *daemon {
	t.Helper()
	d := criDaemon(ctx, t, daemonOptions{cni: conf}, "kernel-wait.tar", "disk-cloud.tar")
	if out, err := exec.Command("ip", "-n", d.netns, "addr", "add", routedIPv6+"/128", "dev", "lo").CombinedOutput(); err != nil {
		t.Fatalf("ip addr add: %v: %s", err, out)
	}
	serveIn(t, "/run/netns/"+d.netns, "tcp6", net.JoinHostPort(routedIPv6, "9000"), func(c net.Conn) {
		_, _ = c.Write([]byte("VMSHIM-ROUTED-OK\n"))
		c.Close()
	})
	return d
}

// podIPs returns the pod's addresses as PodSandboxStatus reports them.
func (p *pod) podIPs(ctx context.Context, t *testing.T) (v4, v6 string) {
	t.Helper()
	st, err := p.c.runtime.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: p.id})
	if err != nil {
		t.Fatalf("PodSandboxStatus: %v", err)
	}
	n := st.GetStatus().GetNetwork()
	ips := []string{n.GetIp()}
	for _, a := range n.GetAdditionalIps() {
		ips = append(ips, a.GetIp())
	}
	for _, s := range ips {
		ip := net.ParseIP(s)
		switch {
		case ip == nil:
		case ip.To4() != nil:
			v4 = s
		default:
			v6 = s
		}
	}
	return v4, v6
}

// runPod6 runs a pod whose DNS config also names an IPv6 server.
func runPod6(ctx context.Context, t *testing.T, c *cri, name string) *pod {
	return c.runPodWith(ctx, t, name, 0, func(cfg *runtimeapi.PodSandboxConfig) {
		cfg.DnsConfig.Servers = append(cfg.DnsConfig.Servers, dns6)
	})
}

// cloud6UserData makes the cloud guest serve HTTP on port 8080 over both
// families and report its IPv6 address and default router, whether it
// reaches routedIPv6, its name servers and when the server listens.
func cloud6UserData(name string) string {
	return `#cloud-config
write_files:
  - path: /srv/www/index.html
    content: "VMSHIM-HTTP-OK ` + name + `\n"
  - path: /usr/local/bin/vmshim-v6-check
    permissions: "0755"
    content: |
      #!/bin/sh
      systemd-run --unit vmshim-http --working-directory=/srv/www python3 -m http.server 8080 --bind ::
      for i in $(seq 120); do
        a=$(ip -6 -o addr show scope global | awk '{print $4}' | head -n1)
        r=$(ip -6 route show default | awk '{print $3; exit}')
        [ -n "$a" ] && [ -n "$r" ] && break
        sleep 1
      done
      echo "VMSHIM-V6 addr=${a:--} router=${r:--}"
      python3 -c 'import socket; s = socket.create_connection(("` + routedIPv6 + `", 9000), 20); print("VMSHIM-V6-ROUTED", s.recv(64).decode().strip())' || echo "VMSHIM-V6-ROUTED failed"
      echo "VMSHIM-V6-DNS $(grep -c '^nameserver ` + dns6 + `' /etc/resolv.conf)"
      for i in $(seq 30); do ss -ltn | grep -q '[]:]8080 ' && break; sleep 1; done
      echo "VMSHIM-V6-HTTP $(systemctl is-active vmshim-http) $(ss -ltn | grep -c '[]:]8080 ')"
      echo VMSHIM-V6-DONE
runcmd:
  - [/usr/local/bin/vmshim-v6-check]
`
}

// startCloud6 starts the cloud guest with cloud6UserData in p.
func startCloud6(ctx context.Context, t *testing.T, p *pod) *criContainer {
	t.Helper()
	vm := p.createVMWith(ctx, t, imageDebianCloud, func(cfg *runtimeapi.ContainerConfig) {
		cfg.Annotations = map[string]string{"vmshim.io/user-data": cloud6UserData(p.name)}
	})
	if _, err := p.c.runtime.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: vm.id}); err != nil {
		t.Fatalf("StartContainer: %v", err)
	}
	return vm
}

// checkCloud6 checks what the cloud guest of startCloud6 reports: the
// pod's IPv6 address, a default router, the routed address reached, the
// IPv6 name server; then fetches its page from the daemon's netns over
// each of the pod's addresses.
func checkCloud6(ctx context.Context, t *testing.T, d *daemon, p *pod, vm *criContainer) {
	t.Helper()
	v4, v6 := p.podIPs(ctx, t)
	if v6 == "" {
		t.Fatalf("pod %s has no IPv6 address", p.name)
	}
	got := leaseFields(vm.waitLog(ctx, t, "VMSHIM-V6 "))
	t.Logf("%s: pod %s %s, guest %v", p.name, v4, v6, got)
	if got["addr"] != v6+"/128" && !strings.HasPrefix(got["addr"], v6+"/") {
		t.Errorf("%s: guest's IPv6 address %q, want the pod's %s", p.name, got["addr"], v6)
	}
	if !strings.HasPrefix(got["router"], "fe80::") {
		t.Errorf("%s: guest's IPv6 default router %q, want a link-local address", p.name, got["router"])
	}
	if line := vm.waitLog(ctx, t, "VMSHIM-V6-ROUTED"); !strings.Contains(line, "VMSHIM-ROUTED-OK") {
		t.Errorf("%s: guest to %s through its default route: %q", p.name, routedIPv6, line)
	}
	if line := vm.waitLog(ctx, t, "VMSHIM-V6-DNS"); !strings.Contains(line, "VMSHIM-V6-DNS 1") {
		t.Errorf("%s: guest's resolv.conf does not name %s: %q", p.name, dns6, line)
	}
	vm.waitLog(ctx, t, "VMSHIM-V6-DONE")
	if line := vm.waitLog(ctx, t, "VMSHIM-V6-HTTP"); !strings.Contains(line, "VMSHIM-V6-HTTP active 1") {
		b, _ := os.ReadFile(vm.log)
		t.Errorf("%s: the guest's web server: %q\n%s", p.name, line, b)
	}
	for _, ip := range []string{v4, v6} {
		if ip == "" {
			continue
		}
		if body := httpGet(ctx, t, "/run/netns/"+d.netns, ip); !strings.Contains(body, "VMSHIM-HTTP-OK "+p.name) {
			t.Errorf("%s: GET http://%s:8080/ from the host netns: %q", p.name, ip, body)
		}
	}
	// A container beside the VM, over IPv6.
	checkPodSockets(ctx, t, d, p.netnsPath(ctx, t), v6, p.name, routedIPv6)
}

// TestIPv6 gives VM pods their pod's IPv6 address on a dual-stack and on
// an IPv6-only CNI network: the cloud guest (ifupdown, dhclient -6, the
// kernel's router discovery) and the busybox guest (udhcpc6). It captures
// the daemon netns's frames all along: no router advertisement or DHCPv6
// may leave a pod.
func TestIPv6(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*cloudBootTimeout)
	defer cancel()
	dual := ipv6Daemon(ctx, t, dualStackCNI)
	only := ipv6Daemon(ctx, t, ipv6OnlyCNI)
	capDual, capOnly := startCapture(t, dual), startCapture(t, only)

	cDual, cOnly := newCRI(t, dual), newCRI(t, only)
	cloudDual := runPod6(ctx, t, cDual, "cloud-dual")
	cloudOnly := runPod6(ctx, t, cOnly, "cloud-v6")
	before := netns6State(t, cloudOnly.netnsPath(ctx, t))
	vmDual := startCloud6(ctx, t, cloudDual)
	vmOnly := startCloud6(ctx, t, cloudOnly)

	// Two busybox guests with udhcpc6 while the cloud guests boot.
	t.Run("Udhcpc6", func(t *testing.T) {
		var got []string
		for _, name := range []string{"busybox-a", "busybox-b"} {
			p := runPod6(ctx, t, cDual, name)
			vm := p.startVM(ctx, t, imageKernelWaitCRI, nil)
			_, v6 := p.podIPs(ctx, t)
			lease := leaseFields(vm.waitLog(ctx, t, "VMSHIM-LEASE6"))
			t.Logf("%s: pod %s, udhcpc6 %v", name, v6, lease)
			if lease["ip"] != v6 {
				t.Errorf("%s: udhcpc6 got %q, want the pod's %s", name, lease["ip"], v6)
			}
			if !strings.Contains(lease["dns"], dns6) {
				t.Errorf("%s: udhcpc6 got name servers %q, want %s", name, lease["dns"], dns6)
			}
			got = append(got, lease["ip"])
			p.remove(t)
		}
		if got[0] == got[1] {
			t.Errorf("both pods got %s", got[0])
		}
	})

	t.Run("DualStack", func(t *testing.T) { checkCloud6(ctx, t, dual, cloudDual, vmDual) })
	t.Run("IPv6Only", func(t *testing.T) {
		checkCloud6(ctx, t, only, cloudOnly, vmOnly)
		// CRI port-forward reaches the guest over IPv6 alone.
		for i := range 2 {
			if body := cloudOnly.portForward(ctx, t, 8080, "GET / HTTP/1.0\r\n\r\n"); !strings.Contains(body, "VMSHIM-HTTP-OK cloud-v6") {
				t.Errorf("port-forward %d to the guest's :8080: %q", i, body)
			}
		}
		// The pod netns is as CNI left it once the VM is gone.
		vmOnly.stop(ctx, t, 0)
		if _, err := cloudOnly.c.runtime.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: vmOnly.id}); err != nil {
			t.Fatalf("RemoveContainer: %v", err)
		}
		if after := netns6State(t, cloudOnly.netnsPath(ctx, t)); !slices.Equal(before, after) {
			t.Errorf("pod netns before the VM:\n%s\nafter:\n%s", strings.Join(before, "\n"), strings.Join(after, "\n"))
		}
	})
	t.Run("Isolation", func(t *testing.T) {
		for _, c := range []*capture{capDual, capOnly} {
			seen, bad := c.stop()
			t.Logf("%s: %d IPv6 frames captured", c.name, seen)
			if seen == 0 {
				t.Errorf("%s: the capture saw no IPv6 at all", c.name)
			}
			for _, b := range bad {
				t.Errorf("%s: left a pod: %s", c.name, b)
			}
		}
	})
	cloudDual.remove(t)
	cloudOnly.remove(t)
	assertNothingLeftCRI(t, vmDual.id, vmOnly.id)
}

// importArchives imports image archives into the daemon's namespace ns.
func importArchives(ctx context.Context, d *daemon, ns string, archives ...string) error {
	for _, a := range archives {
		if out, err := d.ctrIn(ctx, ns, "images", "import", a); err != nil {
			return fmt.Errorf("import %s: %v: %s", a, err, out)
		}
	}
	return nil
}

// netns6State lists the IPv6 addresses (without lifetimes), routes of
// every table and forwarding settings of the netns at path, sorted.
func netns6State(t *testing.T, path string) []string {
	t.Helper()
	ns, err := netns.GetFromPath(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	names := map[int]string{}
	for _, l := range links {
		names[l.Attrs().Index] = l.Attrs().Name
	}
	var out []string
	addrs, err := h.AddrList(nil, netlink.FAMILY_V6)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		out = append(out, fmt.Sprintf("addr %s dev %s flags %#x scope %d", a.IPNet, names[a.LinkIndex], a.Flags, a.Scope))
	}
	routes, err := h.RouteListFiltered(netlink.FAMILY_V6, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range routes {
		out = append(out, fmt.Sprintf("route table %d %s via %s dev %s proto %d type %d metric %d", r.Table, r.Dst, r.Gw, names[r.LinkIndex], r.Protocol, r.Type, r.Priority))
	}
	if err := inNetns(path, func() error {
		for _, n := range append([]string{"all", "default"}, slices.Sorted(func(yield func(string) bool) {
			for _, name := range names {
				if !yield(name) {
					return
				}
			}
		})...) {
			b, err := os.ReadFile("/proc/sys/net/ipv6/conf/" + n + "/forwarding")
			if err != nil {
				return err
			}
			out = append(out, fmt.Sprintf("forwarding %s %s", n, strings.TrimSpace(string(b))))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

// capture counts the IPv6 frames on every interface of a daemon's netns
// and keeps the ones no pod may send: router advertisements and DHCPv6.
// (Router solicitations do leave a pod, the guest's aside: the pod
// netns's own eth0 sends them, as any pod's does.)
type capture struct {
	name   string
	fd     int
	wg     sync.WaitGroup
	once   sync.Once
	stopFn func()

	mu   sync.Mutex // guards seen and bad
	seen int
	bad  []string
}

func startCapture(t *testing.T, d *daemon) *capture {
	t.Helper()
	c := &capture{name: d.netns}
	err := inNetns("/run/netns/"+d.netns, func() error {
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_IPV6)))
		c.fd = fd
		return err
	})
	if err != nil {
		t.Fatalf("packet socket in %s: %v", d.netns, err)
	}
	tv := unix.Timeval{Usec: 200000}
	if err := unix.SetsockoptTimeval(c.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	c.wg.Go(func() {
		buf := make([]byte, 1<<16)
		for {
			select {
			case <-stop:
				return
			default:
			}
			n, from, err := unix.Recvfrom(c.fd, buf, 0)
			if err != nil || n < 14+40+4 {
				continue
			}
			ll, _ := from.(*unix.SockaddrLinklayer)
			c.look(buf[:n], ll)
		}
	})
	t.Cleanup(func() { c.stopped(stop) })
	c.stopFn = func() { c.stopped(stop) }
	return c
}

// look classifies one captured frame.
func (c *capture) look(frame []byte, ll *unix.SockaddrLinklayer) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seen++
	ip := frame[14:]
	next, payload := ip[6], ip[40:]
	var what string
	switch {
	case next == unix.IPPROTO_ICMPV6 && payload[0] == 134:
		what = "router advertisement"
	case next == unix.IPPROTO_UDP:
		if port := binary.BigEndian.Uint16(payload[2:4]); port == 546 || port == 547 {
			what = fmt.Sprintf("DHCPv6 to port %d", port)
		}
	}
	if what != "" && len(c.bad) < 20 {
		ifindex := 0
		if ll != nil {
			ifindex = ll.Ifindex
		}
		c.bad = append(c.bad, fmt.Sprintf("%s from %s (%s) seen on ifindex %d",
			what, net.IP(ip[8:24]), net.HardwareAddr(frame[6:12]), ifindex))
	}
}

func (c *capture) stopped(stop chan struct{}) {
	c.once.Do(func() {
		close(stop)
		c.wg.Wait()
		unix.Close(c.fd)
	})
}

// stop ends the capture and returns the number of IPv6 frames it saw
// and the forbidden ones.
func (c *capture) stop() (int, []string) {
	c.stopFn()
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.seen, c.bad
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }
