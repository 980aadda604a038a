package tpm

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

// slot is one blob of a linear store: offset, valid length, section length.
type slot struct{ off, length, sect uint32 }

// store is a linear store's header with the given slots, followed by
// zeroes up to size.
func store(size int, slots ...slot) []byte {
	b := make([]byte, max(size, linearHdrSize))
	binary.LittleEndian.PutUint64(b, linearMagic)
	b[8] = linearVersion
	binary.LittleEndian.PutUint16(b[10:], linearHdrSize)
	for i, s := range slots {
		p := b[12+i*linearSlotSize:]
		binary.LittleEndian.PutUint32(p, s.off)
		binary.LittleEndian.PutUint32(p[4:], s.length)
		binary.LittleEndian.PutUint32(p[8:], s.sect)
	}
	return b[:size]
}

func TestParseState(t *testing.T) {
	// A store as swtpm 0.7 leaves it after QEMU's first boot: the
	// permanent state (1.9 KiB in a 2 KiB section) after the header.
	good := store(linearHdrSize+2048, slot{linearHdrSize, 1900, 2048})
	for _, tc := range []struct {
		name string
		b    []byte
		want string // "" for a good store
	}{
		{"just formatted", store(linearHdrSize), ""},
		{"one blob", good, ""},
		{"three blobs", store(linearHdrSize+4096+512+256, slot{linearHdrSize, 3000, 4096}, slot{linearHdrSize + 4096, 500, 512}, slot{linearHdrSize + 4608, 0, 256}), ""},
		{"trailing bytes", store(linearHdrSize+9000, slot{linearHdrSize, 1900, 2048}), ""},
		{"short", []byte("hello"), "shorter than"},
		{"header only partly", store(linearHdrSize)[:100], "shorter than"},
		{"garbage", []byte(strings.Repeat("garbage!", 100)), "magic"},
		{"version 2", func() []byte { b := store(linearHdrSize); b[8] = 2; return b }(), "format version 2"},
		{"header size", func() []byte { b := store(linearHdrSize); b[10] = 100; return b }(), "header size"},
		{"inside header", store(linearHdrSize+64, slot{100, 10, 16}), "inside the header"},
		{"past the end", store(linearHdrSize+100, slot{linearHdrSize, 100, 2048}), "past the file"},
		{"longer than section", store(linearHdrSize+4096, slot{linearHdrSize, 3000, 2048}), "in a section of"},
		{"free slot with bytes", store(linearHdrSize, slot{0, 5, 0}), "is free"},
		{"overlap", store(linearHdrSize+4096, slot{linearHdrSize, 100, 2048}, slot{linearHdrSize + 1024, 100, 1024}), "overlaps"},
		{"wraps", store(linearHdrSize+64, slot{0xffffff00, 10, 0x200}), "past the file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := parseState(tc.b[:min(len(tc.b), linearHdrSize)], int64(len(tc.b)))
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want one saying %q", err, tc.want)
			case err != nil && !errors.Is(err, errdefs.ErrFailedPrecondition):
				t.Fatalf("error %v is not a failed precondition", err)
			}
		})
	}
}

func TestCheckState(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, b []byte) *os.File {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	if err := CheckState(write("empty", nil)); err != nil {
		t.Errorf("an empty file (a new TPM) is refused: %v", err)
	}
	if err := CheckState(write("good", store(linearHdrSize+2048, slot{linearHdrSize, 1900, 2048}))); err != nil {
		t.Errorf("a good store is refused: %v", err)
	}
	garbage := []byte(strings.Repeat("not a tpm ", 50))
	f := write("garbage", garbage)
	err := CheckState(f)
	if err == nil || !strings.Contains(err.Error(), "not a TPM state of swtpm's: magic") {
		t.Errorf("garbage: error %v", err)
	}
	if b, _ := os.ReadFile(f.Name()); string(b) != string(garbage) {
		t.Error("garbage was changed")
	}
	big := write("big", nil)
	if err := os.Truncate(big.Name(), MaxStateSize+1); err != nil {
		t.Fatal(err)
	}
	if err := CheckState(big); err == nil || !strings.Contains(err.Error(), "more than") {
		t.Errorf("a file past MaxStateSize: error %v", err)
	}
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := CheckState(d); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("a directory: error %v", err)
	}
}

func TestArgs(t *testing.T) {
	got := strings.Join(Args("/vm/tpm2.state"), " ")
	for _, want := range []string{"socket --tpm2", "--ctrl type=unixio,clientfd=3", "--tpmstate backend-uri=file:///vm/tpm2.state", "--terminate", "--seccomp action=kill"} {
		if !strings.Contains(got, want) {
			t.Errorf("args %q lack %q", got, want)
		}
	}
}
