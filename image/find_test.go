package image

import (
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/vmshim/vmshim/image/imagetest"
)

const qcow2Header = "QFI\xfb\x00\x00\x00\x03"

// layout builds a rootfs (imagetest.WriteTree).
func layout(t *testing.T, files map[string]string) string {
	t.Helper()
	root := filepath.Join(t.TempDir(), "rootfs")
	imagetest.WriteTree(t, root, files)
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
		{"installer iso", map[string]string{"/disk/debian-12-netinst.ISO": "CD001", "/disk/.keep": ""}, Boot{ISO: "/disk/debian-12-netinst.ISO"}},
		{"iso at root is not an installer", map[string]string{"/vm.img": raw, "/boot.iso": "CD001"}, Boot{Disk: "/vm.img", Format: "raw"}},
		{"pointer", map[string]string{"/disk/disk.url": "https://example.org/d.qcow2\n", "/disk/disk.sha256": testSum + "  d.qcow2\n"},
			Boot{URL: "https://example.org/d.qcow2", SHA256: testSum}},
		{"pointer with hidden files", map[string]string{"/disk/disk.url": "http://e.org/d", "/disk/disk.sha256": strings.ToUpper(testSum), "/disk/.keep": "", "/disk/.wh..opq": ""},
			Boot{URL: "http://e.org/d", SHA256: testSum}},
		{"pointer files symlinked inside rootfs", map[string]string{"/disk/disk.url": "->../meta/url", "/disk/disk.sha256": "->/meta/sum", "/meta/url": "https://e.org/d", "/meta/sum": testSum},
			Boot{URL: "https://e.org/d", SHA256: testSum}},
		{"pointer beats root and /boot", map[string]string{"/disk/disk.url": "https://e.org/d", "/disk/disk.sha256": testSum, "/vm.img": raw, "/boot/vmlinuz": "k"},
			Boot{URL: "https://e.org/d", SHA256: testSum}},
		{"pointer files at root are no pointer", map[string]string{"/disk.url": "https://e.org/d", "/disk.sha256": testSum, "/vm.img": raw}, Boot{Disk: "/vm.img", Format: "raw"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := layout(t, tc.files)
			got, err := Find(root)
			if err != nil {
				t.Fatalf("Find() error = %v", err)
			}
			defer got.Close()
			want := tc.want
			want.Root = root
			for _, p := range []*string{&want.Disk, &want.Kernel, &want.Initrd, &want.ISO} {
				if *p != "" {
					*p = filepath.Join(root, *p)
				}
			}
			names := *got
			names.DiskFile, names.KernelFile, names.InitrdFile, names.ISOFile = nil, nil, nil, nil
			if names != want {
				t.Fatalf("Find() = %+v, want %+v", names, want)
			}
			checkBootFiles(t, got)
		})
	}
}

// checkBootFiles checks each of b's paths has its file open read-only, and
// that the file is the one at the path; a path of "" has no file.
func checkBootFiles(t *testing.T, b *Boot) {
	t.Helper()
	for _, bf := range []struct {
		what string
		path string
		f    *os.File
	}{{"disk", b.Disk, b.DiskFile}, {"kernel", b.Kernel, b.KernelFile}, {"initrd", b.Initrd, b.InitrdFile}, {"installer ISO", b.ISO, b.ISOFile}} {
		if bf.path == "" {
			if bf.f != nil {
				t.Errorf("%s: no path but file %s open", bf.what, bf.f.Name())
			}
			continue
		}
		if bf.f == nil {
			t.Errorf("%s %s: not open", bf.what, bf.path)
			continue
		}
		open, err := bf.f.Stat()
		if err != nil {
			t.Fatalf("%s: stat open file: %v", bf.what, err)
		}
		named, err := os.Stat(bf.path)
		if err != nil {
			t.Fatal(err)
		}
		if !os.SameFile(open, named) {
			t.Errorf("%s: open file is not %s", bf.what, bf.path)
		}
		if mode := accessMode(t, bf.f); mode != unix.O_RDONLY {
			t.Errorf("%s: open with access mode %#o, want read-only", bf.what, mode)
		}
	}
}

func accessMode(t *testing.T, f *os.File) int {
	t.Helper()
	fl, err := unix.FcntlInt(f.Fd(), unix.F_GETFL, 0)
	if err != nil {
		t.Fatal(err)
	}
	return fl & unix.O_ACCMODE
}

func TestFindErrors(t *testing.T) {
	outside := t.TempDir()
	for name, data := range map[string]string{"outside.img": "host secret", "url": "https://e.org/host", "sum": testSum} {
		if err := os.WriteFile(filepath.Join(outside, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
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
		{"empty iso", map[string]string{"/disk/install.iso": ""}, "installer ISO /disk/install.iso: empty file", errdefs.IsInvalidArgument},
		{"iso symlinked out", map[string]string{"/disk/install.iso": "->" + outside + "/outside.img"}, "installer ISO /disk/install.iso: points to " + outside + "/outside.img, which is not in the image", errdefs.IsNotFound},
		{"iso and a disk", map[string]string{"/disk/install.iso": "CD001", "/disk/vm.qcow2": "q"}, "more than one disk file in image", errdefs.IsInvalidArgument},
		{"empty kernel", map[string]string{"/boot/vmlinux": ""}, "kernel /boot/vmlinux: empty file", errdefs.IsInvalidArgument},
		{"empty initrd", map[string]string{"/boot/vmlinux": "k", "/boot/initrd": ""}, "initrd /boot/initrd: empty file", errdefs.IsInvalidArgument},
		{"vmdk", map[string]string{"/disk/vm.vmdk": "KDMV\x01\x00\x00\x00"}, "disk /disk/vm.vmdk: unsupported disk format vmdk (convert it to qcow2 or raw)", errdefs.IsInvalidArgument},
		{"absolute symlink is resolved in the rootfs", map[string]string{"/disk/x": "->/etc/passwd"}, "disk /disk/x: points to /etc/passwd, which is not in the image", errdefs.IsNotFound},
		{"dotdot symlink is resolved in the rootfs", map[string]string{"/disk/x": "->../../../../../../" + outside + "/outside.img"}, "disk /disk/x: points to " + outside + "/outside.img, which is not in the image", errdefs.IsNotFound},
		{"symlink at root escaping", map[string]string{"/vm.img": "->" + outside + "/outside.img"}, "disk /vm.img: points to " + outside + "/outside.img, which is not in the image", errdefs.IsNotFound},
		{"/disk symlinked to host /etc", map[string]string{"/disk": "->/etc"}, "no VM disk in image", errdefs.IsNotFound},
		{"/disk symlinked to a host dir holding a disk", map[string]string{"/disk": "->" + outside}, "no VM disk in image", errdefs.IsNotFound},
		{"/disk dotdot-symlinked to a host dir holding a disk", map[string]string{"/disk": "->../../../../../../../.." + outside}, "no VM disk in image", errdefs.IsNotFound},
		{"symlink to a directory", map[string]string{"/disk/x": "->/", "/etc/": ""}, "disk /disk/x: not a regular file (directory)", errdefs.IsInvalidArgument},
		{"symlink loop", map[string]string{"/disk/x": "->/y", "/y": "->/disk/x"}, "disk /disk/x: too many levels of symbolic links", errdefs.IsInvalidArgument},

		{"pointer URL symlinked to a host file", map[string]string{"/disk/disk.url": "->" + outside + "/url", "/disk/disk.sha256": testSum},
			"pointer file /disk/disk.url: points to " + outside + "/url, which is not in the image", errdefs.IsNotFound},
		{"pointer digest dotdot-symlinked out", map[string]string{"/disk/disk.url": "https://e.org/d", "/disk/disk.sha256": "->../../../../../../.." + outside + "/sum"},
			"pointer file /disk/disk.sha256: points to " + outside + "/sum, which is not in the image", errdefs.IsNotFound},
		{"pointer URL is a directory", map[string]string{"/disk/disk.url/": "", "/disk/disk.sha256": testSum},
			"pointer file /disk/disk.url: not a regular file (directory)", errdefs.IsInvalidArgument},
		{"pointer digest symlinked to a directory", map[string]string{"/disk/disk.url": "https://e.org/d", "/disk/disk.sha256": "->/etc", "/etc/": ""},
			"pointer file /disk/disk.sha256: not a regular file (directory)", errdefs.IsInvalidArgument},
		{"pointer URL oversized", map[string]string{"/disk/disk.url": "https://e.org/" + strings.Repeat("a", MaxPointerFileSize), "/disk/disk.sha256": testSum},
			"pointer file /disk/disk.url: larger than 4096 bytes", errdefs.IsInvalidArgument},
		{"pointer digest oversized", map[string]string{"/disk/disk.url": "https://e.org/d", "/disk/disk.sha256": testSum + strings.Repeat("\n", MaxPointerFileSize)},
			"pointer file /disk/disk.sha256: larger than 4096 bytes", errdefs.IsInvalidArgument},
		{"pointer URL of two lines", map[string]string{"/disk/disk.url": "https://e.org/a\nhttps://e.org/b\n", "/disk/disk.sha256": testSum},
			"pointer file /disk/disk.url: more than one line; want one URL", errdefs.IsInvalidArgument},
		{"pointer URL empty", map[string]string{"/disk/disk.url": "", "/disk/disk.sha256": testSum},
			"pointer file /disk/disk.url: empty; want an http or https URL", errdefs.IsInvalidArgument},
		{"pointer URL not UTF-8", map[string]string{"/disk/disk.url": "https://e.org/\xff", "/disk/disk.sha256": testSum},
			"pointer file /disk/disk.url: not valid UTF-8", errdefs.IsInvalidArgument},
		{"pointer ftp URL", map[string]string{"/disk/disk.url": "ftp://e.org/d.qcow2", "/disk/disk.sha256": testSum},
			`pointer file /disk/disk.url: URL scheme "ftp" is not http or https`, errdefs.IsInvalidArgument},
		{"pointer bad digest", map[string]string{"/disk/disk.url": "https://e.org/d", "/disk/disk.sha256": "d41d8cd98f00b204e9800998ecf8427e  d.qcow2"},
			`pointer file /disk/disk.sha256: "d41d8cd98f00b204e9800998ecf8427e" is not a sha256 digest (64 hex digits)`, errdefs.IsInvalidArgument},
		{"pointer and a disk", map[string]string{"/disk/disk.url": "https://e.org/d", "/disk/disk.sha256": testSum, "/disk/disk.qcow2": qcow2Header},
			`pointer image: /disk holds "/disk/disk.qcow2" besides /disk/disk.url and /disk/disk.sha256; a pointer image holds no disk`, errdefs.IsInvalidArgument},
		{"pointer and other files", map[string]string{"/disk/disk.url": "https://e.org/d", "/disk/disk.sha256": testSum, "/disk/README": "x", "/disk/sub/": "", "/disk/x\x1b[2J": ""},
			`pointer image: /disk holds "/disk/README", "/disk/sub", "/disk/x\x1b[2J" besides`, errdefs.IsInvalidArgument},
		{"pointer URL without digest", map[string]string{"/disk/disk.url": "https://e.org/d"},
			"pointer image: /disk/disk.url without /disk/disk.sha256", errdefs.IsInvalidArgument},
		{"pointer digest without URL", map[string]string{"/disk/disk.sha256": testSum, "/vm.img": "x"},
			"pointer image: /disk/disk.sha256 without /disk/disk.url", errdefs.IsInvalidArgument},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := layout(t, tc.files)
			got, err := Find(root)
			if err == nil {
				got.Close()
				t.Fatalf("Find() = %+v, want error %q", *got, tc.wantErr)
			}
			if got != nil {
				t.Errorf("Find() returned %+v with its error", *got)
			}
			if open := openFiles(t, root); len(open) != 0 {
				t.Errorf("Find() left files of the image open: %q", open)
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
			defer b.Close()
			if want := filepath.Join(root, "etc/passwd"); b.Disk != want || b.Format != FormatRaw {
				t.Fatalf("Find() = %+v, want raw disk %s", *b, want)
			}
			// The open file, which is all QEMU and qemu-img are given, is
			// the image's.
			data, err := io.ReadAll(b.DiskFile)
			if err != nil || string(data) != "inside the image" {
				t.Fatalf("disk content = %q, %v", data, err)
			}
		})
	}
}

// TestFindSpecialFiles checks a special file as the disk is refused by
// its kind, and never opened: opening a fifo with no writer would block.
func TestFindSpecialFiles(t *testing.T) {
	tests := []struct {
		name string
		root bool // making it needs root
		make func(t *testing.T, p string)
		kind string
	}{
		{name: "fifo", kind: "fifo", make: func(t *testing.T, p string) {
			if err := syscall.Mkfifo(p, 0o644); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "socket", kind: "socket", make: func(t *testing.T, p string) {
			l, err := net.Listen("unix", p)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { l.Close() })
		}},
		{name: "character device", kind: "character device", root: true, make: func(t *testing.T, p string) {
			// 1:3 is /dev/null.
			if err := syscall.Mknod(p, syscall.S_IFCHR|0o644, int(unix.Mkdev(1, 3))); err != nil {
				t.Skipf("mknod not permitted here: %v", err)
			}
		}},
		{name: "block device", kind: "block device", root: true, make: func(t *testing.T, p string) {
			// 7:0 is /dev/loop0.
			if err := syscall.Mknod(p, syscall.S_IFBLK|0o644, int(unix.Mkdev(7, 0))); err != nil {
				t.Skipf("mknod not permitted here: %v", err)
			}
		}},
	}
	places := []struct {
		path, what string
		also       map[string]string // other files of the rootfs
	}{
		{"/disk/vm.img", "disk", nil},
		{"/vm.img", "disk", nil},
		{"/boot/vmlinuz", "kernel", nil},
		{PointerURLFile, "pointer file", map[string]string{PointerSHA256File: testSum}},
		{PointerSHA256File, "pointer file", map[string]string{PointerURLFile: "https://e.org/d"}},
	}
	for _, tc := range tests {
		for _, pl := range places {
			place, what := pl.path, pl.what
			t.Run(tc.name+" at "+place, func(t *testing.T) {
				if tc.root && os.Geteuid() != 0 {
					t.Skip("creating a device node needs root")
				}
				files := map[string]string{filepath.Dir(place) + "/": ""}
				for k, v := range pl.also {
					files[k] = v
				}
				root := layout(t, files)
				p := filepath.Join(root, place)
				tc.make(t, p)
				b, err := findWithin(t, root, p)
				if err == nil {
					b.Close()
				}
				want := what + " " + place + ": not a regular file (" + tc.kind + ")"
				if err == nil || err.Error() != want || !errdefs.IsInvalidArgument(err) {
					t.Fatalf("Find() error = %v, want invalid argument %q", err, want)
				}
			})
		}
	}
}

// findWithin runs Find, failing the test if it blocks. Should it block on
// the fifo at fifo, a writer opened there releases it.
func findWithin(t *testing.T, root, fifo string) (*Boot, error) {
	t.Helper()
	type found struct {
		b   *Boot
		err error
	}
	done := make(chan found, 1)
	go func() {
		b, err := Find(root)
		done <- found{b, err}
	}()
	select {
	case r := <-done:
		return r.b, r.err
	case <-time.After(10 * time.Second):
		if f, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
		t.Fatal("Find() blocked: it opened a special file")
	}
	panic("unreachable")
}

// TestFindIgnoresHostDirs checks a /disk symlinked out of the rootfs is
// resolved inside it: the host directory's disk is never found.
func TestFindIgnoresHostDirs(t *testing.T) {
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "host.qcow2"), []byte(qcow2Header), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, target := range []string{outside, "../../../../../../../.." + outside, outside + "/"} {
		t.Run(target, func(t *testing.T) {
			root := layout(t, map[string]string{"/disk": "->" + target, "/vm.img": "image's own"})
			b, err := Find(root)
			if err != nil {
				t.Fatalf("Find() error = %v", err)
			}
			defer b.Close()
			if want := filepath.Join(root, "vm.img"); b.Disk != want {
				t.Fatalf("Find() disk = %s, want %s", b.Disk, want)
			}
			if data, err := io.ReadAll(b.DiskFile); err != nil || string(data) != "image's own" {
				t.Fatalf("disk content = %q, %v", data, err)
			}
		})
	}
}

// TestFindOpensFiles checks the Boot's files are the image's, open
// read-only, stay the files found when the paths change, and are closed
// by Close.
func TestFindOpensFiles(t *testing.T) {
	tests := []struct {
		name  string
		files map[string]string
		want  map[string]string // "disk", "kernel", "initrd": content
	}{
		{"disk", map[string]string{"/disk/vm.qcow2": qcow2Header + "disk bytes"}, map[string]string{"disk": qcow2Header + "disk bytes"}},
		{"kernel and initrd", map[string]string{"/boot/vmlinuz": "kernel bytes", "/boot/initrd.img": "initrd bytes"}, map[string]string{"kernel": "kernel bytes", "initrd": "initrd bytes"}},
		{"kernel alone", map[string]string{"/boot/vmlinux": "kernel bytes"}, map[string]string{"kernel": "kernel bytes"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := layout(t, tc.files)
			b, err := Find(root)
			if err != nil {
				t.Fatal(err)
			}
			checkBootFiles(t, b)
			files := map[string]*os.File{"disk": b.DiskFile, "kernel": b.KernelFile, "initrd": b.InitrdFile}
			paths := map[string]string{"disk": b.Disk, "kernel": b.Kernel, "initrd": b.Initrd}
			// The image's paths now lead elsewhere: the open files do not.
			for what := range tc.want {
				if err := os.Rename(paths[what], paths[what]+".old"); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(paths[what], []byte("swapped"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			for what, f := range files {
				want, ok := tc.want[what]
				if !ok {
					continue
				}
				data, err := io.ReadAll(f)
				if err != nil || string(data) != want {
					t.Errorf("%s reads %q, %v; want %q", what, data, err, want)
				}
				if _, err := f.Write([]byte("x")); err == nil {
					t.Errorf("%s: write through the open file succeeded", what)
				}
			}
			if err := b.Close(); err != nil {
				t.Fatalf("Close() error = %v", err)
			}
			for what := range tc.want {
				if _, err := files[what].Read(make([]byte, 1)); !errors.Is(err, os.ErrClosed) {
					t.Errorf("%s after Close: read error %v, want closed", what, err)
				}
			}
			if open := openFiles(t, root); len(open) != 0 {
				t.Errorf("files of the image still open after Close: %q", open)
			}
		})
	}
}

// openFiles lists the files under root this process has open.
func openFiles(t *testing.T, root string) []string {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if p, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.HasPrefix(p, root+"/") {
			out = append(out, p)
		}
	}
	return out
}

func TestFindBadRootfs(t *testing.T) {
	if _, err := Find("relative/rootfs"); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("Find(relative) error = %v, want invalid argument", err)
	}
	if _, err := Find(filepath.Join(t.TempDir(), "missing")); !errdefs.IsNotFound(err) {
		t.Fatalf("Find(missing) error = %v, want not found", err)
	}
}
