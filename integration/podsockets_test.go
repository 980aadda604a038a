package integration

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// Ports of checkPodSockets: one of the pod IP that the test guests do not
// serve, and one of the daemon's netns.
const (
	sidecarPort = "9090"
	hostPort    = "9091"
)

// checkPodSockets plays a container beside the VM in the pod's netns
// (podNetns): a server it runs on the pod IP takes its port from the
// pod network, while the guest keeps serving its own (8080); and a
// connection it opens to hostIP, an address of the daemon's netns, gets
// its answer.
func checkPodSockets(ctx context.Context, t *testing.T, d *daemon, podNetns, podIP, name, hostIP string) {
	t.Helper()
	hostNetns := "/run/netns/" + d.netns
	var wg sync.WaitGroup
	defer wg.Wait()
	// Each server reads the request before it answers and closes, so that
	// the client sees an orderly end. Both are closed when the check
	// ends: nothing of the test holds the pod netns.
	answer := func(nsPath, addr, reply string) net.Listener {
		var ln net.Listener
		if err := inNetns(nsPath, func() (err error) {
			ln, err = net.Listen("tcp", addr)
			return err
		}); err != nil {
			t.Fatalf("%s: listen on %s: %v", name, addr, err)
		}
		wg.Go(func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				_ = c.SetDeadline(time.Now().Add(30 * time.Second))
				_, _ = c.Read(make([]byte, 512))
				_, _ = c.Write([]byte(reply + "\n"))
				c.Close()
			}
		})
		return ln
	}
	sidecar := answer(podNetns, net.JoinHostPort(podIP, sidecarPort), "VMSHIM-SIDECAR "+name)
	defer sidecar.Close()
	host := answer(hostNetns, net.JoinHostPort(hostIP, hostPort), "VMSHIM-HOST-OK")
	defer host.Close()

	if body := httpGetAddr(ctx, t, hostNetns, net.JoinHostPort(podIP, sidecarPort)); !strings.Contains(body, "VMSHIM-SIDECAR "+name) {
		t.Errorf("%s: the pod netns's server on %s from the host netns: %q", name, net.JoinHostPort(podIP, sidecarPort), body)
	}
	if body := httpGet(ctx, t, hostNetns, podIP); !strings.Contains(body, "VMSHIM-HTTP-OK "+name) {
		t.Errorf("%s: the guest's :8080 from the host netns beside the pod netns's server: %q", name, body)
	}
	if body := httpGetAddr(ctx, t, podNetns, net.JoinHostPort(hostIP, hostPort)); !strings.Contains(body, "VMSHIM-HOST-OK") {
		t.Errorf("%s: from the pod netns to %s: %q", name, hostIP, body)
	}
}
