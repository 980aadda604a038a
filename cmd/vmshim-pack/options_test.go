package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// patterned returns n bytes that compress, but not to nothing.
func patterned(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i * 7 / 3)
	}
	return b
}

func TestPackRefusesBadNewOptions(t *testing.T) {
	disk := writeTemp(t, "disk.qcow2", qcow2Header(3, 0, 1<<20, 0))
	kernel := writeTemp(t, "vmlinuz", bzImageHeader())
	out := filepath.Join(t.TempDir(), "out.tar")
	ok := packOptions{Disk: disk, Ref: "localhost/a:b", Output: out, GzipLevel: 6, ZstdLevel: 3}
	tests := []refusal{
		{"no output and no import", func(o *packOptions) { o.Output = "" }, "-o) or --import"},
		{"unknown compression", func(o *packOptions) { o.Compression = "xz" }, `compression "xz"`},
		{"zstd level 0", func(o *packOptions) { o.Compression, o.ZstdLevel = compressionZstd, 0 }, "zstd level 0"},
		{"zstd level 23", func(o *packOptions) { o.Compression, o.ZstdLevel = compressionZstd, 23 }, "zstd level 23"},
		{"qcow2 with a kernel", func(o *packOptions) { o.Disk, o.Kernel, o.Qcow2 = "", kernel, true }, "--qcow2 needs --disk"},
		{"packer's label", func(o *packOptions) { o.Labels = map[string]string{labelDiskFormat: "vmdk"} }, "label io.vmshim.disk.format"},
		{"packer's label prefix", func(o *packOptions) { o.Labels = map[string]string{"io.vmshim.x": ""} }, "io.vmshim."},
		{"unknown firmware", func(o *packOptions) { o.Firmware = "efi" }, `--firmware: "efi" is not one of bios, uefi, uefi-secure`},
		{"firmware for a kernel", func(o *packOptions) { o.Disk, o.Kernel, o.Firmware = "", kernel, "uefi" }, "--firmware is for disk images"},
		{"firmware as a label", func(o *packOptions) { o.Labels = map[string]string{"io.vmshim.firmware": "uefi"} }, "label io.vmshim.firmware"},
		{"empty label key", func(o *packOptions) { o.Labels = map[string]string{"": "v"} }, "empty key"},
	}
	runRefusals(t, ok, tests)
}

// refusal is a change to options that pack must refuse with an invalid
// argument error mentioning want.
type refusal struct {
	name   string
	change func(*packOptions)
	want   string
}

// runRefusals runs pack with each change made to ok: each is refused in
// one line, and nothing is written next to ok's output.
func runRefusals(t *testing.T, ok packOptions, tests []refusal) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := ok
			tt.change(&opts)
			err := pack(context.Background(), opts)
			if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want invalid argument mentioning %q", err, tt.want)
			}
			if strings.ContainsAny(err.Error(), "\n\r") {
				t.Errorf("error %q is not one line", err)
			}
			assertOnly(t, filepath.Dir(ok.Output))
		})
	}
}

func TestPackCompression(t *testing.T) {
	raw := patterned(3<<20 + 512)
	disk := writeTemp(t, "disk.img", raw)
	tests := []struct {
		compression string
		level       int
		mediaType   string
	}{
		{"", 6, ocispec.MediaTypeImageLayerGzip},
		{compressionGzip, 1, ocispec.MediaTypeImageLayerGzip},
		{compressionGzip, 9, ocispec.MediaTypeImageLayerGzip},
		{compressionZstd, 1, ocispec.MediaTypeImageLayerZstd},
		{compressionZstd, 3, ocispec.MediaTypeImageLayerZstd},
		{compressionZstd, 19, ocispec.MediaTypeImageLayerZstd},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s-%d", tt.compression, tt.level), func(t *testing.T) {
			dir := t.TempDir()
			opts := packOptions{Disk: disk, Ref: "localhost/c:1", Created: time.Unix(1e9, 0),
				Compression: tt.compression, GzipLevel: tt.level, ZstdLevel: tt.level}
			var archives [][]byte
			// Twice, the second time on one CPU: the zstd encoder's
			// concurrency must not change its output.
			for i, procs := range []int{runtime.GOMAXPROCS(0), 1} {
				opts.Output = filepath.Join(dir, []string{"a.tar", "b.tar"}[i])
				prev := runtime.GOMAXPROCS(procs)
				err := pack(context.Background(), opts)
				runtime.GOMAXPROCS(prev)
				if err != nil {
					t.Fatal(err)
				}
				data, err := os.ReadFile(opts.Output)
				if err != nil {
					t.Fatal(err)
				}
				archives = append(archives, data)
			}
			if !bytes.Equal(archives[0], archives[1]) {
				t.Error("packing the same input twice gave different archives")
			}
			// readImage decompresses the layer as containerd does and
			// checks the diffID is the digest of the tar.
			_, config, entries := readImage(t, opts.Output)
			if len(entries) != 2 || !bytes.Equal(entries[1].data, raw) {
				t.Errorf("layer holds %d entries, or the disk differs", len(entries))
			}
			if config.Config.Labels[labelDiskFormat] != formatRaw {
				t.Errorf("labels %v", config.Config.Labels)
			}
			assertLayerType(t, opts.Output, tt.mediaType)
		})
	}
}

// assertLayerType checks the media type of the archive's only layer.
func assertLayerType(t *testing.T, archive, want string) {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	files, _ := readTar(t, f)
	var index ocispec.Index
	var manifest ocispec.Manifest
	mustUnmarshal(t, files[ocispec.ImageIndexFile], &index)
	mustUnmarshal(t, blob(t, files, index.Manifests[0]), &manifest)
	if got := manifest.Layers[0].MediaType; got != want {
		t.Errorf("layer media type %s, want %s", got, want)
	}
}

func TestPackLabels(t *testing.T) {
	disk := writeTemp(t, "disk.qcow2", qcow2Header(3, 0, 1<<20, 0))
	created := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		name   string
		labels map[string]string
		desc   string
		want   map[string]string
	}{
		{"none", nil, "", map[string]string{ocispec.AnnotationCreated: "2025-01-02T03:04:05Z"}},
		{"user labels and description", map[string]string{"org.example.team": "vm", "empty": ""}, "Debian 12",
			map[string]string{ocispec.AnnotationCreated: "2025-01-02T03:04:05Z", ocispec.AnnotationDescription: "Debian 12",
				"org.example.team": "vm", "empty": ""}},
		{"label overrides created and description", map[string]string{ocispec.AnnotationCreated: "x", ocispec.AnnotationDescription: "y"}, "z",
			map[string]string{ocispec.AnnotationCreated: "x", ocispec.AnnotationDescription: "y"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "out.tar")
			opts := packOptions{Disk: disk, Ref: "localhost/l:1", Output: out, Created: created, GzipLevel: 1,
				Labels: tt.labels, Description: tt.desc}
			if err := pack(context.Background(), opts); err != nil {
				t.Fatal(err)
			}
			_, config, _ := readImage(t, out)
			got := config.Config.Labels
			if len(got) != len(tt.want)+4 { // and the packer's four disk labels
				t.Errorf("labels %v, want the disk's and %v", got, tt.want)
			}
			for k, v := range tt.want {
				if got[k] != v {
					t.Errorf("label %s = %q, want %q", k, got[k], v)
				}
			}
			if got[labelDiskFormat] != formatQcow2 {
				t.Errorf("label %s = %q", labelDiskFormat, got[labelDiskFormat])
			}
		})
	}
}

func TestPackQcow2(t *testing.T) {
	qemuImg, err := exec.LookPath("qemu-img")
	if err != nil {
		t.Skip("no qemu-img")
	}
	raw := make([]byte, 2<<20)
	copy(raw[1<<20:], patterned(64<<10)) // one allocated cluster run, the rest a hole
	disk := writeTemp(t, "disk.img", raw)

	t.Run("converted", func(t *testing.T) {
		outDir := t.TempDir()
		out := filepath.Join(outDir, "out.tar")
		opts := packOptions{Disk: disk, Qcow2: true, QemuImg: qemuImg, Ref: "localhost/q:1", Output: out, GzipLevel: 1}
		if err := pack(context.Background(), opts); err != nil {
			t.Fatal(err)
		}
		assertOnly(t, outDir, "out.tar")
		_, config, entries := readImage(t, out)
		l := config.Config.Labels
		if l[labelDiskFormat] != formatQcow2 || l[labelDiskPath] != "/disk/disk.qcow2" || l[labelDiskSize] != "2097152" {
			t.Errorf("labels %v", l)
		}
		if len(entries) != 2 || entries[1].name != "disk/disk.qcow2" || !bytes.HasPrefix(entries[1].data, []byte("QFI\xfb")) {
			t.Fatalf("layer entries %v", entries)
		}
		// The qcow2 holds the raw disk's bytes.
		q := writeTemp(t, "back.qcow2", entries[1].data)
		back := filepath.Join(filepath.Dir(q), "back.raw")
		if out, err := exec.Command(qemuImg, "convert", "-f", "qcow2", "-O", "raw", q, back).CombinedOutput(); err != nil {
			t.Fatalf("qemu-img convert back: %v: %s", err, out)
		}
		if got, err := os.ReadFile(back); err != nil || !bytes.Equal(got, raw) {
			t.Errorf("converted disk differs from the raw one (%v)", err)
		}
	})
	t.Run("qcow2 input is packed as is", func(t *testing.T) {
		q := writeTemp(t, "d.qcow2", qcow2Header(3, 0, 1<<20, 0))
		out := filepath.Join(t.TempDir(), "out.tar")
		opts := packOptions{Disk: q, Qcow2: true, QemuImg: "/nonexistent/qemu-img", Ref: "localhost/q:2", Output: out, GzipLevel: 1}
		if err := pack(context.Background(), opts); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("qemu-img fails", func(t *testing.T) {
		outDir := t.TempDir()
		opts := packOptions{Disk: disk, Qcow2: true, QemuImg: "/nonexistent/qemu-img", Ref: "localhost/q:3",
			Output: filepath.Join(outDir, "out.tar"), GzipLevel: 1}
		err := pack(context.Background(), opts)
		if err == nil || !strings.Contains(err.Error(), "/nonexistent/qemu-img") || !strings.Contains(err.Error(), disk) ||
			strings.Contains(err.Error(), "\n") {
			t.Fatalf("err = %v, want one line naming the disk and qemu-img", err)
		}
		assertOnly(t, outDir)
	})
}

func TestParseFlags(t *testing.T) {
	devnull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer devnull.Close()
	t.Setenv("SOURCE_DATE_EPOCH", "1000000000")
	t.Setenv("CONTAINERD_NAMESPACE", "k8s.io")
	t.Setenv("CONTAINERD_ADDRESS", "")

	opts, err := parseFlags([]string{"--disk", "d.qcow2", "--ref", "localhost/a:b", "-o", "o.tar"}, devnull)
	if err != nil {
		t.Fatal(err)
	}
	if opts.Import != nil || opts.Compression != compressionGzip || opts.GzipLevel != 6 || opts.ZstdLevel != 3 ||
		opts.Qcow2 || opts.QemuImg != "qemu-img" || len(opts.Labels) != 0 || opts.Progress.Mode != progressNone ||
		!opts.Created.Equal(time.Unix(1e9, 0)) {
		t.Errorf("defaults: %+v", opts)
	}

	opts, err = parseFlags([]string{"--kernel", "k", "--ref", "r", "--import", "--snapshotter", "native",
		"--label", "a=b=c", "--label", "e=", "--compression", "zstd", "--zstd-level", "19", "--progress", "plain",
		"--description", "d", "--qcow2=false"}, devnull)
	if err != nil {
		t.Fatal(err)
	}
	want := importOptions{Address: defaultAddress, Namespace: "k8s.io", Snapshotter: "native"}
	if opts.Import == nil || *opts.Import != want {
		t.Errorf("import %+v, want %+v", opts.Import, want)
	}
	if opts.Labels["a"] != "b=c" || opts.Labels["e"] != "" || len(opts.Labels) != 2 || opts.Description != "d" ||
		opts.Compression != compressionZstd || opts.ZstdLevel != 19 || opts.Progress.Mode != progressPlain {
		t.Errorf("parsed %+v", opts)
	}

	if _, err := parseFlags([]string{"--progress", "loud"}, devnull); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("--progress loud: %v", err)
	}
	if _, err := parseFlags([]string{"--disk", "d", "extra"}, devnull); err == nil {
		t.Error("an extra argument was accepted")
	}
}
