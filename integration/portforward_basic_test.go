package integration

import (
	"context"
	"strings"
	"testing"
)

// TestCRIPortForwardRouterOnly forwards a port of the pod, as `kubectl
// port-forward` does, to a guest whose DHCP client applies only the router
// option (3) and ignores the classless static routes (121), as busybox
// udhcpc's usual default.script and several appliance OSes do. Such a
// guest answers the netns's relay only through its default route.
func TestCRIPortForwardRouterOnly(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*bootTimeout)
	defer cancel()
	p := newCRI(t, env.daemon).runPod(ctx, t, "portfwd-basic")
	vm := p.startVM(ctx, t, imageKernelWaitCRI, map[string]string{annotationKernelCmdline: "vmshim.mode=router-only"})
	lease := leaseFields(vm.waitLog(ctx, t, "VMSHIM-LEASE"))
	routes := vm.waitLog(ctx, t, "VMSHIM-ROUTES")
	t.Logf("lease %v", lease)
	t.Logf("guest %s", routes)
	// The responder offered option 121; the guest kept only its subnet and
	// a default route through the router, so nothing routes the netns's
	// link-local address on-link.
	if lease["routes"] == "-" {
		t.Errorf("the lease carried no option 121 for the guest to ignore")
	}
	if lease["router"] == "-" || !strings.Contains(routes, "default via "+lease["router"]) || strings.Contains(routes, "169.254.") {
		t.Fatalf("guest routes %q: want only the subnet and a default route via %s", routes, lease["router"])
	}
	vm.waitLog(ctx, t, "VMSHIM-HTTP-READY")
	ip := p.ip(ctx, t)
	for i := range 2 {
		body := p.portForward(ctx, t, 8080, "GET / HTTP/1.0\r\n\r\n")
		if !strings.Contains(body, "VMSHIM-HTTP-OK portfwd-basic "+ip) {
			t.Fatalf("port-forward %d to the guest's :8080: %q", i, body)
		}
	}
	p.remove(t)
	assertNothingLeftCRI(t, vm.id)
}
