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
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/pkg/oci"
	"golang.org/x/sys/unix"
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
			want: "no VM disk in image",
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
