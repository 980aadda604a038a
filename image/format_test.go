package image

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

func at(offset int, sig string) []byte {
	b := make([]byte, headerSize)
	copy(b[offset:], sig)
	return b
}

func TestDetectFormat(t *testing.T) {
	mbr := make([]byte, headerSize)
	mbr[510], mbr[511] = 0x55, 0xaa
	tests := []struct {
		name    string
		header  []byte
		want    string
		wantErr string
	}{
		{"qcow2 v3", at(0, "QFI\xfb\x00\x00\x00\x03"), "qcow2", ""},
		{"qcow2 v2", at(0, "QFI\xfb\x00\x00\x00\x02"), "qcow2", ""},
		{"qcow2 magic then garbage", []byte("QFI\xfbgarbage"), "qcow2", ""},
		{"qcow2 magic only", []byte("QFI\xfb"), "qcow2", ""},
		{"zeros", make([]byte, headerSize), "raw", ""},
		{"mbr", mbr, "raw", ""},
		{"short file", []byte("QF"), "raw", ""},
		{"text", []byte("hello"), "raw", ""},
		{"qcow2 magic not at start", at(1, "QFI\xfb"), "raw", ""},
		{"empty", nil, "", "empty file"},
		{"vmdk sparse", at(0, "KDMV"), "", "unsupported disk format vmdk"},
		{"vmdk cowd", at(0, "COWD"), "", "unsupported disk format vmdk"},
		{"vmdk descriptor", at(0, "# Disk DescriptorFile\nversion=1\n"), "", "unsupported disk format vmdk"},
		{"vdi", at(0x40, "\x7f\x10\xda\xbe"), "", "unsupported disk format vdi"},
		{"vhdx", at(0, "vhdxfile"), "", "unsupported disk format vhdx"},
		{"vpc", at(0, "conectix"), "", "unsupported disk format vpc"},
		{"qed", at(0, "QED\x00"), "", "unsupported disk format qed"},
		{"luks", at(0, "LUKS\xba\xbe\x00\x01"), "", "unsupported disk format luks"},
		{"parallels", at(0, "WithoutFreeSpace"), "", "unsupported disk format parallels"},
		{"bochs", at(0, "Bochs Virtual HD Image"), "", "unsupported disk format bochs"},
		{"cloop", at(0, "#!/bin/sh\n#V2.0 Format\n"), "", "unsupported disk format cloop"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := detectFormat(tc.header)
			if tc.wantErr != "" {
				if err == nil || !strings.HasPrefix(err.Error(), tc.wantErr) || !errdefs.IsInvalidArgument(err) {
					t.Fatalf("detectFormat() = %q, %v; want invalid argument %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("detectFormat() = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// TestDetectFormatRealImages checks the signatures against images qemu-img makes.
func TestDetectFormatRealImages(t *testing.T) {
	qemuImg := needQEMUImg(t)
	dir := t.TempDir()
	tests := []struct {
		format string
		want   string // "" = the format itself is refused
	}{
		{format: "qcow2", want: "qcow2"},
		{format: "raw", want: "raw"},
		{format: "vmdk"},
		{format: "vdi"},
		{format: "vhdx"},
		{format: "vpc"},
		{format: "qed"},
		{format: "parallels"},
	}
	for _, tc := range tests {
		t.Run(tc.format, func(t *testing.T) {
			p := filepath.Join(dir, "disk."+tc.format)
			if out, err := exec.Command(qemuImg, "create", "-q", "-f", tc.format, p, "1M").CombinedOutput(); err != nil {
				t.Skipf("qemu-img cannot create %s here: %v: %s", tc.format, err, out)
			}
			if tc.format == "raw" {
				// A fresh raw image is sparse zeros; give it a boot sector.
				if err := os.WriteFile(p, at(0, "\xeb\x63\x90"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			f, err := os.Open(p)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			got, err := detectFile(f)
			if tc.want != "" {
				if err != nil || got != tc.want {
					t.Fatalf("detectFile() = %q, %v; want %q", got, err, tc.want)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), "unsupported disk format") {
				t.Fatalf("detectFile() = %q, %v; want unsupported disk format", got, err)
			}
		})
	}
}

func needQEMUImg(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("qemu-img")
	if err != nil {
		t.Skip("qemu-img is not installed")
	}
	return p
}

func TestDiskBoot(t *testing.T) {
	at := func(size int, off int, data string) []byte {
		b := make([]byte, size)
		copy(b[off:], data)
		return b
	}
	tests := []struct {
		name    string
		data    []byte
		iso     bool
		format  string
		wantErr string
	}{
		{"qcow2", at(64<<10, 0, "QFI\xfb"), false, FormatQCOW2, ""},
		{"raw", at(64<<10, 510, "\x55\xaa"), false, FormatRaw, ""},
		{"iso", at(64<<10, 0x8000, "\x01CD001\x01"), true, "", ""},
		{"hybrid iso", at(64<<10, 0x8000, "\x01CD001\x01"), true, "", ""},
		{"qcow2 with CD001 inside", append(at(0x8001, 0, "QFI\xfb"), []byte("CD001")...), false, FormatQCOW2, ""},
		{"raw shorter than the descriptor", at(0x8003, 0x8001, "CD"), false, FormatRaw, ""},
		{"vmdk", at(64<<10, 0, "KDMV"), false, "", "unsupported disk format vmdk"},
	}
	tests[3].data[510], tests[3].data[511] = 0x55, 0xaa
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "d")
			if err := os.WriteFile(p, tt.data, 0o600); err != nil {
				t.Fatal(err)
			}
			f, err := os.Open(p)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			b, err := DiskBoot(f, "https://example.org/d")
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), "disk https://example.org/d: "+tt.wantErr) {
					t.Fatalf("err %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tt.iso {
				if b.ISO != "https://example.org/d" || b.ISOFile != f || b.Disk != "" || b.DiskFile != nil {
					t.Errorf("boot %+v, want the ISO", b)
				}
				return
			}
			if b.Disk != "https://example.org/d" || b.DiskFile != f || b.Format != tt.format || b.ISO != "" {
				t.Errorf("boot %+v, want disk %s", b, tt.format)
			}
		})
	}
}
