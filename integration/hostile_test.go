package integration

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/pkg/oci"
	"golang.org/x/sys/unix"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/vmshim/vmshim/regfile/regfiletest"
)

// TestSecurityHostileRootfs runs images whose rootfs tries to make the
// shim reach host files: through the directory the shim keeps the VM's
// files in, through the disk directory, a kernel that leads out of the
// rootfs, and disks that are special files. Each create fails with one
// line naming the problem or boots from the image's own files; either
// way, the host files the image points at are exactly as they were
// (hashed before and after), and nothing is left behind.
func TestSecurityHostileRootfs(t *testing.T) {
	disk, err := os.ReadFile(filepath.Join(env.guestDir, "disk-wait.qcow2"))
	if err != nil {
		t.Fatal(err)
	}
	var root unix.Stat_t
	if err := unix.Stat("/", &root); err != nil {
		t.Fatal(err)
	}
	// hostDir makes a host directory with files of the given names, each
	// holding its name, for the image to point at.
	hostDir := func(t *testing.T, names ...string) string {
		dir, err := os.MkdirTemp("", "vmshim-host-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		for _, n := range names {
			data := []byte("host file " + n + "\n")
			if n == "disk.qcow2" {
				data = disk
			}
			if err := os.WriteFile(filepath.Join(dir, n), data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	// special makes the image's disk a special file in the container's
	// rootfs, as a layer would (tar has no sockets: all are made here).
	special := func(make func(p string) error) func(string) error {
		return func(rootfs string) error {
			if err := os.MkdirAll(filepath.Join(rootfs, "disk"), 0o755); err != nil {
				return err
			}
			return make(filepath.Join(rootfs, "disk", "disk.qcow2"))
		}
	}
	cases := []struct {
		name    string
		entries func(t *testing.T) (map[string]layerEntry, string) // the layer, and the host dir it points at ("" for none)
		prepare func(rootfs string) error                          // changes the rootfs before the task is made
		want    string                                             // the error; "" when it boots
	}{
		{
			name: "files-dir-symlink-empty",
			entries: func(t *testing.T) (map[string]layerEntry, string) {
				dir := hostDir(t)
				return map[string]layerEntry{"disk/disk.qcow2": layerFile(disk), ".vmshim": layerLink(dir)}, dir
			},
			want: "image has /.vmshim (symlink): the name is reserved for the files vmshim makes for the VM",
		},
		{
			name: "files-dir-symlink-full",
			entries: func(t *testing.T) (map[string]layerEntry, string) {
				dir := hostDir(t, "root.qcow2", "seed.iso")
				return map[string]layerEntry{"disk/disk.qcow2": layerFile(disk), ".vmshim": layerLink(dir)}, dir
			},
			want: "image has /.vmshim (symlink): the name is reserved for the files vmshim makes for the VM",
		},
		{
			name: "files-dir-shipped",
			entries: func(t *testing.T) (map[string]layerEntry, string) {
				return map[string]layerEntry{"disk/disk.qcow2": layerFile(disk), ".vmshim/root.qcow2": layerFile(disk)}, ""
			},
			want: "image has /.vmshim (directory): the name is reserved",
		},
		{
			// /disk resolves inside the rootfs, where its target is not:
			// the host's disk.qcow2 is never seen.
			name: "disk-dir-symlink",
			entries: func(t *testing.T) (map[string]layerEntry, string) {
				dir := hostDir(t, "disk.qcow2")
				return map[string]layerEntry{"disk": layerLink(dir), "etc/motd": layerFile([]byte("hi\n"))}, dir
			},
			// No VM in the image: an ordinary container, whose /vm runc
			// does not find.
			want: `exec: "/vm": stat /vm: no such file or directory`,
		},
		{
			// The same, with a disk of the image's own beside it: it boots
			// from that one.
			name: "disk-dir-symlink-own-disk",
			entries: func(t *testing.T) (map[string]layerEntry, string) {
				dir := hostDir(t, "disk.qcow2")
				return map[string]layerEntry{"disk": layerLink(dir), "vm.qcow2": layerFile(disk)}, dir
			},
		},
		{
			name: "kernel-symlink-out",
			entries: func(t *testing.T) (map[string]layerEntry, string) {
				dir := hostDir(t, "vmlinux")
				return map[string]layerEntry{"boot/vmlinux": layerLink(filepath.Join(dir, "vmlinux"))}, dir
			},
			want: "kernel /boot/vmlinux: points to " + os.TempDir(),
		},
		{
			name:    "disk-fifo",
			entries: func(*testing.T) (map[string]layerEntry, string) { return secNoDisk(), "" },
			prepare: special(func(p string) error { return unix.Mkfifo(p, 0o644) }),
			want:    "disk /disk/disk.qcow2: not a regular file (fifo)",
		},
		{
			// A node of the block device that holds the node's root file system.
			name:    "disk-block-device",
			entries: func(*testing.T) (map[string]layerEntry, string) { return secNoDisk(), "" },
			prepare: special(func(p string) error {
				return unix.Mknod(p, unix.S_IFBLK|0o644, int(unix.Mkdev(unix.Major(root.Dev), unix.Minor(root.Dev))))
			}),
			want: "disk /disk/disk.qcow2: not a regular file (block device)",
		},
		{
			name:    "disk-char-device",
			entries: func(*testing.T) (map[string]layerEntry, string) { return secNoDisk(), "" },
			prepare: special(func(p string) error { return unix.Mknod(p, unix.S_IFCHR|0o644, int(unix.Mkdev(1, 5))) }),
			want:    "disk /disk/disk.qcow2: not a regular file (character device)",
		},
		{
			name:    "disk-socket",
			entries: func(*testing.T) (map[string]layerEntry, string) { return secNoDisk(), "" },
			prepare: special(func(p string) error {
				l, err := net.ListenUnix("unix", &net.UnixAddr{Name: p, Net: "unix"})
				if err != nil {
					return err
				}
				l.SetUnlinkOnClose(false)
				return l.Close()
			}),
			want: "disk /disk/disk.qcow2: not a regular file (socket)",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
			defer cancel()
			entries, target := tc.entries(t)
			ref := "localhost/vmshim-test/hostile:" + tc.name
			archive := filepath.Join(t.TempDir(), "image.tar")
			if err := writeLinkArchive(archive, ref, entries); err != nil {
				t.Fatal(err)
			}
			if out, err := env.daemon.ctr(ctx, "images", "import", archive); err != nil {
				t.Fatalf("import: %v: %s", err, out)
			}
			defer env.daemon.ctr(context.Background(), "images", "rm", ref)
			before := secHashTree(t, target)
			var opts []oci.SpecOpts
			if tc.prepare != nil {
				opts = append(opts, secWithRootfs(tc.prepare))
			}
			id := uniqueID(t)
			v, err := createVM(ctx, t, id, ref, nil, opts...)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("create: %v", err)
			case tc.want == "":
				v.start(ctx, t)
				v.console.waitFor(ctx, t, markerBooted)
			case err == nil:
				t.Errorf("create succeeded, want %q", tc.want)
			case !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n"):
				t.Errorf("create: %q, want one line naming %q", err, tc.want)
			default:
				t.Logf("create: %v", err)
			}
			v.remove(t)
			assertNothingLeft(ctx, t, id)
			if after := secHashTree(t, target); after != before {
				t.Errorf("host directory %s changed:\nbefore:\n%s\nafter:\n%s", target, before, after)
			}
		})
	}
}

// secNoDisk is a layer with no disk, for a test to make one in the rootfs.
func secNoDisk() map[string]layerEntry {
	return map[string]layerEntry{"etc/motd": layerFile([]byte("hi\n"))}
}

// secWithRootfs lets prepare change the container's rootfs (its
// snapshot, mounted for the call) once the spec is made, before the task
// is: what a layer could have held.
func secWithRootfs(prepare func(rootfs string) error) oci.SpecOpts {
	return func(ctx context.Context, cl oci.Client, c *containers.Container, _ *oci.Spec) (retErr error) {
		mounts, err := cl.SnapshotService(c.Snapshotter).Mounts(ctx, c.SnapshotKey)
		if err != nil {
			return err
		}
		dir, err := os.MkdirTemp("", "vmshim-rootfs-")
		if err != nil {
			return err
		}
		defer os.Remove(dir)
		if err := mount.All(mounts, dir); err != nil {
			return err
		}
		defer func() { retErr = errors.Join(retErr, mount.UnmountAll(dir, 0)) }()
		return prepare(dir)
	}
}

// secHashTree describes every entry under dir, recursively: its path,
// type, mode, owner, and its content's hash or its link's target ("" for
// dir "").
func secHashTree(t *testing.T, dir string) string {
	t.Helper()
	if dir == "" {
		return ""
	}
	var lines []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		line := fmt.Sprintf("%s %v %d:%d", strings.TrimPrefix(p, dir), fi.Mode(), st.Uid, st.Gid)
		switch {
		case fi.Mode().IsRegular():
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(data)
			line += " " + hex.EncodeToString(sum[:])
		case fi.Mode()&os.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			line += " -> " + target
		}
		lines = append(lines, line)
		return nil
	})
	if err != nil {
		t.Fatalf("hash %s: %v", dir, err)
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// maxShimGrowth is how much a hostile input may grow the pod's shim, in
// KiB: a bound on what the shim keeps, far below what keeping the input
// would cost, and above what the Go runtime may map on its own.
const maxShimGrowth = 16 << 10

// TestSecurityAgentFlood has a guest replace qemu-ga with `cat /dev/zero`
// on the agent's port, as a guest that wants to grow the shim would. The
// execs that follow fail, one line each, and the shim's resident memory
// stays within maxShimGrowth of what it was before: the shim skips what
// the port carries without keeping it, and drops the connection past
// 1 MiB of it.
func TestSecurityAgentFlood(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*bootTimeout)
	defer cancel()
	p, vm := runAgentVM(ctx, t, "agentflood")
	shim := podShim(t, p)
	vm.mustExec(ctx, t, "true")
	idle := vmRSS(t, shim)
	// In the background, so that this exec ends before qemu-ga does.
	vm.mustExec(ctx, t, "sh", "-c", "(sleep 2; kill $(pidof qemu-ga); sleep 1; "+
		"exec cat /dev/zero >/dev/virtio-ports/org.qemu.guest_agent.0) </dev/null >/dev/null 2>&1 &")
	// Execs fail at first because the port is closed (no agent), then
	// because of what it carries: count the second kind.
	const flood = "more than 1048576 bytes before the agent's answer"
	failed := 0
	for try := 0; failed < 4 && try < 60; try++ {
		r, err := vm.execSync(ctx, t, 30, "true")
		switch {
		case err != nil:
			t.Logf("exec under the flood: %v", err)
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error of more than one line: %q", err)
			}
			if strings.Contains(err.Error(), flood) {
				failed++
			} else {
				time.Sleep(time.Second)
			}
		case r.ExitCode == 0:
			time.Sleep(time.Second) // the flood has not begun yet
		default:
			t.Logf("exec under the flood: exit %d, stderr %q", r.ExitCode, r.Stderr)
			time.Sleep(time.Second)
		}
	}
	if failed == 0 {
		t.Fatalf("no exec failed with %q: the flood never reached the shim", flood)
	}
	flooded := vmRSS(t, shim)
	t.Logf("shim %d: VmRSS %d KiB idle, %d KiB after %d execs under the flood", shim, idle, flooded, failed)
	if flooded-idle > maxShimGrowth {
		t.Errorf("the shim grew by %d KiB under the flood, more than %d", flooded-idle, maxShimGrowth)
	}
	p.remove(t)
	assertNothingLeftCRI(t, vm.id)
}

// TestSecurityHostnameFile gives a CRI container an /etc/hostname mount
// whose source is a 4 GiB sparse file, and one that is a fifo: the shim
// used to read the first whole (8.4 GB of RSS) and to hang on the second.
// Each create fails at once in one line naming the file, and the pod's
// shim does not grow.
func TestSecurityHostnameFile(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*bootTimeout)
	defer cancel()
	c := newCRI(t, env.daemon)
	dir := filepath.Join(env.daemon.dir, "volumes", "hostname")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	sparse, fifo := filepath.Join(dir, "sparse"), filepath.Join(dir, "fifo")
	if err := os.WriteFile(sparse, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(sparse, 4<<30); err != nil {
		t.Fatal(err)
	}
	_ = os.Remove(fifo)
	if err := unix.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, src, want string }{
		{"sparse", sparse, "more than 4096 bytes"},
		{"fifo", fifo, "not a regular file (fifo)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := c.runPod(ctx, t, "hostname-"+tc.name)
			shim := podShim(t, p)
			before := vmRSS(t, shim)
			vm := p.createVMWith(ctx, t, imageKernelWait, func(cfg *runtimeapi.ContainerConfig) {
				cfg.Mounts = []*runtimeapi.Mount{{ContainerPath: "/etc/hostname", HostPath: tc.src, Readonly: true}}
			})
			_, err := c.runtime.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: vm.id})
			switch {
			case err == nil:
				t.Errorf("a VM started with %s as its /etc/hostname", tc.name)
			case strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), "/etc/hostname mount: read "+tc.src+": "+tc.want):
				t.Errorf("want one line naming %s: %s, got:\n%v", tc.src, tc.want, err)
			default:
				t.Logf("refused: %v", err)
			}
			after := vmRSS(t, shim)
			t.Logf("shim %d: VmRSS %d KiB before, %d KiB after", shim, before, after)
			if after-before > maxShimGrowth {
				t.Errorf("the shim grew by %d KiB, more than %d", after-before, maxShimGrowth)
			}
			c.runtime.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: vm.id})
			p.remove(t)
			assertNothingLeftCRI(t, vm.id)
		})
	}
}

// TestSecurityPlantedRootDiskNames plants a device node (/dev/null's 1:3)
// on a root-disk volume at each name the shim opens there, as another pod
// sharing the volume could: vmshim-root.lock, the disk, its record (beside
// a disk, which is when the record is read) and the UEFI variables (with
// firmware uefi). The create fails in one line naming the file, and
// inotify on the volume sees no open of the node.
func TestSecurityPlantedRootDiskNames(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*bootTimeout)
	defer cancel()
	c := newCRI(t, env.daemon)
	for _, tc := range []struct {
		name, image string
		ann         map[string]string
		withDisk    bool
	}{
		{name: "vmshim-root.lock", image: imageDiskWait},
		{name: "vmshim-root.qcow2", image: imageDiskWait},
		{name: "vmshim-root.json", image: imageDiskWait, withDisk: true},
		{name: "vmshim-efivars.fd", image: imageDiskUEFI, ann: map[string]string{annotationFirmware: "uefi"}, withDisk: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vol := filepath.Join(env.daemon.dir, "volumes", "planted-"+strings.TrimPrefix(tc.name, "vmshim-"))
			_ = os.RemoveAll(vol)
			if err := os.MkdirAll(vol, 0o700); err != nil {
				t.Fatal(err)
			}
			defer os.RemoveAll(vol)
			if tc.withDisk {
				disk := filepath.Join(vol, "vmshim-root.qcow2")
				if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", disk, "64M").CombinedOutput(); err != nil {
					t.Fatalf("qemu-img create: %v: %s", err, out)
				}
			}
			node := filepath.Join(vol, tc.name)
			if err := unix.Mknod(node, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
				t.Fatal(err)
			}
			opens := regfiletest.WatchOpens(t, vol)
			ann := map[string]string{annotationRootDiskVolume: "/data"}
			for k, v := range tc.ann {
				ann[k] = v
			}
			p := c.runPod(ctx, t, "planted")
			vm := p.createVMWith(ctx, t, tc.image, func(cfg *runtimeapi.ContainerConfig) {
				cfg.Annotations = ann
				cfg.Mounts = []*runtimeapi.Mount{{ContainerPath: "/data", HostPath: vol}}
			})
			_, err := c.runtime.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: vm.id})
			want := "root disk volume /data: open " + tc.name + ": not a regular file (character device)"
			switch {
			case err == nil:
				t.Errorf("a VM started with a device node as %s", tc.name)
			case strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), want):
				t.Errorf("want one line with %q, got:\n%v", want, err)
			default:
				t.Logf("refused: %v", err)
			}
			for _, o := range opens() {
				if o == tc.name {
					t.Errorf("the device node planted as %s was opened", tc.name)
				}
			}
			if fi, err := os.Lstat(node); err != nil || fi.Mode()&os.ModeCharDevice == 0 {
				t.Errorf("the planted node is gone or replaced: %v %v", fi, err)
			}
			c.runtime.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: vm.id})
			p.remove(t)
			assertNothingLeftCRI(t, vm.id)
		})
	}
}

// podShim is the pid of the pod's shim.
func podShim(t *testing.T, p *pod) int {
	t.Helper()
	pid, err := pidOf("containerd-shim-vm-v2 -namespace " + criNamespace + " -id " + p.id + " ")
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// vmRSS is a process's resident memory, in KiB.
func vmRSS(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("VmRSS %q: %v", v, err)
			}
			return n
		}
	}
	t.Fatalf("/proc/%d/status has no VmRSS", pid)
	return 0
}
