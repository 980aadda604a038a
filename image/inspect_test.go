package image

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

// qemuImgRun runs qemu-img for test setup and fails the test on error.
func qemuImgRun(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command(needQEMUImg(t), args...).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// dataQCOW2 makes a qcow2 image at p holding n random bytes, so its
// metadata spans several clusters.
func dataQCOW2(t *testing.T, p string, n int) {
	t.Helper()
	raw := p + ".src"
	buf := make([]byte, n)
	if _, err := rand.Read(buf); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(raw, buf, 0o644); err != nil {
		t.Fatal(err)
	}
	qemuImgRun(t, "convert", "-f", "raw", "-O", "qcow2", raw, p)
	if err := os.Remove(raw); err != nil {
		t.Fatal(err)
	}
}

func sha(t *testing.T, p string) [32]byte {
	t.Helper()
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(data)
}

// diskRoot returns a rootfs with /disk/ made, and the host path of name in it.
func diskRoot(t *testing.T, name string) (root, disk string) {
	t.Helper()
	root = layout(t, map[string]string{"/disk/": ""})
	return root, filepath.Join(root, "disk", name)
}

func TestInspectAccepts(t *testing.T) {
	for _, m := range qemuImgModes(t) {
		t.Run(m.name, func(t *testing.T) { testInspectAccepts(t, m.q(t)) })
	}
}

func testInspectAccepts(t *testing.T, qemuImg QEMUImg) {
	ctx := context.Background()

	t.Run("qcow2", func(t *testing.T) {
		root, disk := diskRoot(t, "vm.qcow2")
		dataQCOW2(t, disk, 1<<20)
		before := sha(t, disk)
		b, err := Find(root)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		info, err := Inspect(ctx, qemuImg, b, Limits{MaxVirtualSize: 1 << 20})
		if err != nil {
			t.Fatalf("Inspect() error = %v", err)
		}
		if info.Format != "qcow2" || info.VirtualSize != 1<<20 || info.ActualSize <= 0 {
			t.Fatalf("Inspect() = %+v", *info)
		}
		if sha(t, disk) != before {
			t.Fatal("Inspect() changed the image")
		}
	})
	t.Run("raw", func(t *testing.T) {
		root, disk := diskRoot(t, "disk.img")
		if err := os.WriteFile(disk, at(0, "\xeb\x63\x90"), 0o644); err != nil {
			t.Fatal(err)
		}
		b, err := Find(root)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		info, err := Inspect(ctx, qemuImg, b, Limits{})
		if err != nil {
			t.Fatalf("Inspect() error = %v", err)
		}
		if info.Format != "raw" || info.VirtualSize != headerSize {
			t.Fatalf("Inspect() = %+v", *info)
		}
	})
}

func TestInspectRefuses(t *testing.T) {
	for _, m := range qemuImgModes(t) {
		t.Run(m.name, func(t *testing.T) { testInspectRefuses(t, m.q(t)) })
	}
}

func testInspectRefuses(t *testing.T, qemuImg QEMUImg) {
	tests := []struct {
		name    string
		make    func(t *testing.T, disk string) // writes the disk file
		format  string                          // "" = as Find pins it
		limits  Limits
		wantErr string // prefix, after "disk /disk/vm.qcow2: "
	}{
		{
			name: "backing file on the host",
			make: func(t *testing.T, d string) {
				qemuImgRun(t, "create", "-q", "-f", "qcow2", "-F", "raw", "-b", "/etc/passwd", d, "1M")
			},
			wantErr: `image has a backing file "/etc/passwd"; a VM image must be self-contained`,
		},
		{
			name: "backing file in the image",
			make: func(t *testing.T, d string) {
				qemuImgRun(t, "create", "-q", "-f", "qcow2", "-u", "-F", "qcow2", "-b", "base.qcow2", d, "1M")
			},
			wantErr: `image has a backing file "base.qcow2"`,
		},
		{
			name: "external data file",
			make: func(t *testing.T, d string) {
				df := filepath.Join(t.TempDir(), "data.raw")
				qemuImgRun(t, "create", "-q", "-f", "qcow2", "-o", "data_file="+df, d, "1M")
			},
			wantErr: `image uses an external data file "/`,
		},
		{
			name: "external data file that does not exist",
			make: func(t *testing.T, d string) {
				df := filepath.Join(t.TempDir(), "data.raw")
				qemuImgRun(t, "create", "-q", "-f", "qcow2", "-o", "data_file="+df, d, "1M")
				if err := os.Remove(df); err != nil {
					t.Fatal(err)
				}
			},
			wantErr: `image uses an external data file "/`,
		},
		{
			name: "truncated header",
			make: func(t *testing.T, d string) {
				qemuImgRun(t, "create", "-q", "-f", "qcow2", d, "1M")
				if err := os.Truncate(d, 100); err != nil {
					t.Fatal(err)
				}
			},
			wantErr: "not a usable qcow2 image: Could not open '/disk/vm.qcow2': qcow2 header too short",
		},
		{
			name: "truncated data",
			make: func(t *testing.T, d string) {
				dataQCOW2(t, d, 3<<20)
				if err := os.Truncate(d, 1<<20); err != nil {
					t.Fatal(err)
				}
			},
			wantErr: "image is corrupt: ",
		},
		{
			name: "garbage after qcow2 magic",
			make: func(t *testing.T, d string) {
				buf := bytes.Repeat([]byte{0xa5}, 64<<10)
				copy(buf, "QFI\xfb")
				if err := os.WriteFile(d, buf, 0o644); err != nil {
					t.Fatal(err)
				}
			},
			wantErr: "not a usable qcow2 image: Could not open '/disk/vm.qcow2': Unsupported qcow2 version",
		},
		{
			name:    "virtual size over the limit",
			make:    func(t *testing.T, d string) { qemuImgRun(t, "create", "-q", "-f", "qcow2", d, "300G") },
			limits:  Limits{MaxVirtualSize: 256 << 30},
			wantErr: "virtual size 300Gi is more than the limit 256Gi",
		},
		{
			name: "empty raw",
			make: func(t *testing.T, d string) {
				if err := os.WriteFile(d, nil, 0o644); err != nil {
					t.Fatal(err)
				}
			},
			format:  "raw",
			wantErr: "image is empty (virtual size 0)",
		},
		{
			name:    "unknown format",
			make:    func(t *testing.T, d string) { qemuImgRun(t, "create", "-q", "-f", "qcow2", d, "1M") },
			format:  "vmdk",
			wantErr: `format "vmdk" is not qcow2 or raw`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root, disk := diskRoot(t, "vm.qcow2")
			tc.make(t, disk)
			before := sha(t, disk)
			f, err := os.Open(disk)
			if err != nil {
				t.Fatal(err)
			}
			b := &Boot{Disk: disk, Format: tc.format, Root: root, DiskFile: f}
			if tc.format == "" {
				f.Close()
				if b, err = Find(root); err != nil {
					t.Fatal(err)
				}
			}
			defer b.Close()
			info, err := Inspect(context.Background(), qemuImg, b, tc.limits)
			if err == nil {
				t.Fatalf("Inspect() = %+v, want error %q", *info, tc.wantErr)
			}
			t.Logf("error: %v", err)
			want := "disk /disk/vm.qcow2: " + tc.wantErr
			if !strings.HasPrefix(err.Error(), want) {
				t.Fatalf("Inspect() error = %q, want prefix %q", err, want)
			}
			if strings.Contains(err.Error(), "\n") || strings.Contains(err.Error(), root) {
				t.Fatalf("Inspect() error is not one line naming rootfs paths: %q", err)
			}
			if !errdefs.IsInvalidArgument(err) {
				t.Fatalf("Inspect() error %q is not ErrInvalidArgument", err)
			}
			if sha(t, disk) != before {
				t.Fatal("Inspect() changed the image")
			}
		})
	}
}

func TestInspectBadCalls(t *testing.T) {
	qemuImg := hostQEMUImg(t)
	root, disk := diskRoot(t, "vm.qcow2")
	qemuImgRun(t, "create", "-q", "-f", "qcow2", disk, "1M")
	b, err := Find(root)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()

	if _, err := Inspect(context.Background(), qemuImg, &Boot{Kernel: "/boot/vmlinux"}, Limits{}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("Inspect(kernel boot) error = %v, want invalid argument", err)
	}
	// A Boot whose disk is named but not open has nothing to inspect:
	// Inspect never opens a path.
	if _, err := Inspect(context.Background(), qemuImg, &Boot{Disk: disk, Format: "qcow2", Root: root}, Limits{}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("Inspect(disk not open) error = %v, want invalid argument", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Inspect(ctx, qemuImg, b, Limits{}); !errors.Is(err, context.Canceled) {
		t.Errorf("Inspect(cancelled) error = %v, want context.Canceled", err)
	}
}

func TestMessage(t *testing.T) {
	stderr := "qemu-img: Could not open '/r/rootfs/disk/a.qcow2': bad\nIs another process using the image [/r/rootfs/disk/a.qcow2]?\n\n"
	if got, want := message(stderr, "/r/rootfs"), "Could not open '/disk/a.qcow2': bad (and 1 more)"; got != want {
		t.Fatalf("message() = %q, want %q", got, want)
	}
	if got := message("", "/r"); got != "no message" {
		t.Fatalf("message(\"\") = %q", got)
	}
	if got := message(strings.Repeat("x", 1000), ""); len(got) > maxMessage+len("…") {
		t.Fatalf("message() is %d bytes long", len(got))
	}
}

func TestFormatSize(t *testing.T) {
	for n, want := range map[int64]string{0: "0 bytes", 512: "512 bytes", 1 << 10: "1Ki", 3 << 29: "1536Mi", 256 << 30: "256Gi", 1<<30 + 1: "1073741825 bytes"} {
		if got := formatSize(n); got != want {
			t.Errorf("formatSize(%d) = %q, want %q", n, got, want)
		}
	}
}
