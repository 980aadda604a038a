package integration

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
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

// slowVolume is a filesystem volume whose writes can be made slow: ext4
// on a loop device, mounted sync, so that a process's writes reach the
// device in its own blkio cgroup, whose throttle the test sets. It
// returns the mount point and the loop device's major:minor.
func slowVolume(t *testing.T) (dir, dev string) {
	t.Helper()
	loop := loopDevice(t, 512)
	if out, err := exec.Command("mkfs.ext4", "-q", loop).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v: %s", err, out)
	}
	dir = t.TempDir()
	if out, err := exec.Command("mount", "-o", "sync", loop, dir).CombinedOutput(); err != nil {
		t.Fatalf("mount: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", dir).Run() })
	var st unix.Stat_t
	if err := unix.Stat(loop, &st); err != nil {
		t.Fatal(err)
	}
	return dir, fmt.Sprintf("%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev))
}

// throttleWrites limits the writes of process pid's blkio cgroup to dev
// to bps bytes a second (0 lifts the limit).
func throttleWrites(t *testing.T, pid int, dev string, bps int) {
	t.Helper()
	file := filepath.Join(cgroupRoot, "blkio", cgroupOf(t, pid, "blkio"), "blkio.throttle.write_bps_device")
	if err := os.WriteFile(file, []byte(fmt.Sprintf("%s %d", dev, bps)), 0o644); err != nil {
		t.Fatalf("throttle %s: %v", file, err)
	}
}

// TestSuspendFaults: a save that cannot finish within two thirds of the
// grace period falls back to the power button, and the guest powers off
// cleanly; a shim killed during a save leaves nothing resumable; a state
// saved from another VM, cut short, or refused by QEMU, is refused in
// one line, or, with vmshim.io/on-resume-error boot, removed for the
// disk to boot. Each time the next pod boots the disk.
func TestSuspendFaults(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*bootTimeout)
	defer cancel()
	vol, dev := slowVolume(t)
	state := filepath.Join(vol, "vmshim-state")
	c := newCRI(t, env.daemon)
	run := func(name string, ann map[string]string) (*pod, *criContainer, error) {
		t.Helper()
		p := c.runPod(ctx, t, name)
		vm := p.createVMWith(ctx, t, imageDiskWait, func(cfg *runtimeapi.ContainerConfig) {
			cfg.Annotations = map[string]string{annotationRootDiskVolume: "/data"}
			maps.Copy(cfg.Annotations, ann)
			cfg.Mounts = []*runtimeapi.Mount{{ContainerPath: "/data", HostPath: vol}}
		})
		_, err := c.runtime.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: vm.id})
		return p, vm, err
	}
	boots := func(name string, n int, ann map[string]string) (*pod, *criContainer) {
		t.Helper()
		p, vm, err := run(name, ann)
		if err != nil {
			t.Fatalf("StartContainer of %s: %v", name, err)
		}
		vm.waitLog(ctx, t, fmt.Sprintf("VMSHIM-DISK-BOOTS %d", n))
		// The power button's handler is armed by then.
		vm.waitLog(ctx, t, markerBooted)
		return p, vm
	}
	refused := func(name string, ann map[string]string, want ...string) {
		t.Helper()
		p, vm, err := run(name, ann)
		if err == nil || strings.Contains(err.Error(), "\n") {
			t.Fatalf("StartContainer of %s: %v; want one line saying %q", name, err, want)
		}
		for _, w := range want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("StartContainer of %s: %v; want %q", name, err, w)
			}
		}
		t.Logf("%s refused: %v", name, err)
		p.remove(t)
		assertNothingLeftCRI(t, vm.id)
	}
	volumeHolds := func(what string, want ...string) {
		t.Helper()
		var got []string
		es, err := os.ReadDir(vol)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range es {
			if strings.HasPrefix(e.Name(), "vmshim-state") {
				got = append(got, e.Name())
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s: the volume holds %q, want %q", what, got, want)
		}
	}
	suspend := map[string]string{"vmshim.io/on-stop": "suspend"}
	qemuOf := func(vm *criContainer) int {
		pid, err := pidOf("guest=" + vm.id)
		if err != nil {
			t.Fatal(err)
		}
		return pid
	}

	// A volume that takes 1 MiB/s cannot take the state within 6.7 s,
	// two thirds of a 10 s grace period: the power button, then.
	p, vm := boots("fault-grace", 0, map[string]string{"vmshim.io/on-stop": "suspend", "io.kubernetes.pod.terminationGracePeriod": "10"})
	throttleWrites(t, qemuOf(vm), dev, 1<<20)
	vm.stop(ctx, t, 10)
	if st := vm.waitExited(ctx, t); st.ExitCode != 0 {
		t.Errorf("a guest powered off after a failed save: exit %d (%s), want 0", st.ExitCode, st.Message)
	}
	t.Logf("%s", vm.waitLog(ctx, t, "vmshim: suspend failed"))
	if line, _ := findLogLine(vm.log, "vmshim: suspend failed"); !strings.Contains(line, "did not finish within 6.7 s") {
		t.Errorf("the log says %q, want the save's bound", line)
	}
	if _, ok := findLogLine(vm.log, markerACPI); !ok {
		t.Errorf("the guest did not see the power button after the failed save")
	}
	volumeHolds("after a save past its bound")
	p.remove(t)
	assertNothingLeftCRI(t, vm.id)

	// The shim killed during a save: the cut-off state is never
	// resumed, and the next create removes it.
	p, vm = boots("fault-kill", 1, suspend)
	throttleWrites(t, qemuOf(vm), dev, 1<<20)
	shim := shimPidOf(t, p.id)
	stopped := make(chan error, 1)
	go func() {
		_, err := c.runtime.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: vm.id, Timeout: 60})
		stopped <- err
	}()
	waitGone(ctx, t, "a save under way", func() bool {
		_, err := os.Stat(state + ".part")
		return err == nil
	})
	if err := unix.Kill(shim, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	t.Logf("StopContainer with the shim killed: %v", <-stopped)
	vm.waitExited(ctx, t)
	volumeHolds("after the shim was killed during the save", "vmshim-state.part")
	p.remove(t)
	assertNothingLeftCRI(t, vm.id)

	// A whole save, resumed by nothing that differs from the VM it was
	// saved from.
	p, vm = boots("fault-save", 2, suspend)
	volumeHolds("once the next VM runs")
	vm.stop(ctx, t, 60)
	vm.waitLog(ctx, t, "vmshim: suspended:")
	p.remove(t)
	volumeHolds("after a save", "vmshim-state")
	refused("fault-vcpus", map[string]string{"vmshim.io/vcpus": "2"}, "holds a state saved", "from another VM: this one has 2 vCPUs, not 1")
	volumeHolds("after a refusal", "vmshim-state")

	fi, err := os.Stat(state)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(state, fi.Size()-1); err != nil {
		t.Fatal(err)
	}
	refused("fault-short", nil, "cut short or changed")
	p, vm = boots("fault-boot", 3, map[string]string{"vmshim.io/on-resume-error": "boot", "vmshim.io/on-stop": "suspend"})
	t.Logf("%s", vm.waitLog(ctx, t, "cannot be resumed and is removed"))
	volumeHolds("after a state was removed to boot")

	// A state QEMU refuses: its stream's first bytes overwritten.
	vm.stop(ctx, t, 60)
	vm.waitLog(ctx, t, "vmshim: suspended:")
	p.remove(t)
	f, err := os.OpenFile(state, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("VMSHIM!!"), 4096); err != nil {
		t.Fatal(err)
	}
	f.Close()
	refused("fault-corrupt", map[string]string{"vmshim.io/on-resume-error": "boot"}, "resume the saved state", "the next start boots the disk")
	volumeHolds("after QEMU refused the state")
	p, vm = boots("fault-after", 4, nil)
	p.remove(t)
	assertNothingLeftCRI(t, vm.id)
}
