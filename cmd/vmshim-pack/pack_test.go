package main

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/pkg/archive/compression"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// qcow2Header returns a minimal qcow2 header: version, backing file offset,
// virtual size and encryption method are all the packer reads.
func qcow2Header(version uint32, backing, size uint64, crypt uint32) []byte {
	h := make([]byte, 512)
	copy(h, "QFI\xfb")
	binary.BigEndian.PutUint32(h[4:], version)
	binary.BigEndian.PutUint64(h[8:], backing)
	binary.BigEndian.PutUint32(h[20:], 16)
	binary.BigEndian.PutUint64(h[24:], size)
	binary.BigEndian.PutUint32(h[32:], crypt)
	return h
}

// elfHeader returns the start of an ELF header for class and machine.
func elfHeader(class byte, machine uint16) []byte {
	h := make([]byte, 1024)
	copy(h, "\x7fELF")
	h[4], h[5] = class, 1
	binary.LittleEndian.PutUint16(h[18:], machine)
	return h
}

// bzImageHeader returns the start of an x86 bzImage.
func bzImageHeader() []byte {
	h := make([]byte, 8192)
	h[0x1fe], h[0x1ff] = 0x55, 0xaa
	copy(h[0x202:], "HdrS")
	return h
}

// writeTemp writes data to a new file in t's temp dir and returns its path.
func writeTemp(t *testing.T, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestInspectDisk(t *testing.T) {
	tests := []struct {
		name    string
		data    []byte
		format  string
		size    int64
		wantErr string
	}{
		{"qcow2 v3", qcow2Header(3, 0, 1<<30, 0), formatQcow2, 1 << 30, ""},
		{"qcow2 v2", qcow2Header(2, 0, 5<<20, 0), formatQcow2, 5 << 20, ""},
		{"raw", append([]byte{0xeb, 0x63, 0x90}, make([]byte, 4093)...), formatRaw, 4096, ""},
		{"qcow2 v1", qcow2Header(1, 0, 1<<20, 0), "", 0, "qcow2 version 1"},
		{"qcow2 overlay", qcow2Header(3, 512, 1<<20, 0), "", 0, "backing file"},
		{"qcow2 encrypted", qcow2Header(3, 0, 1<<20, 1), "", 0, "encrypted"},
		{"qcow2 truncated", []byte("QFI\xfb\x00\x00"), "", 0, "truncated"},
		{"vmdk", append([]byte("KDMV"), make([]byte, 1020)...), "", 0, "vmdk"},
		{"vhdx", append([]byte("vhdxfile"), make([]byte, 1016)...), "", 0, "vhdx"},
		{"gzip", append([]byte{0x1f, 0x8b, 8}, make([]byte, 1021)...), "", 0, "gzip-compressed"},
		{"xz", append([]byte("\xfd7zXZ\x00"), make([]byte, 1018)...), "", 0, "xz-compressed"},
		{"zstd", append([]byte{0x28, 0xb5, 0x2f, 0xfd}, make([]byte, 1020)...), "", 0, "zstd-compressed"},
		{"tar", append(append(make([]byte, 257), "ustar"...), make([]byte, 762)...), "", 0, "tar archive"},
		{"empty", nil, "", 0, "not a positive multiple of 512"},
		{"odd size", make([]byte, 1000), "", 0, "not a positive multiple of 512"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := writeTemp(t, "disk", tt.data)
			f, err := os.Open(p)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			info, err := inspectDisk(p, f)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.Is(err, errdefs.ErrInvalidArgument) {
					t.Fatalf("err = %v, want invalid argument mentioning %q", err, tt.wantErr)
				}
				if !strings.Contains(err.Error(), p) || strings.Contains(err.Error(), "\n") {
					t.Errorf("error %q should be one line naming %s", err, p)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if info.format != tt.format || info.virtualSize != tt.size {
				t.Errorf("got %s/%d, want %s/%d", info.format, info.virtualSize, tt.format, tt.size)
			}
		})
	}
}

func TestInspectKernel(t *testing.T) {
	tests := []struct {
		name    string
		data    []byte
		want    string
		wantErr bool
	}{
		{"bzImage", bzImageHeader(), kernelBzImage, false},
		{"elf x86-64", elfHeader(2, 62), kernelELF, false},
		{"elf arm64", elfHeader(2, 183), "", true},
		{"elf 32-bit", elfHeader(1, 3), "", true},
		{"gzip", []byte{0x1f, 0x8b, 8, 0}, "", true},
		{"empty", nil, "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := writeTemp(t, "kernel", tt.data)
			f, err := os.Open(p)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			got, err := inspectKernel(p, f)
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Fatalf("got %q, %v; want %q, error %v", got, err, tt.want, tt.wantErr)
			}
			if err != nil && !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("err = %v, want invalid argument", err)
			}
		})
	}
}

func TestNormalizeRef(t *testing.T) {
	tests := []struct {
		ref, name, tag string
		wantErr        bool
	}{
		{"localhost/vmshim-test/disk:wait", "localhost/vmshim-test/disk:wait", "wait", false},
		{"busybox", "docker.io/library/busybox:latest", "latest", false},
		{"registry.example:5000/vm/debian:12", "registry.example:5000/vm/debian:12", "12", false},
		{"", "", "", true},
		{"Upper/Case:x", "", "", true},
		{"localhost/vm@sha256:" + strings.Repeat("a", 64), "", "", true},
	}
	for _, tt := range tests {
		name, tag, err := normalizeRef(tt.ref)
		if (err != nil) != tt.wantErr || name != tt.name || tag != tt.tag {
			t.Errorf("normalizeRef(%q) = %q, %q, %v; want %q, %q, error %v", tt.ref, name, tag, err, tt.name, tt.tag, tt.wantErr)
		}
	}
}

func TestPackRefusesBadOptions(t *testing.T) {
	disk := writeTemp(t, "disk.qcow2", qcow2Header(3, 0, 1<<20, 0))
	kernel := writeTemp(t, "vmlinuz", bzImageHeader())
	vmdk := writeTemp(t, "disk.vmdk", append([]byte("KDMV"), make([]byte, 1020)...))
	out := filepath.Join(t.TempDir(), "out.tar")
	tests := []struct {
		name string
		opts packOptions
	}{
		{"nothing", packOptions{Ref: "localhost/a:b", Output: out}},
		{"both", packOptions{Disk: disk, Kernel: kernel, Ref: "localhost/a:b", Output: out}},
		{"initrd alone", packOptions{Disk: disk, Initrd: kernel, Ref: "localhost/a:b", Output: out}},
		{"no ref", packOptions{Disk: disk, Output: out}},
		{"no output", packOptions{Disk: disk, Ref: "localhost/a:b"}},
		{"gzip level", packOptions{Disk: disk, Ref: "localhost/a:b", Output: out, GzipLevel: 10}},
		{"vmdk", packOptions{Disk: vmdk, Ref: "localhost/a:b", Output: out}},
		{"kernel is a disk", packOptions{Kernel: disk, Ref: "localhost/a:b", Output: out}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.opts.GzipLevel == 0 {
				tt.opts.GzipLevel = 1
			}
			err := pack(context.Background(), tt.opts)
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("err = %v, want invalid argument", err)
			}
			assertOnly(t, filepath.Dir(out))
		})
	}
}

func TestPackMissingInput(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out.tar")
	err := pack(context.Background(), packOptions{Disk: "/nonexistent/disk.qcow2", Ref: "localhost/a:b", Output: out, GzipLevel: 1})
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("err = %v, want not exist", err)
	}
}

func TestPackCancelled(t *testing.T) {
	disk := writeTemp(t, "disk.qcow2", qcow2Header(3, 0, 1<<20, 0))
	out := filepath.Join(t.TempDir(), "out.tar")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := pack(ctx, packOptions{Disk: disk, Ref: "localhost/a:b", Output: out, GzipLevel: 1})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context canceled", err)
	}
	assertOnly(t, filepath.Dir(out))
}

// assertOnly fails if dir holds anything but the names given.
func assertOnly(t *testing.T, dir string, names ...string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		got = append(got, e.Name())
	}
	if strings.Join(got, ",") != strings.Join(names, ",") {
		t.Errorf("%s holds %v, want %v", dir, got, names)
	}
}

// layerEntry is one entry of an image layer as read back.
type layerEntry struct {
	name     string
	typeflag byte
	mode     int64
	uid, gid int
	data     []byte
}

// readTar returns the regular files of the tar at path by name, in order.
func readTar(t *testing.T, r io.Reader) (map[string][]byte, []*tar.Header) {
	t.Helper()
	files := map[string][]byte{}
	var hdrs []*tar.Header
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return files, hdrs
		}
		if err != nil {
			t.Fatal(err)
		}
		hdrs = append(hdrs, hdr)
		if hdr.Typeflag == tar.TypeReg {
			data, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			files[hdr.Name] = data
		}
	}
}

// blob returns the archive blob for desc after checking its digest and size.
func blob(t *testing.T, files map[string][]byte, desc ocispec.Descriptor) []byte {
	t.Helper()
	data, ok := files[blobPath(desc.Digest)]
	if !ok {
		t.Fatalf("blob %s missing from archive", desc.Digest)
	}
	if digest.FromBytes(data) != desc.Digest || int64(len(data)) != desc.Size {
		t.Fatalf("blob %s: digest %s size %d, descriptor says size %d", desc.Digest, digest.FromBytes(data), len(data), desc.Size)
	}
	return data
}

// readImage reads the archive at path back (index → manifest → config →
// layer), checking every digest on the way, and returns the index's
// manifest descriptor, the config and the layer entries.
func readImage(t *testing.T, path string) (ocispec.Descriptor, ocispec.Image, []layerEntry) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	files, _ := readTar(t, f)
	for name, data := range files {
		if strings.HasPrefix(name, "blobs/sha256/") && digest.FromBytes(data).Encoded() != strings.TrimPrefix(name, "blobs/sha256/") {
			t.Errorf("blob %s has digest %s", name, digest.FromBytes(data))
		}
	}
	var layout ocispec.ImageLayout
	var index ocispec.Index
	var manifest ocispec.Manifest
	var config ocispec.Image
	mustUnmarshal(t, files[ocispec.ImageLayoutFile], &layout)
	mustUnmarshal(t, files[ocispec.ImageIndexFile], &index)
	if layout.Version != ocispec.ImageLayoutVersion || index.SchemaVersion != 2 || index.MediaType != ocispec.MediaTypeImageIndex || len(index.Manifests) != 1 {
		t.Fatalf("bad layout %+v or index %+v", layout, index)
	}
	md := index.Manifests[0]
	mustUnmarshal(t, blob(t, files, md), &manifest)
	if md.MediaType != ocispec.MediaTypeImageManifest || manifest.MediaType != md.MediaType || len(manifest.Layers) != 1 {
		t.Fatalf("bad manifest %+v", manifest)
	}
	if manifest.Config.MediaType != ocispec.MediaTypeImageConfig {
		t.Errorf("config media type %s", manifest.Config.MediaType)
	}
	mustUnmarshal(t, blob(t, files, manifest.Config), &config)
	ld := manifest.Layers[0]
	wantType := map[compression.Compression]string{
		compression.Gzip: ocispec.MediaTypeImageLayerGzip,
		compression.Zstd: ocispec.MediaTypeImageLayerZstd,
	}
	layerBlob := blob(t, files, ld)
	if c := compression.DetectCompression(layerBlob); ld.MediaType != wantType[c] {
		t.Errorf("layer media type %s for a %s blob", ld.MediaType, c.Extension())
	}
	// Decompressed the way containerd does when it unpacks.
	dr, err := compression.DecompressStream(bytes.NewReader(layerBlob))
	if err != nil {
		t.Fatal(err)
	}
	layerTar, err := io.ReadAll(dr)
	dr.Close()
	if err != nil {
		t.Fatal(err)
	}
	if len(config.RootFS.DiffIDs) != 1 || config.RootFS.DiffIDs[0] != digest.FromBytes(layerTar) || config.RootFS.Type != "layers" {
		t.Errorf("rootfs %+v, layer diff id %s", config.RootFS, digest.FromBytes(layerTar))
	}
	if config.OS != "linux" || config.Architecture != "amd64" || md.Platform == nil || md.Platform.OS != "linux" || md.Platform.Architecture != "amd64" {
		t.Errorf("platform: config %s/%s, index %+v", config.OS, config.Architecture, md.Platform)
	}
	contents, hdrs := readTar(t, bytes.NewReader(layerTar))
	var entries []layerEntry
	for _, h := range hdrs {
		entries = append(entries, layerEntry{h.Name, h.Typeflag, h.Mode, h.Uid, h.Gid, contents[h.Name]})
	}
	return md, config, entries
}

func mustUnmarshal(t *testing.T, data []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatalf("unmarshal %T: %v", v, err)
	}
}

func TestPackRoundTrip(t *testing.T) {
	qcow := qcow2Header(3, 0, 8<<30, 0)
	raw := make([]byte, 3<<20+512) // more than one copy buffer
	for i := range raw {
		raw[i] = byte(i * 7)
	}
	bz, elf, initrd := bzImageHeader(), elfHeader(2, 62), []byte("070701 initrd")
	dir := t.TempDir()
	for name, data := range map[string][]byte{"d.qcow2": qcow, "d.raw": raw, "bzImage": bz, "vmlinux-6.1": elf, "initrd": initrd} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	p := func(name string) string { return filepath.Join(dir, name) }
	dirEntry := func(name string) layerEntry { return layerEntry{name, tar.TypeDir, 0o755, 0, 0, nil} }
	fileEntry := func(name string, data []byte) layerEntry { return layerEntry{name, tar.TypeReg, 0o444, 0, 0, data} }

	tests := []struct {
		name    string
		opts    packOptions
		ref     string
		entries []layerEntry
		labels  map[string]string
	}{
		{
			name: "qcow2 disk", opts: packOptions{Disk: p("d.qcow2"), Ref: "localhost/vmshim-test/disk:wait"},
			ref:     "localhost/vmshim-test/disk:wait",
			entries: []layerEntry{dirEntry("disk/"), fileEntry("disk/disk.qcow2", qcow)},
			labels:  map[string]string{labelKind: "disk", labelDiskFormat: "qcow2", labelDiskPath: "/disk/disk.qcow2", labelDiskSize: "8589934592"},
		},
		{
			name: "qcow2 disk for UEFI", opts: packOptions{Disk: p("d.qcow2"), Firmware: "uefi-secure", Ref: "localhost/vmshim-test/disk:uefi"},
			ref:     "localhost/vmshim-test/disk:uefi",
			entries: []layerEntry{dirEntry("disk/"), fileEntry("disk/disk.qcow2", qcow)},
			labels:  map[string]string{labelKind: "disk", labelDiskFormat: "qcow2", labelDiskPath: "/disk/disk.qcow2", labelDiskSize: "8589934592", "io.vmshim.firmware": "uefi-secure"},
		},
		{
			name: "raw disk", opts: packOptions{Disk: p("d.raw"), Ref: "vm/raw"},
			ref:     "docker.io/vm/raw:latest",
			entries: []layerEntry{dirEntry("disk/"), fileEntry("disk/disk.img", raw)},
			labels:  map[string]string{labelKind: "disk", labelDiskFormat: "raw", labelDiskPath: "/disk/disk.img", labelDiskSize: "3146240"},
		},
		{
			name: "bzImage and initrd", opts: packOptions{Kernel: p("bzImage"), Initrd: p("initrd"), Ref: "localhost/k:z"},
			ref:     "localhost/k:z",
			entries: []layerEntry{dirEntry("boot/"), fileEntry("boot/vmlinuz", bz), fileEntry("boot/initrd.img", initrd)},
			labels:  map[string]string{labelKind: "kernel", labelKernelPath: "/boot/vmlinuz", labelKernelKind: "vmlinuz", labelInitrdPath: "/boot/initrd.img"},
		},
		{
			name: "elf kernel alone", opts: packOptions{Kernel: p("vmlinux-6.1"), Ref: "localhost/k:x"},
			ref:     "localhost/k:x",
			entries: []layerEntry{dirEntry("boot/"), fileEntry("boot/vmlinux", elf)},
			labels:  map[string]string{labelKind: "kernel", labelKernelPath: "/boot/vmlinux", labelKernelKind: "vmlinux"},
		},
	}
	created := time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			outDir := t.TempDir()
			tt.opts.Output = filepath.Join(outDir, "out.tar")
			tt.opts.Created, tt.opts.GzipLevel = created, 1
			if err := pack(context.Background(), tt.opts); err != nil {
				t.Fatal(err)
			}
			assertOnly(t, outDir, "out.tar")
			md, config, entries := readImage(t, tt.opts.Output)
			_, tag, _ := strings.Cut(tt.ref[strings.LastIndex(tt.ref, "/"):], ":")
			if md.Annotations[annotationImgRef] != tt.ref || md.Annotations[ocispec.AnnotationRefName] != tag {
				t.Errorf("index annotations %v, want %s and tag %s", md.Annotations, tt.ref, tag)
			}
			tt.labels[ocispec.AnnotationCreated] = "2024-05-06T07:08:09Z"
			if len(config.Config.Labels) != len(tt.labels) {
				t.Errorf("labels %v, want %v", config.Config.Labels, tt.labels)
			}
			for k, v := range tt.labels {
				if config.Config.Labels[k] != v {
					t.Errorf("label %s = %q, want %q", k, config.Config.Labels[k], v)
				}
			}
			if config.Created == nil || !config.Created.Equal(created) || len(config.Config.Cmd) != 1 || config.Config.Cmd[0] != "/"+tt.entries[1].name {
				t.Errorf("config created %v cmd %v", config.Created, config.Config.Cmd)
			}
			if len(entries) != len(tt.entries) {
				t.Fatalf("layer has %d entries, want %d", len(entries), len(tt.entries))
			}
			for i, e := range entries {
				w := tt.entries[i]
				if e.name != w.name || e.typeflag != w.typeflag || e.mode != w.mode || e.uid != 0 || e.gid != 0 || !bytes.Equal(e.data, w.data) {
					t.Errorf("layer entry %d: %s type %c mode %o uid %d gid %d %d bytes; want %s type %c mode %o root %d bytes",
						i, e.name, e.typeflag, e.mode, e.uid, e.gid, len(e.data), w.name, w.typeflag, w.mode, len(w.data))
				}
			}
		})
	}
}

func TestPackReproducible(t *testing.T) {
	disk := writeTemp(t, "disk.qcow2", qcow2Header(3, 0, 1<<20, 0))
	dir := t.TempDir()
	var archives [][]byte
	for _, name := range []string{"a.tar", "b.tar"} {
		opts := packOptions{Disk: disk, Ref: "localhost/a:b", Output: filepath.Join(dir, name), Created: time.Unix(1e9, 0), GzipLevel: 6}
		if err := pack(context.Background(), opts); err != nil {
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
}
