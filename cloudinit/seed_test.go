package cloudinit

import (
	"bytes"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/diskfs/go-diskfs/backend/file"
	"github.com/diskfs/go-diskfs/filesystem/iso9660"

	"github.com/vmshim/vmshim/image"
)

// seedFiles is a typical seed, with a user-data spanning several blocks.
func seedFiles() map[string][]byte {
	return map[string][]byte{
		SeedMetaData:      []byte("instance-id: \"i-1\"\nlocal-hostname: \"vm1\"\n"),
		SeedUserData:      []byte("#cloud-config\nruncmd:\n" + strings.Repeat("  - \"echo a long line to span blocks\"\n", 200)),
		SeedNetworkConfig: []byte("version: 2\n"),
	}
}

// newSeed makes the seed file as the shim does, in the VM's files
// directory of a rootfs, and points TMPDIR, where WriteSeed keeps its
// scratch files, at a directory of the test's.
func newSeed(t *testing.T) (f *os.File, tmp string) {
	t.Helper()
	tmp = t.TempDir()
	t.Setenv("TMPDIR", tmp)
	d, err := image.MakeFilesDir(rootfs(t))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if f, err = d.Create(image.SeedName); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f, tmp
}

// rootfs is an empty container root filesystem.
func rootfs(t *testing.T) string {
	t.Helper()
	root := filepath.Join(t.TempDir(), "rootfs")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	return root
}

// TestWriteSeed writes a seed as the shim does and reads it back raw, with
// go-diskfs and with blkid; it leaves no scratch files.
func TestWriteSeed(t *testing.T) {
	f, tmp := newSeed(t)
	path := f.Name()
	dir := filepath.Dir(path)
	files := seedFiles()
	if err := WriteSeed(f, files); err != nil {
		t.Fatalf("WriteSeed() error = %v", err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("mode = %v, want 0600", st.Mode().Perm())
	}
	if st.Size()%isoBlockSize != 0 {
		t.Errorf("size %d is not whole %d-byte blocks", st.Size(), isoBlockSize)
	}
	assertOnly(t, dir, image.SeedName)
	assertOnly(t, tmp)
	img, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("raw", func(t *testing.T) {
		label, joliet, got := parseISO(t, img)
		if label != SeedLabel {
			t.Errorf("volume identifier = %q, want %q", label, SeedLabel)
		}
		if joliet {
			t.Errorf("a Joliet volume descriptor: the seed's names are Rock Ridge's")
		}
		if !reflect.DeepEqual(got, files) {
			t.Errorf("Rock Ridge files = %q, want %q", names(got), names(files))
		}
	})
	t.Run("go-diskfs", func(t *testing.T) {
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		fs, err := iso9660.Read(file.New(f, true), st.Size(), 0, isoBlockSize)
		if err != nil {
			t.Fatalf("read iso9660: %v", err)
		}
		if label := strings.TrimRight(fs.Label(), " "); label != SeedLabel {
			t.Errorf("Label() = %q, want %q", label, SeedLabel)
		}
		entries, err := fs.ReadDir(".")
		if err != nil {
			t.Fatal(err)
		}
		got := map[string][]byte{}
		for _, e := range entries {
			if got[e.Name()], err = fs.ReadFile(e.Name()); err != nil {
				t.Fatalf("read %s: %v", e.Name(), err)
			}
		}
		if !reflect.DeepEqual(got, files) {
			t.Errorf("files = %q, want %q", names(got), names(files))
		}
	})
	t.Run("blkid", func(t *testing.T) {
		blkid, err := exec.LookPath("blkid")
		if err != nil {
			t.Skip("no blkid")
		}
		for tag, want := range map[string]string{"LABEL": SeedLabel, "TYPE": "iso9660"} {
			out, err := exec.Command(blkid, "-p", "-o", "value", "-s", tag, path).Output()
			if err != nil {
				t.Fatalf("blkid -s %s: %v", tag, err)
			}
			if got := strings.TrimSpace(string(out)); got != want {
				t.Errorf("blkid %s = %q, want %q", tag, got, want)
			}
		}
	})
}

// TestWriteSeedThroughFile checks WriteSeed writes only through its
// file: its path, now leading elsewhere, is not used.
func TestWriteSeedThroughFile(t *testing.T) {
	f, tmp := newSeed(t)
	path := f.Name()
	host := filepath.Join(t.TempDir(), "host-file")
	if err := os.WriteFile(host, []byte("host"), 0o644); err != nil {
		t.Fatal(err)
	}
	moved := path + ".moved"
	if err := os.Rename(path, moved); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(host, path); err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{SeedMetaData: []byte("instance-id: \"i-2\"\n"), SeedUserData: []byte("#cloud-config\n{}\n")}
	if err := WriteSeed(f, files); err != nil {
		t.Fatalf("WriteSeed() error = %v", err)
	}
	img, err := os.ReadFile(moved)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, got := parseISO(t, img); !reflect.DeepEqual(got, files) {
		t.Errorf("files = %q, want %q", got, files)
	}
	if data, _ := os.ReadFile(host); string(data) != "host" {
		t.Errorf("the file at the seed's path was written: %q", data)
	}
	assertOnly(t, filepath.Dir(path), image.SeedName, image.SeedName+".moved")
	assertOnly(t, tmp)
}

// TestWriteSeedErrors checks bad file names and a read-only file fail and
// leave the seed empty.
func TestWriteSeedErrors(t *testing.T) {
	f, tmp := newSeed(t)
	for _, name := range []string{"", "a/b", ".", "..", "a\x00"} {
		err := WriteSeed(f, map[string][]byte{name: nil})
		if !errdefs.IsInvalidArgument(err) {
			t.Errorf("WriteSeed(%q) error = %v, want invalid argument", name, err)
		}
	}
	ro, err := os.Open(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	if err := WriteSeed(ro, seedFiles()); err == nil {
		t.Errorf("WriteSeed() into a read-only file succeeded")
	}
	if st, err := os.Stat(f.Name()); err != nil || st.Size() != 0 {
		t.Errorf("seed after failures: %v, %v; want it empty", st, err)
	}
	assertOnly(t, filepath.Dir(f.Name()), image.SeedName)
	assertOnly(t, tmp)
}

// assertOnly checks dir holds exactly the named entries (no temp files).
func assertOnly(t *testing.T, dir string, want ...string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		got = append(got, e.Name())
	}
	if !reflect.DeepEqual(got, want) && (len(got) > 0 || len(want) > 0) {
		t.Errorf("%s holds %q, want %q", dir, got, want)
	}
}

// names returns the sorted names of files.
func names(files map[string][]byte) []string {
	var out []string
	for n := range files {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// parseISO reads an ISO9660 image without go-diskfs: the primary volume
// identifier, whether a Joliet descriptor is present, and the root
// directory's regular files by their Rock Ridge (NM) names.
func parseISO(t *testing.T, img []byte) (label string, joliet bool, files map[string][]byte) {
	t.Helper()
	sector := func(n uint32) []byte {
		off := int(n) * isoBlockSize
		if off+isoBlockSize > len(img) {
			t.Fatalf("sector %d is past the end of the image (%d bytes)", n, len(img))
		}
		return img[off : off+isoBlockSize]
	}
	var pvd []byte
	for n := uint32(16); ; n++ {
		vd := sector(n)
		if string(vd[1:6]) != "CD001" {
			t.Fatalf("sector %d is not a volume descriptor", n)
		}
		switch vd[0] {
		case 1:
			pvd = vd
		case 2:
			esc := string(vd[88:91])
			joliet = joliet || esc == "%/@" || esc == "%/C" || esc == "%/E"
		}
		if vd[0] == 255 {
			break
		}
	}
	if pvd == nil {
		t.Fatal("no primary volume descriptor")
	}
	// The standard pads with spaces; TestSeedDescriptors checks each byte.
	label = strings.TrimRight(string(pvd[40:72]), " ")
	root := pvd[156:190]
	extent, size := binary.LittleEndian.Uint32(root[2:]), binary.LittleEndian.Uint32(root[10:])
	files = map[string][]byte{}
	for off := uint32(0); off < size; {
		rec := img[int(extent)*isoBlockSize+int(off):]
		if rec[0] == 0 { // records do not cross sectors
			off = (off/isoBlockSize + 1) * isoBlockSize
			continue
		}
		n := uint32(rec[0])
		rec, off = rec[:n], off+n
		nameLen := int(rec[32])
		if rec[25]&2 != 0 { // directory, including . and ..
			continue
		}
		su := rec[33+nameLen+(1-nameLen%2):]
		var name []byte
		for len(su) >= 4 && su[2] >= 4 && int(su[2]) <= len(su) {
			if string(su[:2]) == "NM" {
				name = append(name, su[5:su[2]]...)
			}
			su = su[su[2]:]
		}
		if name == nil {
			t.Fatalf("file %q has no Rock Ridge name", rec[33:33+nameLen])
		}
		start, length := binary.LittleEndian.Uint32(rec[2:]), binary.LittleEndian.Uint32(rec[10:])
		files[string(name)] = bytes.Clone(img[int(start)*isoBlockSize : int(start)*isoBlockSize+int(length)])
	}
	return label, joliet, files
}
