package integration

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Markers the test guests print before BOOTED (see guest/init.sh).
const (
	markerDisks   = "VMSHIM-DISKS"   // name:sectors[:ro] for each block device
	markerCmdline = "VMSHIM-CMDLINE" // the kernel command line
)

// Annotations these tests set.
const (
	annotationDiskDriver    = "vmshim.io/disk-driver"
	annotationRootDiskSize  = "vmshim.io/root-disk-size"
	annotationKernelCmdline = "vmshim.io/kernel-cmdline"
)

// guestDisk is one block device a guest reported.
type guestDisk struct {
	sectors  int64 // 512-byte sectors
	readOnly bool
}

// parseDisks parses a VMSHIM-DISKS line: "VMSHIM-DISKS vda:67584 vdb:2048:ro"
// or "VMSHIM-DISKS -".
func parseDisks(t *testing.T, line string) map[string]guestDisk {
	t.Helper()
	i := strings.Index(line, markerDisks+" ")
	if i < 0 {
		t.Fatalf("not a %s line: %q", markerDisks, line)
	}
	disks := map[string]guestDisk{}
	for _, f := range strings.Fields(line[i+len(markerDisks):]) {
		if f == "-" {
			continue
		}
		name, rest, _ := strings.Cut(f, ":")
		size, flag, ro := strings.Cut(rest, ":")
		n, err := strconv.ParseInt(size, 10, 64)
		if name == "" || err != nil || (ro && flag != "ro") {
			t.Fatalf("bad disk %q in %q", f, line)
		}
		disks[name] = guestDisk{sectors: n, readOnly: ro}
	}
	return disks
}

// imageSectors returns the virtual size of the disk image at p in 512-byte
// sectors, as qemu-img info reports it.
func imageSectors(t *testing.T, p string) int64 {
	t.Helper()
	var info struct {
		VirtualSize int64 `json:"virtual-size"`
	}
	out := qemuImg(t, "", "info", "--output=json", "-f", "qcow2", p)
	if err := json.Unmarshal(out, &info); err != nil || info.VirtualSize <= 0 {
		t.Fatalf("qemu-img info %s: %v:\n%s", p, err, out)
	}
	return info.VirtualSize / 512
}

// TestDiskDrivers boots the disk image through the CRI on each disk bus
// the shim offers, and once grown with vmshim.io/root-disk-size: SeaBIOS
// boots from that bus, the guest names the root disk as that driver does,
// sees its size, and may write to it. Any other disk (the cloud-init seed)
// must be read-only.
func TestDiskDrivers(t *testing.T) {
	base := imageSectors(t, filepath.Join(env.guestDir, "disk-wait.qcow2"))
	cases := []struct {
		name        string
		annotations map[string]string
		disk        string // the root disk's name in the guest
		sectors     int64
	}{
		{"virtio-blk", map[string]string{annotationDiskDriver: "virtio-blk"}, "vda", base},
		{"virtio-scsi", map[string]string{annotationDiskDriver: "virtio-scsi"}, "sda", base},
		{"nvme", map[string]string{annotationDiskDriver: "nvme"}, "nvme0n1", base},
		{"root-disk-size", map[string]string{annotationRootDiskSize: "1Gi"}, "vda", 1 << 30 / 512},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
			defer cancel()
			p := newCRI(t, env.daemon).runPod(ctx, t, "disk-"+tc.name)
			vm := p.startVM(ctx, t, imageDiskWait, tc.annotations)
			line := vm.waitLog(ctx, t, markerDisks)
			vm.waitLog(ctx, t, markerBooted)
			t.Logf("%s", line)
			disks := parseDisks(t, line)
			root, ok := disks[tc.disk]
			switch {
			case !ok:
				t.Errorf("no root disk %s in %q", tc.disk, line)
			case root.sectors != tc.sectors:
				t.Errorf("root disk %s: %d sectors, want %d", tc.disk, root.sectors, tc.sectors)
			case root.readOnly:
				t.Errorf("root disk %s is read-only", tc.disk)
			}
			for name, d := range disks {
				if name != tc.disk && !d.readOnly {
					t.Errorf("writable disk %s besides the root disk in %q", name, line)
				}
			}
			p.remove(t)
			assertNothingLeftCRI(t, vm.id)
		})
	}
}

// TestDiskRootSizeTooSmall: a vmshim.io/root-disk-size smaller than the
// image's disk is refused, when the container is created or started, with
// one line naming the annotation, and leaves nothing behind.
func TestDiskRootSizeTooSmall(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	c := newCRI(t, env.daemon)
	p := c.runPod(ctx, t, "disk-small")
	cfg := &runtimeapi.ContainerConfig{
		Metadata:    &runtimeapi.ContainerMetadata{Name: "vm-small"},
		Image:       &runtimeapi.ImageSpec{Image: imageDiskWait},
		LogPath:     "vm-small.log",
		Annotations: map[string]string{annotationRootDiskSize: "1Mi"},
	}
	var id string
	created, err := c.runtime.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: p.id, Config: cfg, SandboxConfig: p.config})
	if err == nil {
		id = created.ContainerId
		_, err = c.runtime.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: id})
	}
	switch {
	case err == nil:
		t.Errorf("a 1Mi root disk was accepted")
	case strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), annotationRootDiskSize):
		t.Errorf("want one line naming %s, got:\n%v", annotationRootDiskSize, err)
	}
	t.Logf("refused: %v", err)
	if id != "" {
		if _, err := c.runtime.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: id}); err != nil {
			t.Errorf("RemoveContainer: %v", err)
		}
	}
	p.remove(t)
	if id != "" {
		assertNothingLeftCRI(t, id)
	}
}

// TestDiskKernelCmdline: vmshim.io/kernel-cmdline adds its words to the
// base command line of a direct kernel boot, after it.
func TestDiskKernelCmdline(t *testing.T) {
	const word = "vmshim.test.word=hello-cmdline"
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	p := newCRI(t, env.daemon).runPod(ctx, t, "disk-cmdline")
	vm := p.startVM(ctx, t, imageKernelWaitCRI, map[string]string{annotationKernelCmdline: word})
	line := vm.waitLog(ctx, t, markerCmdline)
	t.Logf("%s", line)
	fields := strings.Fields(line[strings.Index(line, markerCmdline)+len(markerCmdline):])
	base, extra := -1, -1
	for i, f := range fields {
		switch f {
		case "console=ttyS0":
			base = i
		case word:
			extra = i
		}
	}
	if base < 0 || extra < base {
		t.Errorf("command line %q: want console=ttyS0 and then %s", line, word)
	}
	vm.waitLog(ctx, t, markerBooted)
	p.remove(t)
	assertNothingLeftCRI(t, vm.id)
}
