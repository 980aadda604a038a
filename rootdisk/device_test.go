package rootdisk

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmshim/vmshim/image"
)

// testDevice makes a file standing in for a block volume of size bytes,
// open read-write, with a group (not root's) that may write it, as disk
// devices have.
func testDevice(t *testing.T, size int64) *os.File {
	t.Helper()
	p := filepath.Join(t.TempDir(), "dev")
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o660)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	must(t, f.Truncate(size))
	if os.Geteuid() == 0 {
		must(t, f.Chown(0, testJailID+1))
		must(t, f.Chmod(0o660))
	}
	return f
}

// deviceQEMUImg runs qemu-img unjailed: a jailed one is given a device
// node of its own, which a file standing in for the device cannot have.
// The integration tests write onto a real device, jailed.
func deviceQEMUImg(t *testing.T) image.QEMUImg {
	q := qemuImg(t)
	q.Jail = nil
	return q
}

// readDevice reads n bytes of the device from its start.
func readDevice(t *testing.T, f *os.File, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := f.ReadAt(b, 0); err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestOnDevice(t *testing.T) {
	ctx := context.Background()
	dev := testDevice(t, 8<<20)
	var lines []string
	o := Options{Img: deviceQEMUImg(t), Log: func(l string) { lines = append(lines, l) }}
	v1 := rawImage(t, "v1", 1<<20)

	d, err := OnDevice(ctx, dev, "/dev/xvdb", v1, o)
	if err != nil {
		t.Fatal(err)
	}
	if !d.Made || d.Size != 7<<20 || readDevice(t, dev, 2) != "v1" {
		t.Fatalf("first boot: %+v, device holds %q", d, readDevice(t, dev, 2))
	}
	if !strings.Contains(strings.Join(lines, "\n"), "vmshim: writing the root disk onto volume /dev/xvdb: 100%") {
		t.Errorf("no progress lines: %q", lines)
	}
	// The guest writes; the next boot keeps it.
	if _, err := dev.WriteAt([]byte("guest"), 0); err != nil {
		t.Fatal(err)
	}
	if d, err = OnDevice(ctx, dev, "/dev/xvdb", v1, o); err != nil || d.Made || readDevice(t, dev, 5) != "guest" {
		t.Fatalf("second boot: %+v, %v, device holds %q", d, err, readDevice(t, dev, 5))
	}
	lines = nil
	v2 := rawImage(t, "v2", 1<<20)
	if d, err = OnDevice(ctx, dev, "/dev/xvdb", v2, o); err != nil || d.Made || readDevice(t, dev, 5) != "guest" || len(lines) != 1 || !strings.Contains(lines[0], "kept") {
		t.Fatalf("changed image, keep: %+v, %v, %q, log %q", d, err, readDevice(t, dev, 5), lines)
	}
	o.Recreate = true
	if d, err = OnDevice(ctx, dev, "/dev/xvdb", v2, o); err != nil || !d.Made || readDevice(t, dev, 2) != "v2" {
		t.Fatalf("changed image, recreate: %+v, %v, %q", d, err, readDevice(t, dev, 2))
	}
}

func TestOnDeviceTooSmall(t *testing.T) {
	_, err := OnDevice(context.Background(), testDevice(t, 2<<20), "/dev/xvdb", rawImage(t, "x", 4<<20), Options{Img: deviceQEMUImg(t)})
	if err == nil || !strings.Contains(err.Error(), "root disk volume /dev/xvdb holds 2.0 MiB (2097152 bytes), 1048576 of them for the disk, less than the root disk's 4.0 MiB") {
		t.Fatalf("OnDevice() = %v", err)
	}
}

// TestOnDeviceCrash: a device whose write was cut short (its header
// cleared, the disk half written) is written again.
func TestOnDeviceCrash(t *testing.T) {
	ctx := context.Background()
	dev := testDevice(t, 4<<20)
	img := rawImage(t, "ok", 1<<20)
	must(t, writeHeader(dev, 3<<20, nil))
	if _, err := dev.WriteAt([]byte("half"), 0); err != nil {
		t.Fatal(err)
	}
	d, err := OnDevice(ctx, dev, "/dev/xvdb", img, Options{Img: deviceQEMUImg(t)})
	if err != nil || !d.Made || readDevice(t, dev, 2) != "ok" {
		t.Fatalf("%+v, %v, device holds %q", d, err, readDevice(t, dev, 2))
	}
}

// TestVarsOnDirectory: the UEFI variables store is made from the template
// on the first boot, kept after that, and a store of another size (another
// firmware's, or planted) is refused.
func TestVarsOnDirectory(t *testing.T) {
	dir := t.TempDir()
	tpl := filepath.Join(t.TempDir(), "vars.fd")
	must(t, os.WriteFile(tpl, []byte("template-vars-4k"), 0o644))
	template, err := os.Open(tpl)
	must(t, err)
	defer template.Close()
	f, err := VarsOnDirectory(dir, "/data", template)
	must(t, err)
	if _, err := f.WriteAt([]byte("boot"), 0); err != nil {
		t.Fatal(err)
	}
	f.Close()
	f, err = VarsOnDirectory(dir, "/data", template)
	must(t, err)
	b := make([]byte, 4)
	if _, err := f.ReadAt(b, 0); err != nil || string(b) != "boot" {
		t.Fatalf("kept store holds %q (%v), want what the VM wrote", b, err)
	}
	f.Close()
	must(t, os.WriteFile(filepath.Join(dir, VarsName), []byte("short"), 0o600))
	if _, err := VarsOnDirectory(dir, "/data", template); err == nil || !strings.Contains(err.Error(), "is not a variables store of this firmware") {
		t.Fatalf("VarsOnDirectory(other size) = %v", err)
	}
	must(t, os.Remove(filepath.Join(dir, VarsName)))
	must(t, os.Symlink("/etc/shadow", filepath.Join(dir, VarsName)))
	if _, err := VarsOnDirectory(dir, "/data", template); err == nil {
		t.Fatal("a symlinked store was opened")
	}
}

// TestKeptOnDirectory: a file kept with the root disk (a TPM's state) is
// made empty on the first boot, 0600, and the same file is opened after
// that, with what the VM wrote.
func TestKeptOnDirectory(t *testing.T) {
	dir := t.TempDir()
	f, err := KeptOnDirectory(dir, "/data", "kept")
	must(t, err)
	fi, err := f.Stat()
	must(t, err)
	if fi.Size() != 0 || fi.Mode().Perm() != 0o600 {
		t.Fatalf("new file: %d bytes, mode %v; want empty, 0600", fi.Size(), fi.Mode())
	}
	if _, err := f.WriteAt([]byte("state"), 0); err != nil {
		t.Fatal(err)
	}
	f.Close()
	f, err = KeptOnDirectory(dir, "/data", "kept")
	must(t, err)
	defer f.Close()
	b := make([]byte, 5)
	if _, err := f.ReadAt(b, 0); err != nil || string(b) != "state" {
		t.Fatalf("kept file holds %q (%v)", b, err)
	}
	if _, err := KeptOnDirectory(filepath.Join(dir, "missing"), "/data", "kept"); err == nil || !strings.HasPrefix(err.Error(), "root disk volume /data: ") {
		t.Fatalf("a missing volume: %v", err)
	}
}
