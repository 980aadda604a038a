package integration

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/vmshim/vmshim/thread"
)

const imageKernelWaitCRI = "localhost/vmshim-test/kernel:wait"

// TestPodNetworkBridge checks that a VM pod on the CNI bridge plugin owns
// the pod IP: its DHCP lease matches the CRI's view, it reaches its gateway
// and a peer pod, and the daemon's network namespace reaches it.
func TestPodNetworkBridge(t *testing.T) {
	testPodNetwork(t, env.daemon, "10.88.0.1")
}

// TestPodNetworkPtp is TestPodNetworkBridge with the ptp plugin.
func TestPodNetworkPtp(t *testing.T) {
	d, err := startDaemon(os.Getenv(envContainerd), env.binDir, daemonOptions{cni: ptpCNI})
	if err != nil {
		t.Fatal(err)
	}
	defer d.stop()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := importImages(ctx, d, env.guestDir); err != nil {
		t.Fatal(err)
	}
	testPodNetwork(t, d, "10.89.0.1")
}

func testPodNetwork(t *testing.T, d *daemon, gateway string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*bootTimeout)
	defer cancel()
	c := newCRI(t, d)

	a := c.runPod(ctx, t, "pod-a")
	vmA := a.startVM(ctx, t, imageKernelWaitCRI, nil)
	ipA := a.ip(ctx, t)
	lease := leaseFields(vmA.waitLog(ctx, t, "VMSHIM-LEASE"))
	t.Logf("pod-a %s lease %v", ipA, lease)
	for k, want := range map[string]string{"ip": ipA, "router": gateway, "mtu": "1400", "hostname": "pod-a", "dns": "10.96.0.10"} {
		if lease[k] != want {
			t.Errorf("lease %s = %q, want %q", k, lease[k], want)
		}
	}
	if !strings.Contains(lease["search"], "default.svc.cluster.local") {
		t.Errorf("lease search = %q, want the pod's search domains", lease["search"])
	}
	vmA.waitLog(ctx, t, "VMSHIM-GATEWAY-OK")
	vmA.waitLog(ctx, t, "VMSHIM-HTTP-READY")

	// The test's own network namespace (where the CNI bridge or ptp host
	// ends live) reaches a server in the guest.
	if body := httpGet(ctx, t, "/run/netns/"+d.netns, ipA); !strings.Contains(body, "VMSHIM-HTTP-OK pod-a") {
		t.Errorf("from the host netns: %q", body)
	}
	// So does the pod netns's own stack, which CRI port-forward uses.
	if body := httpGet(ctx, t, a.netnsPath(ctx, t), ipA); !strings.Contains(body, "VMSHIM-HTTP-OK pod-a") {
		t.Errorf("from the pod netns: %q", body)
	}
	// A container beside the VM serves a port of the pod IP and gets the
	// answers to its own connections.
	checkPodSockets(ctx, t, d, a.netnsPath(ctx, t), ipA, "pod-a", gateway)

	b := c.runPod(ctx, t, "pod-b")
	vmB := b.startVM(ctx, t, imageKernelWaitCRI, map[string]string{"vmshim.io/kernel-cmdline": "vmshim.test.peer=" + ipA})
	if line := vmB.waitLog(ctx, t, "VMSHIM-PEER-"); !strings.Contains(line, "VMSHIM-PEER-OK") {
		t.Errorf("pod-b could not reach pod-a: %s", line)
	}

	before := netnsCounts(t, d)
	netnsA := a.netnsPath(ctx, t)
	a.remove(t)
	b.remove(t)
	if _, err := os.Stat(netnsA); err == nil {
		t.Errorf("pod netns %s left after RemovePodSandbox", netnsA)
	}
	if after := netnsCounts(t, d); after.links != before.links-2 {
		t.Errorf("links in the host netns: %d before removing two pods, %d after", before.links, after.links)
	}
	assertNoCNIErrors(t, d)
}

// counts are resources of a daemon's network namespace and containerd.
type counts struct{ links, qdiscs, fds int }

func netnsCounts(t *testing.T, d *daemon) counts {
	t.Helper()
	lines := func(args ...string) int {
		out, err := exec.Command(args[0], args[1:]...).Output()
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		return strings.Count(string(out), "\n")
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", d.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	return counts{
		links:  lines("ip", "-n", d.netns, "-o", "link"),
		qdiscs: lines("tc", "-n", d.netns, "qdisc", "show"),
		fds:    len(fds),
	}
}

// assertNoCNIErrors fails when containerd logged a CNI failure.
func assertNoCNIErrors(t *testing.T, d *daemon) {
	t.Helper()
	data, err := os.ReadFile(d.logPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if !strings.Contains(line, "level=error") {
			continue
		}
		// The message only: ids and errors name containers, and a test's
		// container may well be named after the network config it gets
		// wrong. containerd's CNI failures say "network" in the message.
		what := strings.ToLower(logMessage.FindString(line))
		if strings.Contains(what, "network") || strings.Contains(what, "cni") {
			t.Errorf("containerd logged: %s", line)
		}
	}
}

// logMessage finds the msg field of a containerd log line.
var logMessage = regexp.MustCompile(`\bmsg="(?:[^"\\]|\\.)*"`)

// httpGet fetches http://ip:8080/ from inside the network namespace at
// nsPath and returns the response.
func httpGet(ctx context.Context, t *testing.T, nsPath, ip string) string {
	t.Helper()
	return httpGetAddr(ctx, t, nsPath, net.JoinHostPort(ip, "8080"))
}

// httpGetAddr fetches http://addr/ from inside the network namespace at
// nsPath and returns the response.
func httpGetAddr(ctx context.Context, t *testing.T, nsPath, addr string) string {
	t.Helper()
	body, err := httpGetIn(ctx, nsPath, addr)
	if err != nil {
		t.Errorf("GET %s from %s: %v", addr, nsPath, err)
	}
	return body
}

// httpGetIn is httpGetAddr that returns its error: what it read before
// the error, and the error.
func httpGetIn(ctx context.Context, nsPath, addr string) (string, error) {
	var body string
	err := inNetns(nsPath, func() error {
		var d net.Dialer
		conn, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return err
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
		if _, err := io.WriteString(conn, "GET / HTTP/1.0\r\n\r\n"); err != nil {
			return err
		}
		data, err := io.ReadAll(conn)
		body = string(data)
		return err
	})
	return body, err
}

// serveIn listens on addr in the network namespace at nsPath and hands
// each connection to handle, until the test ends.
func serveIn(t *testing.T, nsPath, network, addr string, handle func(net.Conn)) {
	t.Helper()
	var ln net.Listener
	if err := inNetns(nsPath, func() (err error) {
		ln, err = net.Listen(network, addr)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go handle(c)
		}
	}()
}

// inNetns runs fn on an OS thread inside the network namespace at path.
// Sockets fn creates stay in that namespace.
func inNetns(path string, fn func() error) error {
	return thread.Run(fn, thread.JoinNetns(path))
}
