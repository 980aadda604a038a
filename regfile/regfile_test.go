package regfile

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/vmshim/vmshim/regfile/regfiletest"
)

// planted makes a file of each kind a hostile writer could leave at a
// name in dir, and returns their names by kind; device nodes only as root.
func planted(t *testing.T, dir string) map[string]string {
	t.Helper()
	target := filepath.Join(t.TempDir(), "target")
	if err := os.WriteFile(target, []byte("host file\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	names := map[string]string{}
	mk := func(kind string, make func(p string) error) {
		p := filepath.Join(dir, strings.ReplaceAll(kind, " ", "-"))
		if err := make(p); err != nil {
			t.Fatalf("make %s: %v", kind, err)
		}
		names[kind] = filepath.Base(p)
	}
	mk("fifo", func(p string) error { return unix.Mkfifo(p, 0o644) })
	mk("symlink", func(p string) error { return os.Symlink(target, p) })
	mk("hard link", func(p string) error { return os.Link(target, p) })
	mk("directory", func(p string) error { return os.Mkdir(p, 0o755) })
	if os.Geteuid() == 0 {
		mk("character device", func(p string) error { return unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))) })
		mk("block device", func(p string) error { return unix.Mknod(p, unix.S_IFBLK|0o600, int(unix.Mkdev(7, 0))) })
	}
	return names
}

func TestOpenatRefusesPlanted(t *testing.T) {
	dir := t.TempDir()
	names := planted(t, dir)
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	opens := regfiletest.WatchOpens(t, dir)
	for kind, name := range names {
		for _, o := range []Options{
			{Flags: unix.O_RDWR | unix.O_NONBLOCK, OneLink: true, Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS},
			{Flags: unix.O_RDONLY, OneLink: true},
		} {
			f, err := Openat(int(d.Fd()), name, o)
			if err == nil {
				f.Close()
				t.Errorf("%s: opened", kind)
				continue
			}
			var nr *NotRegularError
			switch {
			case kind == "symlink" && o.Resolve != 0 && errors.Is(err, unix.ELOOP):
			case !errors.As(err, &nr) || !errors.Is(err, errdefs.ErrInvalidArgument) || strings.Contains(err.Error(), "\n"):
				t.Errorf("%s: error %v, want a NotRegularError", kind, err)
			case kind == "hard link" && nr.Links != 2, kind != "hard link" && nr.Kind != kind:
				t.Errorf("%s: %v", kind, err)
			}
		}
	}
	if got := opens(); len(got) != 0 {
		t.Errorf("planted files were opened: %q", got)
	}
	// The hard link is a regular file: it opens when one link is not asked for.
	f, err := Openat(int(d.Fd()), names["hard link"], Options{Flags: unix.O_RDONLY})
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if _, err := Openat(int(d.Fd()), "missing", Options{}); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
	if _, err := Openat(int(d.Fd()), "new", Options{Flags: unix.O_RDWR | unix.O_CREAT}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("O_CREAT: %v", err)
	}
}

func TestOpenatBeneath(t *testing.T) {
	dir := t.TempDir()
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	for _, name := range []string{"../x", "/etc/hostname"} {
		if f, err := Openat(int(d.Fd()), name, Options{Resolve: unix.RESOLVE_BENEATH}); err == nil {
			f.Close()
			t.Errorf("%s: opened outside the directory", name)
		}
	}
}

func TestReadFile(t *testing.T) {
	dir := t.TempDir()
	names := planted(t, dir)
	opens := regfiletest.WatchOpens(t, dir)
	for kind, name := range names {
		p := filepath.Join(dir, name)
		_, err := ReadFile(p, 64)
		if kind == "hard link" {
			if err != nil {
				t.Errorf("a regular file with two links: %v", err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), kind) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: error %v, want one line naming %s and its kind", kind, err, p)
		}
	}
	if got := opens(); len(got) != 1 || got[0] != names["hard link"] {
		t.Errorf("opened %q, want the regular file alone", got)
	}

	p := filepath.Join(dir, "small")
	if err := os.WriteFile(p, []byte("vm-pod\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := ReadFile(p, 7); err != nil || string(b) != "vm-pod\n" {
		t.Errorf("ReadFile = %q, %v", b, err)
	}
	if _, err := ReadFile(p, 6); !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), p) {
		t.Errorf("a file over the limit: %v", err)
	}
	if _, err := ReadFile(filepath.Join(dir, "missing"), 6); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
	// A sparse file of 4 GiB: refused having read max+1 bytes.
	huge := filepath.Join(dir, "huge")
	if err := os.WriteFile(huge, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(huge, 4<<30); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadFile(huge, 64<<10); !errors.Is(err, ErrTooLarge) {
		t.Errorf("sparse 4 GiB file: %v", err)
	}
}
