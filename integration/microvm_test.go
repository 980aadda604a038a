package integration

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/vmshim/vmshim/config"
)

// TestMicroVM runs a kernel image on QEMU's microvm machine through the
// CRI: the guest boots with no PCI bus, finds its seed disk, NIC, agent
// port and volume share on virtio-mmio, takes the pod's address, serves
// a port-forward and runs execs; a resize changes only what the machine
// allows.
func TestMicroVM(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*bootTimeout)
	defer cancel()
	volume := t.TempDir()
	if err := os.WriteFile(filepath.Join(volume, "hello"), []byte("from-the-volume\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	p := newCRI(t, env.daemon).runPod(ctx, t, "microvm")
	vm := p.createVMWith(ctx, t, imageKernelAgent, func(cfg *runtimeapi.ContainerConfig) {
		cfg.Annotations = map[string]string{config.AnnotationMachine: config.MachineMicroVM}
		cfg.Linux = &runtimeapi.LinuxContainerConfig{Resources: &runtimeapi.LinuxContainerResources{
			CpuPeriod: 100000, CpuQuota: 100000, MemoryLimitInBytes: 512 << 20}}
		cfg.Mounts = []*runtimeapi.Mount{{ContainerPath: "/data", HostPath: volume, Readonly: true}}
	})
	if _, err := p.c.runtime.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: vm.id}); err != nil {
		t.Fatalf("StartContainer: %v", err)
	}
	vm.waitLog(ctx, t, markerAgent)
	vm.waitLog(ctx, t, markerBooted)

	var argv string
	for _, proc := range processesMentioning("guest=" + vm.id) {
		if strings.Contains(proc, "qemu-system") {
			argv = proc
		}
	}
	if !strings.Contains(argv, " -machine microvm,") || strings.Contains(argv, "-pci") {
		t.Errorf("qemu's command line: %s", argv)
	}
	if disks := parseDisks(t, vm.waitLog(ctx, t, markerDisks)); len(disks) == 0 {
		t.Errorf("the guest sees no disk (its seed)")
	}
	if lease := leaseFields(vm.waitLog(ctx, t, "VMSHIM-LEASE")); lease["ip"] != p.ip(ctx, t) {
		t.Errorf("lease %v, want the pod's address %s", lease, p.ip(ctx, t))
	}
	if out := vm.mustExec(ctx, t, "sh", "-c", "ls /sys/bus/pci/devices 2>/dev/null | wc -l; ls /sys/bus/virtio/devices | wc -l"); strings.Fields(out)[0] != "0" || strings.Fields(out)[1] == "0" {
		t.Errorf("pci devices, virtio devices: %q, want none and some", out)
	}
	vm.waitLog(ctx, t, "VMSHIM-HTTP-READY")
	if body := p.portForward(ctx, t, 8080, "GET / HTTP/1.0\r\n\r\n"); !strings.Contains(body, "VMSHIM-HTTP-OK microvm "+p.ip(ctx, t)) {
		t.Errorf("port-forward to the guest's :8080: %q", body)
	}
	// The volume is a share on virtio-9p-device.
	mount := "mkdir -p /mnt/data && mount -t 9p -o trans=virtio,version=9p2000.L,ro " + config.ShareTagPrefix + "0 /mnt/data && cat /mnt/data/hello"
	if out := vm.mustExec(ctx, t, "sh", "-c", mount); out != "from-the-volume\n" {
		t.Errorf("the volume in the guest: %q", out)
	}

	// No hot-plug: guest RAM stays, and a CPU resize changes the quota
	// but not the vCPUs.
	if err := vm.update(ctx, t, 1, 768<<20, ""); err == nil || !strings.Contains(err.Error(), "machine microvm cannot resize guest RAM") {
		t.Errorf("memory resize: %v, want the machine named", err)
	}
	if err := vm.update(ctx, t, 2, 512<<20, ""); err != nil {
		t.Errorf("cpu resize: %v", err)
	}
	if n := strings.TrimSpace(vm.mustExec(ctx, t, "nproc")); n != "1" {
		t.Errorf("nproc %s after a cpu resize, want 1", n)
	}
}
