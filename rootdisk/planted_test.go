package rootdisk

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vmshim/vmshim/regfile/regfiletest"
	"github.com/vmshim/vmshim/tpm"
)

// plants are what another pod sharing the volume may leave at a name.
var plants = []struct {
	kind  string
	plant func(t *testing.T, p string)
	want  string // in the error
}{
	{"character device", func(t *testing.T, p string) {
		if os.Geteuid() != 0 {
			t.Skip("mknod needs root")
		}
		must(t, unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
	}, "not a regular file (character device)"},
	{"fifo", func(t *testing.T, p string) { must(t, unix.Mkfifo(p, 0o666)) }, "not a regular file (fifo)"},
	{"symlink", func(t *testing.T, p string) { must(t, os.Symlink("/dev/null", p)) }, "not a regular file (symlink)"},
	{"hard link", func(t *testing.T, p string) {
		other := filepath.Join(filepath.Dir(p), "other")
		must(t, os.WriteFile(other, nil, 0o600))
		must(t, os.Link(other, p))
	}, "a regular file with 2 links, not 1"},
}

// TestPlantedNames: a device node, fifo, symlink or hard link planted at
// any name the shim opens on the volume fails the create in one line, and
// the node is never opened (inotify sees no open of it).
func TestPlantedNames(t *testing.T) {
	ctx := context.Background()
	q := qemuImg(t)
	img := rawImage(t, "p", 1<<20)
	template := filepath.Join(t.TempDir(), "vars.fd")
	must(t, os.WriteFile(template, make([]byte, 4096), 0o644))
	for _, name := range []string{LockName, DiskName, MetaName, VarsName, tpm.StateName} {
		for _, p := range plants {
			t.Run(name+"/"+p.kind, func(t *testing.T) {
				dir := t.TempDir()
				if name == MetaName {
					// The record is read once there is a disk to keep.
					d := open(t, ctx, dir, img, Options{Img: q})
					d.File.Close()
					must(t, os.Remove(filepath.Join(dir, MetaName)))
				}
				p.plant(t, filepath.Join(dir, name))
				opens := regfiletest.WatchOpens(t, dir)
				var err error
				switch name {
				case tpm.StateName:
					var f *os.File
					if f, err = KeptOnDirectory(dir, "/data", name); err == nil {
						f.Close()
					}
				case VarsName:
					tf, terr := os.Open(template)
					must(t, terr)
					defer tf.Close()
					var f *os.File
					if f, err = VarsOnDirectory(dir, "/data", tf); err == nil {
						f.Close()
					}
				default:
					var d *Disk
					if d, err = OnDirectory(ctx, dir, "/data", img, Options{Img: q}); err == nil {
						d.File.Close()
					}
				}
				if err == nil || !strings.Contains(err.Error(), p.want) || !strings.Contains(err.Error(), name) ||
					!strings.HasPrefix(err.Error(), "root disk volume /data: ") || strings.Contains(err.Error(), "\n") {
					t.Fatalf("error %v, want one line naming %s: %s", err, name, p.want)
				}
				for _, o := range opens() {
					if o == name {
						t.Fatalf("%s (%s) was opened", name, p.kind)
					}
				}
				if fi, err := os.Lstat(filepath.Join(dir, name)); err != nil || fi.Mode().IsRegular() && p.kind != "hard link" {
					t.Fatalf("the planted %s is gone or replaced: %v", p.kind, err)
				}
			})
		}
	}
}
