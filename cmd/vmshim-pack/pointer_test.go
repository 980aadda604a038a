package main

import (
	"archive/tar"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/vmshim/vmshim/image"
)

// testSum is a valid sha256 digest, in lowercase.
const testSum = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"

func TestPackPointer(t *testing.T) {
	const u = "https://example.org/vms/debian-12.qcow2?sig=a%2Fb"
	tests := []struct {
		name        string
		url, sum    string
		compression string
	}{
		{"digest alone", u, testSum, compressionGzip},
		{"sha256sum line, zstd", u + "\n", testSum + "  debian-12.qcow2\n", compressionZstd},
		{"prefixed uppercase digest", u, "sha256:" + strings.ToUpper(testSum), compressionGzip},
	}
	created := time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			outDir := t.TempDir()
			opts := packOptions{URL: tt.url, SHA256: tt.sum, Ref: "localhost/vms/debian-url:12", Output: filepath.Join(outDir, "out.tar"),
				Created: created, Compression: tt.compression, GzipLevel: 6, ZstdLevel: 3}
			if err := pack(context.Background(), opts); err != nil {
				t.Fatal(err)
			}
			assertOnly(t, outDir, "out.tar")
			_, config, entries := readImage(t, opts.Output)
			want := []layerEntry{
				{"disk/", tar.TypeDir, 0o755, 0, 0, nil},
				{"disk/disk.url", tar.TypeReg, 0o444, 0, 0, []byte(u + "\n")},
				{"disk/disk.sha256", tar.TypeReg, 0o444, 0, 0, []byte(testSum + "\n")},
			}
			if len(entries) != len(want) {
				t.Fatalf("layer has %d entries, want %d: %v", len(entries), len(want), entries)
			}
			for i, e := range entries {
				w := want[i]
				if e.name != w.name || e.typeflag != w.typeflag || e.mode != w.mode || e.uid != 0 || e.gid != 0 || string(e.data) != string(w.data) {
					t.Errorf("layer entry %d: %s type %c mode %o uid %d gid %d %q; want %s type %c mode %o root %q",
						i, e.name, e.typeflag, e.mode, e.uid, e.gid, e.data, w.name, w.typeflag, w.mode, w.data)
				}
			}
			labels := map[string]string{labelKind: "pointer", labelDiskURL: u, labelDiskSHA256: testSum, ocispec.AnnotationCreated: "2024-05-06T07:08:09Z"}
			if len(config.Config.Labels) != len(labels) {
				t.Errorf("labels %v, want %v", config.Config.Labels, labels)
			}
			for k, v := range labels {
				if config.Config.Labels[k] != v {
					t.Errorf("label %s = %q, want %q", k, config.Config.Labels[k], v)
				}
			}
			if cmd := config.Config.Cmd; len(cmd) != 1 || cmd[0] != image.PointerURLFile {
				t.Errorf("config cmd %v", cmd)
			}
			// The shim finds the pointer in the unpacked layer.
			b, err := image.Find(unpack(t, entries))
			if err != nil {
				t.Fatalf("image.Find() on the unpacked layer: %v", err)
			}
			defer b.Close()
			if b.URL != u || b.SHA256 != testSum || b.Disk != "" || b.Kernel != "" {
				t.Errorf("image.Find() = %+v, want URL %s and sha256 %s", *b, u, testSum)
			}
		})
	}
}

// unpack writes layer entries into a new rootfs and returns its path.
func unpack(t *testing.T, entries []layerEntry) string {
	t.Helper()
	root := filepath.Join(t.TempDir(), "rootfs")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		p := filepath.Join(root, e.name)
		var err error
		switch e.typeflag {
		case tar.TypeDir:
			err = os.Mkdir(p, os.FileMode(e.mode))
		case tar.TypeReg:
			err = os.WriteFile(p, e.data, os.FileMode(e.mode))
		default:
			t.Fatalf("layer entry %s of type %c", e.name, e.typeflag)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestPackPointerRefused(t *testing.T) {
	disk := writeTemp(t, "disk.qcow2", qcow2Header(3, 0, 1<<20, 0))
	kernel := writeTemp(t, "vmlinuz", bzImageHeader())
	out := filepath.Join(t.TempDir(), "out.tar")
	ok := packOptions{URL: "https://example.org/d.qcow2", SHA256: testSum, Ref: "localhost/a:b", Output: out, GzipLevel: 6, ZstdLevel: 3}
	tests := []refusal{
		{"ftp URL", func(o *packOptions) { o.URL = "ftp://example.org/d.qcow2" }, `URL scheme "ftp" is not http or https`},
		{"two-line URL", func(o *packOptions) { o.URL = "https://a.example/d\nhttps://b.example/d" }, "more than one line"},
		{"URL with a space", func(o *packOptions) { o.URL = "https://example.org/my disk.qcow2" }, "a space at byte 22"},
		{"URL without host", func(o *packOptions) { o.URL = "https:///d.qcow2" }, "has no host"},
		{"short digest", func(o *packOptions) { o.SHA256 = testSum[1:] }, "is not a sha256 digest (64 hex digits)"},
		{"md5 digest", func(o *packOptions) { o.SHA256 = "d41d8cd98f00b204e9800998ecf8427e" }, "is not a sha256 digest"},
		{"non-hex digest", func(o *packOptions) { o.SHA256 = strings.Repeat("z", 64) }, "is not a sha256 digest"},
		{"URL and a disk", func(o *packOptions) { o.Disk = disk }, "--url and --disk are exclusive"},
		{"URL and a kernel", func(o *packOptions) { o.Kernel = kernel }, "--url and --kernel are exclusive"},
		{"URL and an initrd", func(o *packOptions) { o.Initrd = kernel }, "--url and --kernel are exclusive"},
		{"URL and qcow2", func(o *packOptions) { o.Qcow2 = true }, "--qcow2 converts a disk, and a pointer image (--url) holds none"},
		{"digest and a disk", func(o *packOptions) { o.URL, o.Disk = "", disk }, "--sha256 needs --url"},
		{"URL without digest", func(o *packOptions) { o.SHA256 = "" }, "--url needs --sha256"},
		{"digest without URL", func(o *packOptions) { o.URL = "" }, "--sha256 needs --url"},
	}
	runRefusals(t, ok, tests)
}

func TestParseFlagsPointer(t *testing.T) {
	devnull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer devnull.Close()
	t.Setenv("SOURCE_DATE_EPOCH", "1000000000")

	opts, err := parseFlags([]string{"--url", "https://e.org/d", "--sha256", testSum, "--ref", "localhost/a:b", "-o", "o.tar"}, devnull)
	if err != nil {
		t.Fatal(err)
	}
	if opts.URL != "https://e.org/d" || opts.SHA256 != testSum || opts.Disk != "" {
		t.Errorf("parsed %+v", opts)
	}
	// A disk is refused by pack, with every other conflict (see
	// TestPackPointerRefused); --qemu-img, which pack cannot tell was
	// given, here.
	_, err = parseFlags([]string{"--url", "https://e.org/d", "--sha256", testSum, "--qemu-img", "/usr/bin/qemu-img"}, devnull)
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "--qemu-img is for --qcow2") {
		t.Errorf("--url with --qemu-img: %v", err)
	}
	if _, err := parseFlags([]string{"--disk", "d", "--qemu-img", "/usr/bin/qemu-img"}, devnull); err != nil {
		t.Errorf("--disk with --qemu-img: %v", err)
	}
}

// TestUsageMentionsURL runs vmshim-pack -h, as this test binary, and
// checks the usage shows how to make a pointer image.
func TestUsageMentionsURL(t *testing.T) {
	if os.Getenv("VMSHIM_PACK_TEST_USAGE") == "1" {
		_, _ = parseFlags([]string{"-h"}, os.Stderr) // exits
		os.Exit(3)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestUsageMentionsURL$")
	cmd.Env = append(os.Environ(), "VMSHIM_PACK_TEST_USAGE=1")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("vmshim-pack -h: %v: %s", err, stderr.String())
	}
	usage := stderr.String()
	for _, want := range []string{
		"| --url URL --sha256 HEX)",
		"pointer image",
		"/disk/disk.url and /disk/disk.sha256",
		"  --url URL\n",
		"  --sha256 HEX\n",
		"vmshim-pack --url https://",
	} {
		if !strings.Contains(usage, want) {
			t.Errorf("usage lacks %q:\n%s", want, usage)
		}
	}
}
