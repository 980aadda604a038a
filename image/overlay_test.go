package image

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"

	"github.com/containerd/errdefs"
)

type overlayInfo struct {
	VirtualSize   int64  `json:"virtual-size"`
	Format        string `json:"format"`
	Backing       string `json:"backing-filename"`
	BackingFormat string `json:"backing-filename-format"`
}

func readOverlay(t *testing.T, p string) overlayInfo {
	t.Helper()
	out, err := exec.Command(needQEMUImg(t), "info", "--output=json", "-f", "qcow2", p).Output()
	if err != nil {
		t.Fatalf("qemu-img info %s: %v", p, err)
	}
	var oi overlayInfo
	if err := json.Unmarshal(out, &oi); err != nil {
		t.Fatal(err)
	}
	return oi
}

// newOverlay makes the overlay file as the shim does: in the VM's files
// directory of a rootfs named dir.
func newOverlay(t *testing.T, dir string) (root string, f *os.File) {
	t.Helper()
	root = filepath.Join(t.TempDir(), dir)
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	d, err := MakeFilesDir(root)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if f, err = d.Create(OverlayName); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return root, f
}

func TestCreateOverlay(t *testing.T) {
	for _, m := range qemuImgModes(t) {
		t.Run(m.name, func(t *testing.T) { testCreateOverlay(t, m.q(t)) })
	}
}

func testCreateOverlay(t *testing.T, qemuImg QEMUImg) {
	const baseSize = 2 << 20
	tests := []struct {
		name       string
		baseFormat string
		dir        string // rootfs directory name, to exercise awkward paths
		size       int64
		wantSize   int64
	}{
		{name: "qcow2 base, same size", baseFormat: "qcow2", dir: "d", wantSize: baseSize},
		{name: "raw base, same size", baseFormat: "raw", dir: "d", wantSize: baseSize},
		{name: "grow", baseFormat: "qcow2", dir: "d", size: 10 << 20, wantSize: 10 << 20},
		{name: "grow to an odd size rounds up to a sector", baseFormat: "raw", dir: "d", size: baseSize + 1, wantSize: baseSize + 512},
		{name: "comma and colon in paths", baseFormat: "qcow2", dir: "a,b:c", wantSize: baseSize},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root, f := newOverlay(t, tc.dir)
			// No file is named as the backing: qemu-img must not open it.
			if err := CreateOverlay(context.Background(), qemuImg, f, tc.baseFormat, baseSize, tc.size); err != nil {
				t.Fatalf("CreateOverlay() error = %v", err)
			}
			overlay := f.Name()
			oi := readOverlay(t, overlay)
			want := overlayInfo{VirtualSize: tc.wantSize, Format: "qcow2", Backing: overlayBacking, BackingFormat: tc.baseFormat}
			if oi != want {
				t.Fatalf("overlay = %+v, want %+v", oi, want)
			}
			fi, err := os.Stat(overlay)
			if err != nil {
				t.Fatal(err)
			}
			uid := uint32(os.Geteuid())
			if qemuImg.Jail != nil {
				uid = qemuImg.Jail.UID // the jailed QEMU writes it too
			}
			if st := fi.Sys().(*syscall.Stat_t); st.Uid != uid || fi.Mode().Perm() != 0o600 {
				t.Errorf("overlay owner %d, mode %v; want %d, 0600", st.Uid, fi.Mode().Perm(), uid)
			}
			if entries, _ := os.ReadDir(root); len(entries) != 1 {
				t.Errorf("rootfs holds %v, want only %s", entries, FilesDirName)
			}
			// The overlay reads as the base it is given as backing.
			base := filepath.Join(filepath.Dir(overlay), overlayBacking)
			if tc.baseFormat == "qcow2" {
				dataQCOW2(t, base, baseSize)
			} else {
				qemuImgRun(t, "create", "-q", "-f", "raw", base, "2M")
			}
			before := sha(t, base)
			if tc.size == 0 {
				qemuImgRun(t, "compare", "-f", "qcow2", "-F", tc.baseFormat, overlay, base)
			}
			if sha(t, base) != before {
				t.Fatal("reading the overlay changed its base")
			}
		})
	}
}

func TestCreateOverlayRefuses(t *testing.T) {
	qemuImg := hostQEMUImg(t)
	tests := []struct {
		name       string
		qemuImg    QEMUImg
		dir        bool // the overlay is a directory, which qemu-img cannot write
		baseFormat string
		baseSize   int64
		size       int64
		wantErr    string // prefix, after "overlay OVERLAY: "
		is         func(error) bool
	}{
		{"shrink", qemuImg, false, "qcow2", 4 << 20, 2 << 20,
			"size 2Mi (2097152 bytes) is smaller than the image's virtual size 4Mi (4194304 bytes); disks can only grow", errdefs.IsInvalidArgument},
		{"negative size", qemuImg, false, "qcow2", 4 << 20, -1, "size -1 is negative", errdefs.IsInvalidArgument},
		{"unknown base size", qemuImg, false, "qcow2", 0, 0, "base virtual size 0 is not positive", errdefs.IsInvalidArgument},
		{"bad format", qemuImg, false, "vmdk", 4 << 20, 0, `base format "vmdk" is not qcow2 or raw`, errdefs.IsInvalidArgument},
		{"overlay not writable", qemuImg, true, "qcow2", 4 << 20, 0, "qemu-img create: ", errdefs.IsFailedPrecondition},
		// The error names the missing program, whoever found it missing.
		{"no qemu-img", QEMUImg{Path: "/nonexistent/qemu-img"}, false, "qcow2", 4 << 20, 0, "", func(err error) bool {
			return errdefs.IsFailedPrecondition(err) && strings.Contains(err.Error(), "exec /nonexistent/qemu-img: no such file or directory")
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root, f := newOverlay(t, "rootfs")
			if tc.dir {
				dir, err := os.Open(root)
				if err != nil {
					t.Fatal(err)
				}
				defer dir.Close()
				f = dir
			}
			before := tree(t, root)
			err := CreateOverlay(context.Background(), tc.qemuImg, f, tc.baseFormat, tc.baseSize, tc.size)
			want := "overlay " + f.Name() + ": " + tc.wantErr
			if err == nil || !strings.HasPrefix(err.Error(), want) || !tc.is(err) {
				t.Fatalf("CreateOverlay() error = %v, want %q", err, want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("CreateOverlay() error spans lines: %q", err)
			}
			// Nothing was written, in the overlay or anywhere else in the
			// rootfs.
			if after := tree(t, root); !reflect.DeepEqual(after, before) {
				t.Fatalf("rootfs changed:\n%q\nwant\n%q", after, before)
			}
		})
	}
}

// TestCreateOverlayCleansUp uses a qemu-img that writes the overlay and then
// fails, and checks the error, and that the partial file goes with the VM's
// files directory, which is what the shim removes after a failed create.
func TestCreateOverlayCleansUp(t *testing.T) {
	dir := t.TempDir()
	fake := filepath.Join(dir, "qemu-img")
	// As the jailed qemu-img does: the cause, then its failure to remove
	// the file (a mount point in a read-only root), which says nothing.
	script := "#!/bin/sh\nfor a; do prev2=$prev; prev=$a; done\necho partial > \"$prev2\"\necho 'qemu-img: disk full' >&2\n" +
		"echo \"qemu-img: $prev2: Error when deleting file $prev2: Read-only file system\" >&2\nexit 1\n"
	if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	root := layout(t, map[string]string{"/disk/vm.img": "\xeb\x63\x90"})
	before := tree(t, root)
	d, err := MakeFilesDir(root)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	f, err := d.Create(OverlayName)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	err = CreateOverlay(context.Background(), QEMUImg{Path: fake}, f, "raw", 4096, 0)
	if err == nil || err.Error() != "overlay "+f.Name()+": qemu-img create: disk full" {
		t.Fatalf("CreateOverlay() error = %v", err)
	}
	if data, _ := os.ReadFile(f.Name()); string(data) != "partial\n" {
		t.Fatalf("fake qemu-img did not write through the overlay's fd: %q", data)
	}
	if err := RemoveFilesDir(root); err != nil {
		t.Fatal(err)
	}
	if after := tree(t, root); !reflect.DeepEqual(after, before) {
		t.Fatalf("partial overlay left behind:\n%q\nwant\n%q", keys(after), keys(before))
	}
}
