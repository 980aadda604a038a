package cloudinit

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// seedCases are seeds of the sizes that matter: smaller than busybox's
// probe, typical, larger than minSeedSize, files of whole blocks and empty
// ones (go-diskfs writes a block of zeros after those), and no files.
func seedCases() []struct {
	name  string
	files map[string][]byte
} {
	return []struct {
		name  string
		files map[string][]byte
	}{
		{"tiny", map[string][]byte{SeedMetaData: []byte("instance-id: i\n")}},
		{"typical", seedFiles()},
		{"large", map[string][]byte{
			SeedMetaData: []byte("instance-id: i\n"),
			SeedUserData: []byte("#cloud-config\nruncmd:\n" + strings.Repeat("  - \"echo a line of a user-data larger than the minimum seed\"\n", 4000)),
		}},
		{"whole blocks", map[string][]byte{
			SeedMetaData:      bytes.Repeat([]byte("#"), 2*isoBlockSize),
			SeedNetworkConfig: {},
			SeedUserData:      bytes.Repeat([]byte("#"), isoBlockSize),
		}},
		{"no files", map[string][]byte{}},
	}
}

// writeSeedImage writes files with WriteSeed into a file of the test's and
// returns the file's path and contents.
func writeSeedImage(t testing.TB, files map[string][]byte) (string, []byte) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(t.TempDir(), "seed.iso"), os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := WriteSeed(f, files); err != nil {
		t.Fatalf("WriteSeed() error = %v", err)
	}
	img, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	return f.Name(), img
}

// TestSeedDescriptors checks the seed's volume descriptors byte by byte
// against ECMA-119: a primary descriptor with its identifiers padded with
// spaces (0x20), the label cidata, the volume space size the image's and
// no expiration date, then the terminator; no Joliet descriptor.
func TestSeedDescriptors(t *testing.T) {
	for _, tc := range seedCases() {
		t.Run(tc.name, func(t *testing.T) {
			_, img := writeSeedImage(t, tc.files)
			checkSeedImage(t, img)
			label, joliet, got := parseISO(t, img)
			if label != SeedLabel || joliet {
				t.Errorf("parseISO: label %q, Joliet %v; want %q, false", label, joliet, SeedLabel)
			}
			if !equalFiles(got, tc.files) {
				t.Errorf("Rock Ridge files = %q, want %q", names(got), names(tc.files))
			}
		})
	}
}

// TestSeedLabelBytes spells out the seed's label as it must read on disk.
func TestSeedLabelBytes(t *testing.T) {
	_, img := writeSeedImage(t, seedFiles())
	want := []byte("cidata                          ")
	if got := img[16*isoBlockSize+40 : 16*isoBlockSize+72]; !bytes.Equal(got, want) {
		t.Errorf("volume identifier\n% x\nwant\n% x", got, want)
	}
}

// checkSeedImage checks the size and the volume descriptor set of img,
// a seed WriteSeed wrote.
func checkSeedImage(t testing.TB, img []byte) {
	t.Helper()
	if len(img)%isoBlockSize != 0 || len(img) < minSeedSize {
		t.Fatalf("image of %d bytes: want whole %d-byte blocks, %d bytes at least", len(img), isoBlockSize, minSeedSize)
	}
	blocks := uint32(len(img) / isoBlockSize)
	vd := func(n int) []byte { return img[n*isoBlockSize : (n+1)*isoBlockSize] }
	for n, typ := range map[int]byte{16: 1, 17: 255} {
		if got := vd(n); got[0] != typ || string(got[1:6]) != "CD001" || got[6] != 1 {
			t.Fatalf("sector %d starts % x, want a type %d volume descriptor, version 1", n, got[:7], typ)
		}
	}
	pvd := vd(16)
	checkSeedText(t, pvd)
	if le, be := binary.LittleEndian.Uint32(pvd[80:84]), binary.BigEndian.Uint32(pvd[84:88]); le != blocks || be != blocks {
		t.Errorf("volume space size %d (LE), %d (BE); want %d", le, be, blocks)
	}
	for _, date := range []struct {
		field string
		off   int
	}{{"creation", 813}, {"modification", 830}, {"effective", 864}} {
		if b := pvd[date.off : date.off+16]; strings.Trim(string(b), "0123456789") != "" || string(b) == strings.Repeat("0", 16) {
			t.Errorf("%s date %q is not a date", date.field, b)
		}
	}
	if got := pvd[847:864]; string(got) != "0000000000000000\x00" {
		t.Errorf("expiration date % x, want unstated (sixteen '0' and 0x00)", got)
	}
	if pvd[881] != 1 {
		t.Errorf("file structure version %d, want 1", pvd[881])
	}
}

// aChars and dChars are ECMA-119's a-characters and d-characters (7.4).
const (
	dChars = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_"
	aChars = dChars + " !\"%&'()*+,-./:;<=>?"
)

// checkSeedText checks each text field of the primary descriptor pvd byte
// by byte: the value the seed holds, then spaces to the field's end.
func checkSeedText(t testing.TB, pvd []byte) {
	t.Helper()
	for _, f := range []struct {
		field     string
		off, size int
		value     string
		chars     string // what ECMA-119 allows in the value
	}{
		{"system identifier", 8, 32, "", aChars},
		{"volume identifier", 40, 32, SeedLabel, "abcdefghijklmnopqrstuvwxyz"}, // lower case: NoCloud's label
		{"volume set identifier", 190, 128, "", dChars},
		{"publisher identifier", 318, 128, "", aChars},
		{"data preparer identifier", 446, 128, seedPreparer, aChars},
		{"application identifier", 574, 128, "", aChars},
		{"copyright file identifier", 702, 37, "", dChars},
		{"abstract file identifier", 739, 37, "", dChars},
		{"bibliographic file identifier", 776, 37, "", dChars},
	} {
		if strings.Trim(f.value, f.chars) != "" {
			t.Errorf("%s %q has characters ECMA-119 does not allow there", f.field, f.value)
		}
		want := append([]byte(f.value), bytes.Repeat([]byte{0x20}, f.size-len(f.value))...)
		if got := pvd[f.off : f.off+f.size]; !bytes.Equal(got, want) {
			t.Errorf("%s at %d:\n% x\nwant\n% x", f.field, f.off, got, want)
		}
	}
}

// equalFiles reports whether a and b hold the same names and contents.
func equalFiles(a, b map[string][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for n, data := range a {
		if other, ok := b[n]; !ok || !bytes.Equal(data, other) {
			return false
		}
	}
	return true
}

// TestPadSeed checks the seed grows to whole blocks and minSeedSize, and
// a larger one only to whole blocks.
func TestPadSeed(t *testing.T) {
	for _, tc := range []struct {
		size, want int64
	}{
		{0, minSeedSize},
		{64 << 10, minSeedSize},
		{minSeedSize - 1, minSeedSize},
		{minSeedSize, minSeedSize},
		{minSeedSize + 1, minSeedSize + isoBlockSize},
		{1 << 20, 1 << 20},
	} {
		f, err := os.Create(filepath.Join(t.TempDir(), "seed.iso"))
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Truncate(tc.size); err != nil {
			t.Fatal(err)
		}
		blocks, err := padSeed(f)
		st, serr := f.Stat()
		f.Close()
		if err != nil || serr != nil {
			t.Fatalf("padSeed(%d bytes) error = %v, %v", tc.size, err, serr)
		}
		if st.Size() != tc.want || int64(blocks)*isoBlockSize != tc.want {
			t.Errorf("padSeed(%d bytes) = %d blocks, file %d bytes; want %d bytes", tc.size, blocks, st.Size(), tc.want)
		}
	}
}

// TestStandardizeDescriptorErrors checks an image whose volume descriptor
// set is not a primary descriptor and the terminator is refused with a
// one-line error and left as it was.
func TestStandardizeDescriptorErrors(t *testing.T) {
	vd := func(typ byte) []byte {
		b := make([]byte, isoBlockSize)
		b[0] = typ
		copy(b[1:], "CD001\x01")
		return b
	}
	system := make([]byte, 16*isoBlockSize)
	for _, tc := range []struct {
		name, want string
		img        [][]byte
	}{
		{"empty", "read volume descriptor at sector 16: EOF", nil},
		{"no descriptor", "sector 16 is not a volume descriptor of type 1", [][]byte{system, make([]byte, isoBlockSize)}},
		{"terminator only", "sector 16 is not a volume descriptor of type 1", [][]byte{system, vd(255)}},
		{"Joliet", "sector 17 is not a volume descriptor of type 255", [][]byte{system, vd(1), vd(2), vd(255)}},
		{"cut short", "read volume descriptor at sector 17: EOF", [][]byte{system, vd(1)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			img := bytes.Join(tc.img, nil)
			path := filepath.Join(t.TempDir(), "seed.iso")
			if err := os.WriteFile(path, img, 0o600); err != nil {
				t.Fatal(err)
			}
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			err = standardizeDescriptor(f, 64)
			if err == nil || err.Error() != tc.want {
				t.Errorf("standardizeDescriptor() error = %v, want %q", err, tc.want)
			}
			if got, _ := os.ReadFile(path); !bytes.Equal(got, img) {
				t.Errorf("the image was changed")
			}
		})
	}
}
