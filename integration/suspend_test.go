package integration

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestSuspendResume: a VM with vmshim.io/on-stop suspend and its root
// disk on a volume is saved there when the CRI stops it, exiting 0; the
// next pod on the volume resumes it instead of booting (its guest never
// boots again: a marker in its RAM, a process with its PID and its uptime
// go on) and takes the state off the volume; the guest takes the new
// pod's address and serves HTTP on it. The pod after that, the state
// gone, boots the disk.
func TestSuspendResume(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*bootTimeout)
	defer cancel()
	d := criDaemon(ctx, t, daemonOptions{cni: dualStackCNI}, "disk-agent.tar")
	vol := filepath.Join(d.dir, "volumes", "suspend")
	if err := os.MkdirAll(vol, 0o700); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(vol, "vmshim-state")
	c := newCRI(t, d)
	config := func(suspend bool) func(cfg *runtimeapi.ContainerConfig) {
		return func(cfg *runtimeapi.ContainerConfig) {
			cfg.Annotations = map[string]string{annotationRootDiskVolume: "/data"}
			if suspend {
				cfg.Annotations["vmshim.io/on-stop"] = "suspend"
			}
			cfg.Mounts = []*runtimeapi.Mount{{ContainerPath: "/data", HostPath: vol}}
		}
	}
	uptime := func(vm *criContainer) float64 {
		t.Helper()
		var up float64
		if _, err := fmt.Sscan(vm.mustExec(ctx, t, "cat", "/proc/uptime"), &up); err != nil {
			t.Fatalf("guest uptime: %v", err)
		}
		return up
	}

	first := runPod6(ctx, t, c, "suspend-1")
	vm := first.createVMWith(ctx, t, imageDiskAgent, config(true))
	if _, err := c.runtime.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: vm.id}); err != nil {
		t.Fatalf("StartContainer: %v", err)
	}
	vm.waitLog(ctx, t, "VMSHIM-DISK-BOOTS 0")
	vm.waitLog(ctx, t, markerAgent)
	firstIP := leaseFields(vm.waitLog(ctx, t, "VMSHIM-LEASE if=eth0"))["ip"]
	firstIP6 := leaseFields(vm.waitLog(ctx, t, "VMSHIM-LEASE6 if=eth0"))["ip"]
	const marker = "vmshim-marker-in-ram"
	vm.mustExec(ctx, t, "sh", "-c", "echo "+marker+" >/run/marker")
	pid := strings.TrimSpace(vm.mustExec(ctx, t, "sh", "-c", "sleep 86400 </dev/null >/dev/null 2>&1 & echo $!"))
	upBefore := uptime(vm)
	vm.stop(ctx, t, 60)
	if st := vm.waitExited(ctx, t); st.ExitCode != 0 {
		t.Errorf("suspended VM: exit %d (%s), want 0", st.ExitCode, st.Message)
	}
	t.Logf("%s", vm.waitLog(ctx, t, "vmshim: suspended:"))
	if fi, err := os.Stat(state); err != nil || fi.Size() < 1<<20 {
		t.Fatalf("the state on the volume: %v, %v", fi, err)
	}
	first.remove(t)
	assertNothingLeftCRI(t, vm.id)

	second := runPod6(ctx, t, c, "suspend-2")
	podIP, podIP6 := second.podIPs(ctx, t)
	if podIP == firstIP || podIP6 == firstIP6 {
		t.Fatalf("the second pod has the first pod's address: %s %s", podIP, podIP6)
	}
	resumed := second.createVMWith(ctx, t, imageDiskAgent, config(false))
	began := time.Now()
	if _, err := c.runtime.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: resumed.id}); err != nil {
		t.Fatalf("StartContainer of the resuming VM: %v\n%s", err, c.d.logTail())
	}
	t.Logf("%s", resumed.waitLog(ctx, t, "vmshim: resumed the state saved on volume /data"))
	if _, err := os.Stat(state); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the state is still on the volume after the resume: %v", err)
	}
	lease := leaseFields(resumed.waitLog(ctx, t, "VMSHIM-LEASE if=eth0"))
	t.Logf("the resumed guest holds the new pod's lease %s %.1f s after StartContainer (it had %s)", lease["ip"], time.Since(began).Seconds(), firstIP)
	if lease["ip"] != podIP {
		t.Errorf("the resumed guest's lease is for %s, want the new pod's %s", lease["ip"], podIP)
	}
	lease6 := leaseFields(resumed.waitLog(ctx, t, "VMSHIM-LEASE6 if=eth0 ip="+podIP6))
	t.Logf("... and its DHCPv6 lease %s %.1f s after (it had %s)", lease6["ip"], time.Since(began).Seconds(), firstIP6)
	for _, ip := range []string{podIP, podIP6} {
		if body := httpGet(ctx, t, "/run/netns/"+d.netns, ip); !strings.Contains(body, "VMSHIM-HTTP-OK") {
			t.Errorf("GET http://%s of the resumed guest: %q", net.JoinHostPort(ip, "8080"), body)
		}
	}
	if addrs := resumed.mustExec(ctx, t, "ip", "addr", "show", "dev", "eth0"); strings.Contains(addrs, firstIP+"/") || strings.Contains(addrs, firstIP6+"/") {
		t.Errorf("the resumed guest still has the first pod's addresses:\n%s", addrs)
	}
	if got := strings.TrimSpace(resumed.mustExec(ctx, t, "cat", "/run/marker")); got != marker {
		t.Errorf("the marker in the guest's RAM is %q after the resume, want %q", got, marker)
	}
	if got := resumed.mustExec(ctx, t, "cat", "/proc/"+pid+"/cmdline"); !strings.HasPrefix(got, "sleep\x0086400") {
		t.Errorf("process %s after the resume runs %q, want the sleep started before the stop", pid, got)
	}
	if upAfter := uptime(resumed); upAfter < upBefore {
		t.Errorf("guest uptime %.1f s after the resume, %.1f s before the stop: it booted again", upAfter, upBefore)
	}
	if _, booted := findLogLine(resumed.log, "VMSHIM-DISK-BOOTS"); booted {
		t.Errorf("the resumed guest booted again")
	}
	if st := resumed.status(ctx, t); st.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Errorf("resumed VM state %v, want running", st.State)
	}
	second.remove(t)
	assertNothingLeftCRI(t, resumed.id)

	third := runPod6(ctx, t, c, "suspend-3")
	booted := third.createVMWith(ctx, t, imageDiskAgent, config(false))
	if _, err := c.runtime.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: booted.id}); err != nil {
		t.Fatalf("StartContainer: %v", err)
	}
	booted.waitLog(ctx, t, "VMSHIM-DISK-BOOTS 1")
	third.remove(t)
	assertNothingLeftCRI(t, booted.id)
}
