package rootdisk

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/vmshim/vmshim/image"
	"github.com/vmshim/vmshim/jail"
)

func init() {
	// As the shim's main does: jailed qemu-img enters its jail from a
	// locked thread, never the main one.
	runtime.LockOSThread()
}

const testJailID = 2000010

// qemuImg runs the host's qemu-img as the shim does: confined, which
// needs root, and jailed when it is under /usr.
func qemuImg(t *testing.T) image.QEMUImg {
	t.Helper()
	var q image.QEMUImg
	path, err := exec.LookPath("qemu-img")
	if err == nil {
		path, err = filepath.EvalSymlinks(path)
	}
	if err != nil {
		t.Skip("qemu-img is not installed")
	}
	q.Path = path
	if os.Geteuid() != 0 {
		t.Skip("qemu-img runs confined, which needs root")
	}
	if jail.Shows(q.Path) {
		q.Jail = &jail.Jail{Root: filepath.Join(t.TempDir(), "jail"), UID: testJailID, GID: testJailID}
		if err := os.Mkdir(q.Jail.Root, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	return q
}

// rawImage writes a raw disk of size bytes whose first bytes are mark and
// returns it as an Image, open read-only (world-readable, as in images).
func rawImage(t *testing.T, mark string, size int64) Image {
	t.Helper()
	p := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(p, []byte(mark), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(p, size); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return Image{File: f, Format: image.FormatRaw, VirtualSize: size, Name: "/disk/" + mark + ".img"}
}

func open(t *testing.T, ctx context.Context, dir string, img Image, o Options) *Disk {
	t.Helper()
	d, err := OnDirectory(ctx, dir, "/data", img, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.File.Close() })
	return d
}

// readBack reads the disk's first bytes as the guest sees them.
func readBack(t *testing.T, dir string, n int) string {
	t.Helper()
	raw := filepath.Join(t.TempDir(), "raw")
	if out, err := exec.Command("qemu-img", "dd", "-f", "qcow2", "-O", "raw", "if="+filepath.Join(dir, DiskName), "of="+raw, "bs=512", "count=1").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img dd: %v: %s", err, out)
	}
	b, err := os.ReadFile(raw)
	if err != nil || len(b) < n {
		t.Fatalf("qemu-img dd wrote %d bytes: %v", len(b), err)
	}
	return string(b[:n])
}

func TestOnDirectoryKeepsTheDisk(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	var lines []string
	o := Options{Img: qemuImg(t), Log: func(l string) { lines = append(lines, l) }}
	v1 := rawImage(t, "v1", 1<<20)

	d := open(t, ctx, dir, v1, o)
	if !d.Made {
		t.Fatal("first boot: Made is false")
	}
	if _, err := OnDirectory(ctx, dir, "/data", v1, o); !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "root disk volume /data is in use by another running VM") {
		t.Fatalf("second VM on the volume: %v, want in use", err)
	}
	d.File.Close()
	if got := readBack(t, dir, 2); got != "v1" {
		t.Fatalf("disk holds %q, want the image's v1", got)
	}
	info, err := exec.Command("qemu-img", "info", "--output=json", filepath.Join(dir, DiskName)).Output()
	if err != nil || strings.Contains(string(info), "backing") {
		t.Fatalf("the disk is not standalone: %v %s", err, info)
	}

	d = open(t, ctx, dir, v1, o)
	if d.Made {
		t.Fatal("second boot made the disk again")
	}
	d.File.Close()

	lines = nil
	v2 := rawImage(t, "v2", 1<<20)
	d = open(t, ctx, dir, v2, o)
	d.File.Close()
	if d.Made || readBack(t, dir, 2) != "v1" || len(lines) != 1 || !strings.Contains(lines[0], "kept") {
		t.Fatalf("changed image, keep: made %v, disk %q, log %q", d.Made, readBack(t, dir, 2), lines)
	}
	o.Recreate = true
	d = open(t, ctx, dir, v2, o)
	d.File.Close()
	if !d.Made || readBack(t, dir, 2) != "v2" {
		t.Fatalf("changed image, recreate: made %v, disk %q", d.Made, readBack(t, dir, 2))
	}
	var m meta
	b, _ := os.ReadFile(filepath.Join(dir, MetaName))
	if err := json.Unmarshal(b, &m); err != nil || m.Source != v2.Name || !isFingerprint(m.Image) {
		t.Fatalf("%s = %s (%v)", MetaName, b, err)
	}
}

func TestOnDirectoryGrows(t *testing.T) {
	dir := t.TempDir()
	d := open(t, context.Background(), dir, rawImage(t, "g", 1<<20), Options{Img: qemuImg(t), Size: 8 << 20})
	d.File.Close()
	out, err := exec.Command("qemu-img", "info", "--output=json", filepath.Join(dir, DiskName)).Output()
	var info struct {
		VirtualSize int64 `json:"virtual-size"`
	}
	if err != nil || json.Unmarshal(out, &info) != nil || info.VirtualSize != 8<<20 {
		t.Fatalf("virtual size %d (%v), want %d", info.VirtualSize, err, 8<<20)
	}
}

func TestOnDirectoryRefuses(t *testing.T) {
	ctx := context.Background()
	img := rawImage(t, "x", 1<<20)
	tests := []struct {
		name    string
		prepare func(t *testing.T, dir string)
		opts    func(*Options)
		want    string
	}{
		{name: "too small", opts: func(o *Options) { o.Size = 1 << 60 }, want: "root disk volume /data holds"},
		{name: "disk is a symlink", prepare: func(t *testing.T, dir string) {
			must(t, os.Symlink("/etc/shadow", filepath.Join(dir, DiskName)))
		}, want: "open " + DiskName},
		{name: "disk is a hard link", prepare: func(t *testing.T, dir string) {
			other := filepath.Join(dir, "other")
			must(t, os.WriteFile(other, []byte("QFI\xfb"), 0o600))
			must(t, os.Link(other, filepath.Join(dir, DiskName)))
		}, want: "open " + DiskName + ": a regular file with 2 links, not 1"},
		{name: "disk is a directory", prepare: func(t *testing.T, dir string) {
			must(t, os.Mkdir(filepath.Join(dir, DiskName), 0o700))
		}, want: DiskName},
		{name: "lock is a symlink", prepare: func(t *testing.T, dir string) {
			must(t, os.Symlink("/etc/passwd", filepath.Join(dir, LockName)))
		}, want: "open " + LockName},
		{name: "disk with a backing file", prepare: func(t *testing.T, dir string) {
			out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", "-u", "-b", "/etc/shadow", "-F", "raw", filepath.Join(dir, DiskName), "1M").CombinedOutput()
			if err != nil {
				t.Fatalf("%v: %s", err, out)
			}
		}, want: "backing file"},
		{name: "disk not qcow2", prepare: func(t *testing.T, dir string) {
			must(t, os.WriteFile(filepath.Join(dir, DiskName), []byte("not a disk"), 0o600))
		}, want: "not a usable qcow2 image"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.prepare != nil {
				tc.prepare(t, dir)
			}
			o := Options{Img: qemuImg(t)}
			if tc.opts != nil {
				tc.opts(&o)
			}
			d, err := OnDirectory(ctx, dir, "/data", img, o)
			if err == nil {
				d.File.Close()
				t.Fatalf("OnDirectory() succeeded, want an error containing %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("OnDirectory() = %v, want one line containing %q", err, tc.want)
			}
			if _, err := os.Stat(filepath.Join(dir, tempName)); !os.IsNotExist(err) {
				t.Errorf("%s left behind", tempName)
			}
		})
	}
}

// TestOnDirectoryAfterCrash: a disk half made when its shim died is made
// again, not used.
func TestOnDirectoryAfterCrash(t *testing.T) {
	dir := t.TempDir()
	must(t, os.WriteFile(filepath.Join(dir, tempName), []byte("half"), 0o600))
	d := open(t, context.Background(), dir, rawImage(t, "c", 1<<20), Options{Img: qemuImg(t)})
	d.File.Close()
	if !d.Made || readBack(t, dir, 1) != "c" {
		t.Fatalf("made %v, disk %q", d.Made, readBack(t, dir, 1))
	}
}

func TestFingerprint(t *testing.T) {
	a, b := rawImage(t, "a", 1<<20), rawImage(t, "b", 1<<20)
	fa, err := Fingerprint(a.File, a.Format)
	if err != nil || !isFingerprint(fa) {
		t.Fatalf("Fingerprint() = %q, %v", fa, err)
	}
	fa2, _ := Fingerprint(a.File, a.Format)
	fb, _ := Fingerprint(b.File, b.Format)
	fq, _ := Fingerprint(a.File, image.FormatQCOW2)
	if fa != fa2 || fa == fb || fa == fq {
		t.Fatalf("fingerprints a %s a %s b %s a-as-qcow2 %s", fa, fa2, fb, fq)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
