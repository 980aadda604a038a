package image

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/containerd/errdefs"
)

const qcow2Header = "QFI\xfb\x00\x00\x00\x03"

// layout builds a rootfs: keys are rootfs paths, values file contents;
// "->target" makes a symlink, "/" at the end of a key makes a directory.
func layout(t *testing.T, files map[string]string) string {
	t.Helper()
	root := filepath.Join(t.TempDir(), "rootfs")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	for rel, content := range files {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		var err error
		switch {
		case strings.HasSuffix(rel, "/"):
			err = os.MkdirAll(p, 0o755)
		case strings.HasPrefix(content, "->"):
			err = os.Symlink(strings.TrimPrefix(content, "->"), p)
		default:
			err = os.WriteFile(p, []byte(content), 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestFind(t *testing.T) {
	qcow2, raw := qcow2Header, "\xeb\x63\x90 boot sector"
	tests := []struct {
		name  string
		files map[string]string
		want  Boot // paths relative to the rootfs
	}{
		{"containerdisk qcow2", map[string]string{"/disk/vm.qcow2": qcow2, "/disk/.keep": ""}, Boot{Disk: "/disk/vm.qcow2", Format: "qcow2"}},
		{"containerdisk raw without extension", map[string]string{"/disk/disk": raw}, Boot{Disk: "/disk/disk", Format: "raw"}},
		{"disk at root", map[string]string{"/vm.qcow2": qcow2, "/etc/hostname": "x", "/README": "x"}, Boot{Disk: "/vm.qcow2", Format: "qcow2"}},
		{"raw at root", map[string]string{"/disk.img": raw}, Boot{Disk: "/disk.img", Format: "raw"}},
		{".raw at root", map[string]string{"/disk.raw": raw}, Boot{Disk: "/disk.raw", Format: "raw"}},
		{"qcow2 named .img", map[string]string{"/disk.img": qcow2}, Boot{Disk: "/disk.img", Format: "qcow2"}},
		{"empty /disk falls through", map[string]string{"/disk/": "", "/vm.img": raw}, Boot{Disk: "/vm.img", Format: "raw"}},
		{"hidden-only /disk falls through", map[string]string{"/disk/.wh..opq": "", "/vm.img": raw}, Boot{Disk: "/vm.img", Format: "raw"}},
		{"/disk beats root", map[string]string{"/disk/a.qcow2": qcow2, "/b.img": raw}, Boot{Disk: "/disk/a.qcow2", Format: "qcow2"}},
		{"disk beats /boot", map[string]string{"/disk/a.qcow2": qcow2, "/boot/vmlinuz": "k"}, Boot{Disk: "/disk/a.qcow2", Format: "qcow2"}},
		{"symlinked disk inside rootfs", map[string]string{"/disk/vm.qcow2": "->../images/vm.qcow2", "/images/vm.qcow2": qcow2}, Boot{Disk: "/images/vm.qcow2", Format: "qcow2"}},
		{"kernel prefers vmlinux", map[string]string{
			"/boot/vmlinuz-6.1.0-13-amd64": "kz", "/boot/vmlinux-6.1.0-13-amd64": "k", "/boot/initrd.img-6.1.0-13-amd64": "i",
			"/boot/config-6.1.0-13-amd64": "c", "/boot/System.map-6.1.0-13-amd64": "s",
		}, Boot{Kernel: "/boot/vmlinux-6.1.0-13-amd64", Initrd: "/boot/initrd.img-6.1.0-13-amd64"}},
		{"vmlinuz and initramfs", map[string]string{"/boot/vmlinuz": "k", "/boot/initramfs.cpio.gz": "i"}, Boot{Kernel: "/boot/vmlinuz", Initrd: "/boot/initramfs.cpio.gz"}},
		{"bzImage without initrd", map[string]string{"/boot/bzImage": "k"}, Boot{Kernel: "/boot/bzImage"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := layout(t, tc.files)
			got, err := Find(root)
			if err != nil {
				t.Fatalf("Find() error = %v", err)
			}
			want := tc.want
			want.Root = root
			for _, p := range []*string{&want.Disk, &want.Kernel, &want.Initrd} {
				if *p != "" {
					*p = filepath.Join(root, *p)
				}
			}
			if *got != want {
				t.Fatalf("Find() = %+v, want %+v", *got, want)
			}
		})
	}
}

func TestFindErrors(t *testing.T) {
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "outside.img"), []byte("host secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		files   map[string]string
		wantErr string
		is      func(error) bool
	}{
		{"empty rootfs", map[string]string{}, "no VM disk in image: expected a disk file under /disk/ or at /, or a kernel under /boot/", errdefs.IsNotFound},
		{"ordinary container", map[string]string{"/bin/sh": "x", "/etc/passwd": "root:x:0:0"}, "no VM disk in image", errdefs.IsNotFound},
		{"two files in /disk", map[string]string{"/disk/a.qcow2": "a", "/disk/b.img": "b"}, "more than one disk file in image: /disk/a.qcow2, /disk/b.img", errdefs.IsInvalidArgument},
		{"two disks at root", map[string]string{"/a.img": "a", "/b.qcow2": "b"}, "more than one disk file in image: /a.img, /b.qcow2", errdefs.IsInvalidArgument},
		{"two kernels", map[string]string{"/boot/vmlinuz-1": "k", "/boot/vmlinuz-2": "k"}, "more than one kernel in image: /boot/vmlinuz-1, /boot/vmlinuz-2", errdefs.IsInvalidArgument},
		{"two initrds", map[string]string{"/boot/vmlinux": "k", "/boot/initrd.img": "i", "/boot/initramfs.img": "i"}, "more than one initrd in image: /boot/initramfs.img, /boot/initrd.img", errdefs.IsInvalidArgument},
		{"directory in /disk", map[string]string{"/disk/vm.qcow2/": ""}, "disk /disk/vm.qcow2: not a regular file (directory)", errdefs.IsInvalidArgument},
		{"directory at root", map[string]string{"/vm.img/": ""}, "disk /vm.img: not a regular file (directory)", errdefs.IsInvalidArgument},
		{"kernel is a directory", map[string]string{"/boot/vmlinuz/": ""}, "kernel /boot/vmlinuz: not a regular file (directory)", errdefs.IsInvalidArgument},
		{"empty disk", map[string]string{"/disk/disk.img": ""}, "disk /disk/disk.img: empty file", errdefs.IsInvalidArgument},
		{"empty kernel", map[string]string{"/boot/vmlinux": ""}, "kernel /boot/vmlinux: empty file", errdefs.IsInvalidArgument},
		{"empty initrd", map[string]string{"/boot/vmlinux": "k", "/boot/initrd": ""}, "initrd /boot/initrd: empty file", errdefs.IsInvalidArgument},
		{"vmdk", map[string]string{"/disk/vm.vmdk": "KDMV\x01\x00\x00\x00"}, "disk /disk/vm.vmdk: unsupported disk format vmdk (convert it to qcow2 or raw)", errdefs.IsInvalidArgument},
		{"absolute symlink is resolved in the rootfs", map[string]string{"/disk/x": "->/etc/passwd"}, "disk /disk/x: points to /etc/passwd, which is not in the image", errdefs.IsNotFound},
		{"dotdot symlink is resolved in the rootfs", map[string]string{"/disk/x": "->../../../../../../" + outside + "/outside.img"}, "disk /disk/x: points to " + outside + "/outside.img, which is not in the image", errdefs.IsNotFound},
		{"symlink at root escaping", map[string]string{"/vm.img": "->" + outside + "/outside.img"}, "disk /vm.img: points to " + outside + "/outside.img, which is not in the image", errdefs.IsNotFound},
		{"/disk symlinked to host /etc", map[string]string{"/disk": "->/etc"}, "no VM disk in image", errdefs.IsNotFound},
		{"symlink to a directory", map[string]string{"/disk/x": "->/", "/etc/": ""}, "disk /disk/x: not a regular file (directory)", errdefs.IsInvalidArgument},
		{"symlink loop", map[string]string{"/disk/x": "->/y", "/y": "->/disk/x"}, "disk /disk/x: too many levels of symbolic links", errdefs.IsInvalidArgument},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Find(layout(t, tc.files))
			if err == nil {
				t.Fatalf("Find() = %+v, want error %q", *got, tc.wantErr)
			}
			t.Logf("error: %v", err)
			if !strings.HasPrefix(err.Error(), tc.wantErr) {
				t.Fatalf("Find() error = %q, want prefix %q", err, tc.wantErr)
			}
			if tc.is != nil && !tc.is(err) {
				t.Fatalf("Find() error %q has the wrong errdefs class", err)
			}
		})
	}
}

// TestFindSymlinkStaysInRootfs checks an escaping symlink lands on the
// rootfs's own file of that name, never the host's.
func TestFindSymlinkStaysInRootfs(t *testing.T) {
	for _, target := range []string{"/etc/passwd", "../../../../../../../../etc/passwd", "../etc/../../etc/passwd"} {
		t.Run(target, func(t *testing.T) {
			root := layout(t, map[string]string{"/disk/x": "->" + target, "/etc/passwd": "inside the image"})
			b, err := Find(root)
			if err != nil {
				t.Fatalf("Find() error = %v", err)
			}
			if want := filepath.Join(root, "etc/passwd"); b.Disk != want || b.Format != FormatRaw {
				t.Fatalf("Find() = %+v, want raw disk %s", *b, want)
			}
			data, err := os.ReadFile(b.Disk)
			if err != nil || string(data) != "inside the image" {
				t.Fatalf("disk content = %q, %v", data, err)
			}
		})
	}
}

func TestFindSpecialFiles(t *testing.T) {
	t.Run("fifo", func(t *testing.T) {
		root := layout(t, map[string]string{"/disk/": ""})
		if err := syscall.Mkfifo(filepath.Join(root, "disk/vm.img"), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := Find(root)
		if err == nil || err.Error() != "disk /disk/vm.img: not a regular file (fifo)" {
			t.Fatalf("Find() error = %v", err)
		}
	})
	t.Run("device", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("creating a device node needs root")
		}
		root := layout(t, map[string]string{"/disk/": ""})
		// 1:3 is /dev/null.
		if err := syscall.Mknod(filepath.Join(root, "disk/vm.img"), syscall.S_IFCHR|0o644, 1<<8|3); err != nil {
			t.Skipf("mknod not permitted here: %v", err)
		}
		_, err := Find(root)
		if err == nil || err.Error() != "disk /disk/vm.img: not a regular file (character device)" {
			t.Fatalf("Find() error = %v", err)
		}
	})
}

func TestFindBadRootfs(t *testing.T) {
	if _, err := Find("relative/rootfs"); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("Find(relative) error = %v, want invalid argument", err)
	}
	if _, err := Find(filepath.Join(t.TempDir(), "missing")); !errdefs.IsNotFound(err) {
		t.Fatalf("Find(missing) error = %v, want not found", err)
	}
}
