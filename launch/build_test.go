package launch

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/vmshim/vmshim/cloudinit"
	"github.com/vmshim/vmshim/config"
	"github.com/vmshim/vmshim/image"
	"github.com/vmshim/vmshim/image/imagetest"
	"github.com/vmshim/vmshim/qemu"
)

// testBuild is a build at the steps after rootfs: a bundle with a
// rootfs holding files, and a task record.
func testBuild(t *testing.T, files map[string]string) *build {
	t.Helper()
	bundle := t.TempDir()
	rootfs := filepath.Join(bundle, "rootfs")
	imagetest.WriteTree(t, rootfs, files)
	c := &build{
		ns:      "k8s.io",
		cfg:     config.Default(),
		spec:    &specs.Spec{Hostname: "pod-a", Annotations: map[string]string{config.AnnotationSandboxUID: "u1"}},
		host:    "pod-a",
		desc:    &config.VM{ID: "vm1", Env: []string{"PATH=/usr/bin", "GREETING=hi"}, DiskDriver: config.DiskDriverVirtioBlk},
		rec:     &Record{ID: "vm1", Bundle: bundle},
		rootDir: rootfs,
	}
	if err := c.rec.save(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.closeFiles)
	return c
}

// passedFile checks the fd QEMU is given as fd is f's file at path, open
// with access mode.
func passedFile(t *testing.T, c *build, fd int, path string, access int) {
	t.Helper()
	files := c.fds.Files()
	if fd < 3 || fd-3 >= len(files) {
		t.Fatalf("fd %d is not among the %d files passed", fd, len(files))
	}
	f := files[fd-3]
	open, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	named, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if !os.SameFile(open, named) {
		t.Errorf("fd %d is not %s", fd, path)
	}
	fl, err := unix.FcntlInt(f.Fd(), unix.F_GETFL, 0)
	if err != nil {
		t.Fatal(err)
	}
	if fl&unix.O_ACCMODE != access {
		t.Errorf("fd %d (%s) has access mode %#o, want %#o", fd, path, fl&unix.O_ACCMODE, access)
	}
}

// TestLaunchSeed checks the seed step writes the seed into the VM's files
// directory, which the record names, gives QEMU a read-only fd of it, and
// that the record's release removes it.
func TestLaunchSeed(t *testing.T) {
	ctx, logs := testLogger(t)
	c := testBuild(t, map[string]string{"/etc/hostname": "vm"})
	c.mounts = []cloudinit.Mount{{Tag: "vmshim0", Path: "/data", ReadOnly: true}}
	if err := c.seed(ctx); err != nil {
		t.Fatalf("seed: %v", err)
	}
	want := []qemu.Drive{{ID: "seed", Path: qemu.FDSetPath(0), Format: qemu.FormatRaw, ReadOnly: true, Driver: config.DiskDriverVirtioBlk}}
	if !reflect.DeepEqual(c.qs.Drives, want) {
		t.Fatalf("drives %+v, want %+v", c.qs.Drives, want)
	}
	if want := []qemu.AddFD{{Set: 0, FD: 3}}; !reflect.DeepEqual(c.qs.FDSets, want) {
		t.Fatalf("fd sets %+v, want %+v", c.qs.FDSets, want)
	}
	seed := filepath.Join(c.rootDir, image.FilesDirName, image.SeedName)
	passedFile(t, c, 3, seed, unix.O_RDONLY)
	saved, err := ReadRecord(c.rec.Bundle)
	if err != nil || saved.VMFiles != c.rootDir {
		t.Fatalf("record names vm files %q (%v), want %q", saved.VMFiles, err, c.rootDir)
	}
	iso, err := os.ReadFile(seed)
	if err != nil {
		t.Fatal(err)
	}
	// The seed's files are stored uncompressed; look for what they say.
	for _, s := range []string{"vmshim-u1", "pod-a", "GREETING", "vmshim0"} {
		if !strings.Contains(string(iso), s) {
			t.Errorf("seed lacks %q", s)
		}
	}
	if fi, err := os.Stat(seed); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("seed: %v, %v; want mode 0600", fi, err)
	}

	c.closeFiles()
	c.rec.Release(ctx)
	if _, err := os.Lstat(filepath.Dir(seed)); !os.IsNotExist(err) {
		t.Errorf("release left the vm's files: %v", err)
	}
	if _, err := os.Stat(filepath.Join(c.rootDir, "etc/hostname")); err != nil {
		t.Errorf("release removed the image's files: %v", err)
	}
	if w := logs.Warnings(); len(w) != 0 {
		t.Errorf("release warned: %q", w)
	}
}

// TestLaunchRefusesImageFilesDir checks an image that has /.vmshim fails
// the create, and the record's release then leaves what the image has
// there, and what it leads to, alone: the record names the directory only
// once the shim made it.
func TestLaunchRefusesImageFilesDir(t *testing.T) {
	host := t.TempDir()
	hostFile := filepath.Join(host, image.SeedName)
	if err := os.WriteFile(hostFile, []byte("host"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		files map[string]string
		kind  string
		keep  string // a file that must stay
	}{
		{"directory", map[string]string{"/.vmshim/user-file": "user"}, "directory", ".vmshim/user-file"},
		{"symlink to a host dir", map[string]string{"/.vmshim": "->" + host}, "symlink", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, logs := testLogger(t)
			c := testBuild(t, tc.files)
			err := c.seed(ctx)
			want := "image has /.vmshim (" + tc.kind + "): the name is reserved for the files vmshim makes for the VM"
			if err == nil || err.Error() != want || !errdefs.IsInvalidArgument(err) {
				t.Fatalf("seed: %v, want invalid argument %q", err, want)
			}
			if saved, err := ReadRecord(c.rec.Bundle); err != nil || saved.VMFiles != "" {
				t.Fatalf("record names vm files %q (%v) the shim did not make", saved.VMFiles, err)
			}
			c.closeFiles()
			c.rec.Release(ctx)
			if tc.keep != "" {
				if _, err := os.Stat(filepath.Join(c.rootDir, tc.keep)); err != nil {
					t.Errorf("release removed a file it does not own: %v", err)
				}
			}
			if data, err := os.ReadFile(hostFile); err != nil || string(data) != "host" {
				t.Errorf("host file: %q, %v", data, err)
			}
			if w := logs.Warnings(); len(w) != 0 {
				t.Errorf("release warned: %q", w)
			}
		})
	}
}

// TestLaunchDisks checks the disks step makes the root overlay in the
// VM's files directory and gives QEMU the overlay and the image's disk as
// fds; and that a root disk size below the image's fails before anything
// is made.
func TestLaunchDisks(t *testing.T) {
	qemuImg, err := exec.LookPath("qemu-img")
	if err != nil {
		t.Skip("qemu-img is not installed")
	}
	if os.Geteuid() != 0 {
		t.Skip("qemu-img runs confined, which needs root")
	}
	newDisk := func(t *testing.T, size string) *build {
		c := testBuild(t, map[string]string{"/disk/": ""})
		disk := filepath.Join(c.rootDir, "disk", "vm.qcow2")
		if out, err := exec.Command(qemuImg, "create", "-q", "-f", "qcow2", disk, size).CombinedOutput(); err != nil {
			t.Fatalf("qemu-img create: %v: %s", err, out)
		}
		if c.boot, err = image.Find(c.rootDir); err != nil {
			t.Fatal(err)
		}
		c.img = image.QEMUImg{Path: qemuImg}
		return c
	}

	t.Run("overlay", func(t *testing.T) {
		ctx, logs := testLogger(t)
		c := newDisk(t, "1M")
		c.desc.RootDiskSize = 2 << 20
		if err := c.disks(ctx); err != nil {
			t.Fatalf("disks: %v", err)
		}
		want := []qemu.Drive{{
			ID: "root", Path: qemu.FDSetPath(0), Format: qemu.FormatQCOW2,
			BackingPath: qemu.FDSetPath(1), BackingFormat: image.FormatQCOW2,
			Driver: config.DiskDriverVirtioBlk, BootIndex: 1,
		}}
		if !reflect.DeepEqual(c.qs.Drives, want) {
			t.Fatalf("drives %+v, want %+v", c.qs.Drives, want)
		}
		if want := []qemu.AddFD{{Set: 0, FD: 3}, {Set: 1, FD: 4}}; !reflect.DeepEqual(c.qs.FDSets, want) {
			t.Fatalf("fd sets %+v, want %+v", c.qs.FDSets, want)
		}
		overlay := filepath.Join(c.rootDir, image.FilesDirName, image.OverlayName)
		passedFile(t, c, 3, overlay, unix.O_RDWR)
		passedFile(t, c, 4, c.boot.Disk, unix.O_RDONLY)
		out, err := exec.Command(qemuImg, "info", "--output=json", "-f", "qcow2", overlay).Output()
		if err != nil {
			t.Fatal(err)
		}
		var info struct {
			VirtualSize int64  `json:"virtual-size"`
			Backing     string `json:"backing-filename"`
		}
		if err := json.Unmarshal(out, &info); err != nil || info.VirtualSize != 2<<20 || info.Backing != "image" {
			t.Fatalf("overlay: %+v, %v; want 2 MiB over \"image\"", info, err)
		}
		if saved, err := ReadRecord(c.rec.Bundle); err != nil || saved.VMFiles != c.rootDir {
			t.Fatalf("record names vm files %q (%v), want %q", saved.VMFiles, err, c.rootDir)
		}
		c.closeFiles()
		c.rec.Release(ctx)
		if _, err := os.Lstat(filepath.Dir(overlay)); !os.IsNotExist(err) {
			t.Errorf("release left the vm's files: %v", err)
		}
		if _, err := os.Stat(filepath.Join(c.rootDir, "disk", "vm.qcow2")); err != nil {
			t.Errorf("release removed the image's disk: %v", err)
		}
		if w := logs.Warnings(); len(w) != 0 {
			t.Errorf("release warned: %q", w)
		}
	})
	t.Run("shrink", func(t *testing.T) {
		ctx, _ := testLogger(t)
		c := newDisk(t, "2M")
		c.desc.RootDiskSize = 1 << 20
		err := c.disks(ctx)
		if err == nil || !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "disks can only grow") {
			t.Fatalf("disks: %v, want invalid argument", err)
		}
		if _, err := os.Lstat(filepath.Join(c.rootDir, image.FilesDirName)); !os.IsNotExist(err) {
			t.Errorf("a refused disk left the vm's files directory: %v", err)
		}
		if len(c.fds.Files()) != 0 || len(c.qs.Drives) != 0 {
			t.Errorf("a refused disk was passed on: %d fds, drives %+v", len(c.fds.Files()), c.qs.Drives)
		}
	})
}
