package image

import (
	"bytes"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"
)

// qcow2V3Header is the first 112 bytes of `qemu-img create -f qcow2 x 1G`.
const qcow2V3Header = "514649fb000000030000000000000000000000000000001000000000400000000000000000000002" +
	"000000000003000000000000000100000000000100000000000000000000000000000000000000000000" +
	"00000000000000000000000000000000000000000000000400000070"

// formatSeeds are valid and tricky FuzzDetectFormat inputs: qcow2, raw
// and each format detectFormat refuses, whole, cut short or shifted.
func formatSeeds() [][]byte {
	qcow2, err := hex.DecodeString(qcow2V3Header)
	if err != nil {
		panic(err)
	}
	mbr := make([]byte, headerSize)
	mbr[0], mbr[1], mbr[2], mbr[510], mbr[511] = 0xeb, 0x63, 0x90, 0x55, 0xaa
	return [][]byte{
		qcow2,
		append(append([]byte(nil), qcow2...), make([]byte, 2*headerSize)...),
		[]byte("QFI\xfb"),
		[]byte("QFI"),
		mbr,
		{0},
		at(1, "QFI\xfb"),
		at(0, "KDMV"),
		at(0, "# Disk DescriptorFile\nversion=1\n"),
		at(0x40, "\x7f\x10\xda\xbe"),
		[]byte("\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x7f\x10\xda"),
		at(0, "LUKS\xba\xbe\x00\x02"),
		at(0, "#!/bin/sh\n#V2.0 Format\n"),
		at(headerSize-4, "QFI\xfb"),
	}
}

// FuzzDetectFormat checks that format detection names qcow2 exactly when
// the qcow2 magic starts the file, raw for anything else no other format
// claims, and that reading the file's header gives the same answer.
func FuzzDetectFormat(f *testing.F) {
	for _, s := range formatSeeds() {
		f.Add(s)
	}
	file, err := os.Create(filepath.Join(f.TempDir(), "disk"))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { file.Close() })
	f.Fuzz(func(t *testing.T, header []byte) {
		format, err := detectFormat(header)
		switch {
		case err != nil:
			checkOneLine(t, err)
			if format != "" {
				t.Fatalf("detectFormat = %q and %v", format, err)
			}
			if len(header) > 0 && !claimedByOther(header) {
				t.Fatalf("detectFormat refuses a header no format claims: %v", err)
			}
		case format == FormatQCOW2:
			if !bytes.HasPrefix(header, []byte("QFI\xfb")) {
				t.Fatalf("qcow2 without the qcow2 magic")
			}
		case format == FormatRaw:
			if bytes.HasPrefix(header, []byte("QFI\xfb")) || claimedByOther(header) {
				t.Fatalf("raw for a header with a known magic")
			}
		default:
			t.Fatalf("detectFormat = %q, want qcow2 or raw", format)
		}
		short, shortErr := detectFormat(header[:min(len(header), headerSize)])
		if short != format || (shortErr == nil) != (err == nil) {
			t.Fatalf("the first %d bytes give %q, %v; the whole header %q, %v", headerSize, short, shortErr, format, err)
		}
		if err := file.Truncate(0); err != nil {
			t.Fatal(err)
		}
		if _, err := file.WriteAt(header, 0); err != nil {
			t.Fatal(err)
		}
		got, gotErr := detectFile(file)
		if got != format || (gotErr == nil) != (err == nil) {
			t.Fatalf("detectFile = %q, %v; detectFormat = %q, %v", got, gotErr, format, err)
		}
	})
}

// claimedByOther reports whether the header carries the magic of a format
// other than qcow2 at its offset.
func claimedByOther(header []byte) bool {
	for _, m := range knownMagics() {
		if m.format != FormatQCOW2 && len(header) >= m.offset+len(m.sig) && string(header[m.offset:m.offset+len(m.sig)]) == m.sig {
			return true
		}
	}
	return false
}
