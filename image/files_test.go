package image

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"syscall"
	"testing"

	"github.com/containerd/errdefs"
)

// tree lists every path under dir with its type and, for files, content,
// so a test can tell whether anything under it changed.
func tree(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		v := fi.Mode().String()
		switch {
		case fi.Mode().IsRegular():
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			v += " " + string(data)
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			v += " -> " + target
		}
		out[p] = v
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestMakeFilesDir(t *testing.T) {
	root := layout(t, map[string]string{"/disk/vm.qcow2": qcow2Header})
	d, err := MakeFilesDir(root)
	if err != nil {
		t.Fatalf("MakeFilesDir() error = %v", err)
	}
	defer d.Close()
	want := filepath.Join(root, FilesDirName)
	if d.Path() != want {
		t.Errorf("Path() = %q, want %q", d.Path(), want)
	}
	fi, err := os.Lstat(want)
	if err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
		t.Fatalf("made %v, %v; want a directory of mode 0700", fi, err)
	}
	for _, name := range []string{OverlayName, SeedName} {
		f, err := d.Create(name)
		if err != nil {
			t.Fatalf("Create(%s) error = %v", name, err)
		}
		if f.Name() != filepath.Join(want, name) {
			t.Errorf("Create(%s) names its file %q", name, f.Name())
		}
		if _, err := f.WriteString("data"); err != nil {
			t.Errorf("Create(%s): file not writable: %v", name, err)
		}
		if _, err := f.ReadAt(make([]byte, 4), 0); err != nil {
			t.Errorf("Create(%s): file not readable: %v", name, err)
		}
		f.Close()
		fi, err := os.Lstat(filepath.Join(want, name))
		if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o600 {
			t.Errorf("Create(%s) made %v, %v; want a regular file of mode 0600", name, fi, err)
		}
	}
}

// TestMakeFilesDirRefuses checks an image that has the name is refused,
// and what it has there is left as it was, and whatever it leads to.
func TestMakeFilesDirRefuses(t *testing.T) {
	host := t.TempDir()
	if err := os.WriteFile(filepath.Join(host, "host-file"), []byte("host"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(t.TempDir(), "missing")
	tests := []struct {
		name  string
		files map[string]string
		kind  string
	}{
		{"symlink to a host dir", map[string]string{"/" + FilesDirName: "->" + host}, "symlink"},
		{"dotdot symlink to a host dir", map[string]string{"/" + FilesDirName: "->../../../../../../../.." + host}, "symlink"},
		{"dangling symlink to a host path", map[string]string{"/" + FilesDirName: "->" + missing}, "symlink"},
		{"symlink inside the image", map[string]string{"/" + FilesDirName: "->/var", "/var/": ""}, "symlink"},
		{"regular file", map[string]string{"/" + FilesDirName: "image's file"}, "file"},
		{"directory", map[string]string{"/" + FilesDirName + "/root.qcow2": "image's overlay"}, "directory"},
		{"empty directory", map[string]string{"/" + FilesDirName + "/": ""}, "directory"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := layout(t, tc.files)
			before, hostBefore := tree(t, root), tree(t, host)
			d, err := MakeFilesDir(root)
			if err == nil {
				d.Close()
				t.Fatal("MakeFilesDir() succeeded")
			}
			want := "image has /" + FilesDirName + " (" + tc.kind + "): the name is reserved for the files vmshim makes for the VM"
			if err.Error() != want || !errdefs.IsInvalidArgument(err) {
				t.Fatalf("MakeFilesDir() error = %v, want invalid argument %q", err, want)
			}
			if after := tree(t, root); !reflect.DeepEqual(after, before) {
				t.Errorf("rootfs changed:\n%q\nwant\n%q", after, before)
			}
			if after := tree(t, host); !reflect.DeepEqual(after, hostBefore) {
				t.Errorf("host dir changed:\n%q\nwant\n%q", after, hostBefore)
			}
			if _, err := os.Lstat(missing); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("the dangling symlink's target was made: %v", err)
			}
		})
	}
}

func TestMakeFilesDirBadRootfs(t *testing.T) {
	if _, err := MakeFilesDir("relative/rootfs"); !errdefs.IsInvalidArgument(err) {
		t.Errorf("MakeFilesDir(relative) error = %v, want invalid argument", err)
	}
	if _, err := MakeFilesDir(filepath.Join(t.TempDir(), "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("MakeFilesDir(missing) error = %v, want not exist", err)
	}
}

// TestFilesDirCreate checks Create makes only new files, through the
// directory it made, and never follows a symlink.
func TestFilesDirCreate(t *testing.T) {
	hostFile := filepath.Join(t.TempDir(), "host-file")
	if err := os.WriteFile(hostFile, []byte("host"), 0o644); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(t.TempDir(), "missing")
	tests := []struct {
		name  string
		plant func(t *testing.T, p string) // puts something at the name before Create
	}{
		{"existing file", func(t *testing.T, p string) {
			if err := os.WriteFile(p, []byte("keep me"), 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{"symlink to a host file", func(t *testing.T, p string) {
			if err := os.Symlink(hostFile, p); err != nil {
				t.Fatal(err)
			}
		}},
		{"dangling symlink to a host path", func(t *testing.T, p string) {
			if err := os.Symlink(missing, p); err != nil {
				t.Fatal(err)
			}
		}},
		{"directory", func(t *testing.T, p string) {
			if err := os.Mkdir(p, 0o700); err != nil {
				t.Fatal(err)
			}
		}},
		{"fifo", func(t *testing.T, p string) {
			if err := syscall.Mkfifo(p, 0o600); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := layout(t, nil)
			d, err := MakeFilesDir(root)
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			tc.plant(t, filepath.Join(d.Path(), OverlayName))
			before, hostBefore := tree(t, root), tree(t, filepath.Dir(hostFile))
			f, err := d.Create(OverlayName)
			if err == nil {
				f.Close()
				t.Fatal("Create() of an existing name succeeded")
			}
			if !errors.Is(err, fs.ErrExist) || !strings.HasPrefix(err.Error(), "create "+filepath.Join(d.Path(), OverlayName)+": ") {
				t.Fatalf("Create() error = %v, want it to exist already", err)
			}
			if after := tree(t, root); !reflect.DeepEqual(after, before) {
				t.Errorf("rootfs changed:\n%q\nwant\n%q", after, before)
			}
			if after := tree(t, filepath.Dir(hostFile)); !reflect.DeepEqual(after, hostBefore) {
				t.Errorf("host file changed: %q", after)
			}
			if _, err := os.Lstat(missing); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("the dangling symlink's target was made: %v", err)
			}
		})
	}
}

// TestFilesDirCreateThroughDir checks Create makes its files in the
// directory MakeFilesDir made even when the image's path to it has been
// redirected since.
func TestFilesDirCreateThroughDir(t *testing.T) {
	root := layout(t, nil)
	host := t.TempDir()
	d, err := MakeFilesDir(root)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	moved := filepath.Join(root, "moved")
	if err := os.Rename(d.Path(), moved); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(host, d.Path()); err != nil {
		t.Fatal(err)
	}
	f, err := d.Create(SeedName)
	if err != nil {
		t.Fatalf("Create() error = %v", err)
	}
	f.Close()
	if _, err := os.Lstat(filepath.Join(moved, SeedName)); err != nil {
		t.Errorf("file not made in the directory MakeFilesDir made: %v", err)
	}
	if entries, _ := os.ReadDir(host); len(entries) != 0 {
		t.Errorf("file made through the symlink, in the host dir: %v", entries)
	}
}

func TestRemoveFilesDir(t *testing.T) {
	files := map[string]string{
		"/disk/vm.qcow2": qcow2Header, "/etc/hostname": "vm", "/" + FilesDirName + "-other/keep": "x", "/var/" + FilesDirName + "/keep": "x",
	}
	root := layout(t, files)
	before := tree(t, root)
	d, err := MakeFilesDir(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{OverlayName, SeedName} {
		f, err := d.Create(name)
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	// The directory need not be closed first: a crashed shim's never is.
	defer d.Close()
	if err := RemoveFilesDir(root); err != nil {
		t.Fatalf("RemoveFilesDir() error = %v", err)
	}
	if after := tree(t, root); !reflect.DeepEqual(after, before) {
		t.Errorf("rootfs after RemoveFilesDir:\n%q\nwant\n%q", keys(after), keys(before))
	}
	// Removed already, and a rootfs that is gone (unmounted, deleted):
	// both are done.
	if err := RemoveFilesDir(root); err != nil {
		t.Errorf("second RemoveFilesDir() error = %v", err)
	}
	if err := RemoveFilesDir(filepath.Join(t.TempDir(), "gone")); err != nil {
		t.Errorf("RemoveFilesDir(missing rootfs) error = %v", err)
	}
	if err := RemoveFilesDir("relative"); !errdefs.IsInvalidArgument(err) {
		t.Errorf("RemoveFilesDir(relative) error = %v, want invalid argument", err)
	}
}

// TestRemoveFilesDirNeverFollows checks a /.vmshim that is not the
// directory MakeFilesDir made (swapped for a symlink to a host directory
// since, say) is not removed, nor anything it leads to.
func TestRemoveFilesDirNeverFollows(t *testing.T) {
	host := t.TempDir()
	if err := os.WriteFile(filepath.Join(host, OverlayName), []byte("host"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		files map[string]string
	}{
		{"symlink to a host dir", map[string]string{"/" + FilesDirName: "->" + host}},
		{"regular file", map[string]string{"/" + FilesDirName: "image's"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := layout(t, tc.files)
			before, hostBefore := tree(t, root), tree(t, host)
			if err := RemoveFilesDir(root); err == nil {
				t.Error("RemoveFilesDir() succeeded")
			}
			if after := tree(t, root); !reflect.DeepEqual(after, before) {
				t.Errorf("rootfs changed: %q", after)
			}
			if after := tree(t, host); !reflect.DeepEqual(after, hostBefore) {
				t.Errorf("host dir changed: %q", after)
			}
		})
	}
}

func keys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
