package image

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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

func TestCreateOverlay(t *testing.T) {
	qemuImg := needQEMUImg(t)
	const baseSize = 2 << 20
	tests := []struct {
		name       string
		baseFormat string
		dir        string // directory name, to exercise awkward paths
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
			dir := filepath.Join(t.TempDir(), tc.dir)
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			base := filepath.Join(dir, "base."+tc.baseFormat)
			if tc.baseFormat == "qcow2" {
				dataQCOW2(t, base, baseSize)
			} else {
				qemuImgRun(t, "create", "-q", "-f", "raw", base, "2M")
			}
			before := sha(t, base)
			overlay := filepath.Join(dir, "overlay.qcow2")
			if err := CreateOverlay(context.Background(), qemuImg, base, tc.baseFormat, baseSize, overlay, tc.size); err != nil {
				t.Fatalf("CreateOverlay() error = %v", err)
			}
			oi := readOverlay(t, overlay)
			want := overlayInfo{VirtualSize: tc.wantSize, Format: "qcow2", Backing: base, BackingFormat: tc.baseFormat}
			if oi != want {
				t.Fatalf("overlay = %+v, want %+v", oi, want)
			}
			if sha(t, base) != before {
				t.Fatal("CreateOverlay() changed the base image")
			}
			if tc.size == 0 {
				qemuImgRun(t, "compare", "-f", "qcow2", "-F", tc.baseFormat, overlay, base)
			}
		})
	}
}

func TestCreateOverlayRefuses(t *testing.T) {
	qemuImg := needQEMUImg(t)
	dir := t.TempDir()
	base := filepath.Join(dir, "base.qcow2")
	qemuImgRun(t, "create", "-q", "-f", "qcow2", base, "4M")
	ov := filepath.Join(dir, "overlay.qcow2")
	tests := []struct {
		name       string
		qemuImg    string
		base       string
		baseFormat string
		baseSize   int64
		overlay    string
		size       int64
		wantErr    string // prefix
		is         func(error) bool
	}{
		{"shrink", qemuImg, base, "qcow2", 4 << 20, ov, 2 << 20,
			"overlay " + ov + ": size 2Mi (2097152 bytes) is smaller than the image's virtual size 4Mi (4194304 bytes); disks can only grow", errdefs.IsInvalidArgument},
		{"negative size", qemuImg, base, "qcow2", 4 << 20, ov, -1, "overlay " + ov + ": size -1 is negative", errdefs.IsInvalidArgument},
		{"unknown base size", qemuImg, base, "qcow2", 0, ov, 0, "overlay base " + base + ": virtual size 0 is not positive", errdefs.IsInvalidArgument},
		{"bad format", qemuImg, base, "vmdk", 4 << 20, ov, 0, `overlay base ` + base + `: format "vmdk" is not qcow2 or raw`, errdefs.IsInvalidArgument},
		{"relative base", qemuImg, "base.qcow2", "qcow2", 4 << 20, ov, 0, `overlay base "base.qcow2": not an absolute path`, errdefs.IsInvalidArgument},
		{"relative overlay", qemuImg, base, "qcow2", 4 << 20, "overlay.qcow2", 0, `overlay "overlay.qcow2": not an absolute path`, errdefs.IsInvalidArgument},
		{"missing base", qemuImg, base + ".missing", "qcow2", 4 << 20, ov, 0, "overlay base " + base + ".missing: does not exist", errdefs.IsNotFound},
		{"base is a directory", qemuImg, dir, "raw", 4 << 20, ov, 0, "overlay base " + dir + ": not a regular file (directory)", errdefs.IsInvalidArgument},
		{"overlay directory missing", qemuImg, base, "qcow2", 4 << 20, filepath.Join(dir, "nope", "o.qcow2"), 0, "overlay " + dir + "/nope/o.qcow2: qemu-img create: ", errdefs.IsFailedPrecondition},
		{"no qemu-img", filepath.Join(dir, "no-qemu-img"), base, "qcow2", 4 << 20, ov, 0, "overlay " + ov + ": run ", errdefs.IsFailedPrecondition},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := sha(t, base)
			err := CreateOverlay(context.Background(), tc.qemuImg, tc.base, tc.baseFormat, tc.baseSize, tc.overlay, tc.size)
			if err == nil || !strings.HasPrefix(err.Error(), tc.wantErr) || !tc.is(err) {
				t.Fatalf("CreateOverlay() error = %v, want %q", err, tc.wantErr)
			}
			if _, err := os.Lstat(tc.overlay); !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("overlay left behind after failure: %v", err)
			}
			if sha(t, base) != before {
				t.Fatal("CreateOverlay() changed the base image")
			}
		})
	}
}

func TestCreateOverlayExisting(t *testing.T) {
	qemuImg := needQEMUImg(t)
	dir := t.TempDir()
	base := filepath.Join(dir, "base.qcow2")
	qemuImgRun(t, "create", "-q", "-f", "qcow2", base, "1M")
	ov := filepath.Join(dir, "overlay.qcow2")
	if err := os.WriteFile(ov, []byte("keep me"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := CreateOverlay(context.Background(), qemuImg, base, "qcow2", 1<<20, ov, 0)
	if !errdefs.IsAlreadyExists(err) {
		t.Fatalf("CreateOverlay(existing) error = %v, want already exists", err)
	}
	if data, _ := os.ReadFile(ov); string(data) != "keep me" {
		t.Fatalf("existing file changed: %q", data)
	}
}

// TestCreateOverlayCleansUp uses a qemu-img that writes the overlay and then
// fails, and checks the partial file is removed.
func TestCreateOverlayCleansUp(t *testing.T) {
	dir := t.TempDir()
	fake := filepath.Join(dir, "qemu-img")
	script := "#!/bin/sh\nfor a; do prev2=$prev; prev=$a; done\necho partial > \"$prev2\"\necho 'qemu-img: disk full' >&2\nexit 1\n"
	if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	base := filepath.Join(dir, "base.raw")
	if err := os.WriteFile(base, make([]byte, 4096), 0o644); err != nil {
		t.Fatal(err)
	}
	ov := filepath.Join(dir, "overlay.qcow2")
	err := CreateOverlay(context.Background(), fake, base, "raw", 4096, ov, 0)
	if err == nil || err.Error() != "overlay "+ov+": qemu-img create: disk full" {
		t.Fatalf("CreateOverlay() error = %v", err)
	}
	if _, err := os.Lstat(ov); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("partial overlay left behind: %v", err)
	}
}
