package image

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/containerd/errdefs"
	securejoin "github.com/cyphar/filepath-securejoin"
	"golang.org/x/sys/unix"

	"github.com/vmshim/vmshim/regfile"
)

// Disk formats Find pins; QEMU is always told the format, never left to probe it.
const (
	FormatQCOW2 = "qcow2"
	FormatRaw   = "raw"
)

// Boot says how the VM in a rootfs boots. Paths are absolute host paths
// inside rootfs, kept to name the files; the files themselves are open,
// and only the open files are used: a path is never resolved again.
// For a pointer image only URL, SHA256 and Root are set.
type Boot struct {
	Disk   string // disk image, or "" for kernel boot and for a pointer image
	Format string // "qcow2" | "raw" (pinned, from the file's header — never probed by QEMU)
	Kernel string // kernel for direct boot (when Disk == "" and URL == "")
	Initrd string // optional
	Root   string // the rootfs the paths were found in; used to name files in errors

	// URL and SHA256 are set for a pointer image (see PointerURLFile): the
	// disk is to be downloaded from URL, an http or https URL, and must
	// have the sha256 digest SHA256, 64 lowercase hex digits. Both are
	// checked for syntax only (ParsePointer); nothing is downloaded.
	URL, SHA256 string

	// ISO is an installer's ISO image (/disk/*.iso): the VM boots it from
	// a CD-ROM and installs onto an empty root disk. Disk is then "".
	ISO string

	// DiskFile, KernelFile, InitrdFile and ISOFile are the files above,
	// open read-only; nil where the path is "".
	DiskFile, KernelFile, InitrdFile, ISOFile *os.File
}

// Close closes the boot files.
func (b *Boot) Close() error {
	var errs []error
	for _, f := range []*os.File{b.DiskFile, b.KernelFile, b.InitrdFile, b.ISOFile} {
		if f != nil {
			errs = append(errs, f.Close())
		}
	}
	return errors.Join(errs...)
}

// noDisk is the message of the error Find returns when the rootfs holds no VM.
const noDisk = "no VM disk in image: expected a disk file under /disk/ or at /, or a kernel under /boot/"

// ErrNoVM is the error Find returns, errdefs.ErrNotFound as well, when the
// rootfs holds no VM: the image is an ordinary container's.
var ErrNoVM = errdefs.ErrNotFound.WithMessage(noDisk)

// Find looks for the VM in rootfs: one disk file under /disk/, or the two
// files of a pointer image there (PointerURLFile and PointerSHA256File, and
// nothing else but hidden files), else one disk at / (*.qcow2, *.img,
// *.raw), else a kernel (and optional initrd) under /boot/. Symlinks are
// resolved inside rootfs, the final file must be a regular file, and it is
// opened (see Boot); the caller closes the Boot. A pointer image's files
// are read, checked with ParsePointer and closed: its Boot has no file.
func Find(rootfs string) (*Boot, error) {
	if !filepath.IsAbs(rootfs) {
		return nil, invalidf("rootfs %q: not an absolute path", rootfs)
	}
	root := filepath.Clean(rootfs)
	if fi, err := os.Stat(root); err != nil || !fi.IsDir() {
		return nil, notFoundf("rootfs %s: not a directory", root)
	}
	layouts := []struct {
		dir   string
		match func(string) bool
	}{
		{"/disk", func(string) bool { return true }},
		{"/", func(name string) bool {
			return strings.HasSuffix(name, ".qcow2") || strings.HasSuffix(name, ".img") || strings.HasSuffix(name, ".raw")
		}},
	}
	for _, l := range layouts {
		found, err := candidates(root, l.dir, l.match)
		if err != nil {
			return nil, err
		}
		if l.dir == "/disk" && slices.ContainsFunc(found, isPointerFile) {
			return findPointer(root, found)
		}
		switch len(found) {
		case 0:
			continue
		case 1:
			if l.dir == "/disk" && isInstallerISO(found[0]) {
				return findISO(root, found[0])
			}
			return findDisk(root, found[0])
		default:
			return nil, invalidf("more than one disk file in image: %s", strings.Join(found, ", "))
		}
	}
	return findKernel(root)
}

// isInstallerISO reports whether the one file of /disk is an installer's
// ISO image (*.iso, in any case), which boots from a CD-ROM onto an empty
// root disk.
func isInstallerISO(rel string) bool {
	return strings.HasSuffix(strings.ToLower(rel), ".iso")
}

// findISO opens the installer ISO at rel.
func findISO(root, rel string) (*Boot, error) {
	p, f, err := resolveNonEmpty(root, "installer ISO", rel)
	if err != nil {
		return nil, err
	}
	return &Boot{ISO: p, ISOFile: f, Root: root}, nil
}

// findDisk opens the disk at rel and pins its format from the header.
func findDisk(root, rel string) (*Boot, error) {
	p, f, err := resolveFile(root, "disk", rel)
	if err != nil {
		return nil, err
	}
	format, err := detectFile(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("disk %s: %w", rel, err)
	}
	return &Boot{Disk: p, Format: format, Root: root, DiskFile: f}, nil
}

// findKernel looks under /boot/, preferring an uncompressed vmlinux.
func findKernel(root string) (*Boot, error) {
	var kernel string
	for _, prefix := range []string{"vmlinux", "vmlinuz", "bzImage"} {
		found, err := candidates(root, "/boot", prefixMatch(prefix))
		if err != nil {
			return nil, err
		}
		if len(found) > 1 {
			return nil, invalidf("more than one kernel in image: %s", strings.Join(found, ", "))
		}
		if len(found) == 1 {
			kernel = found[0]
			break
		}
	}
	if kernel == "" {
		return nil, ErrNoVM
	}
	b := &Boot{Root: root}
	var err error
	if b.Kernel, b.KernelFile, err = resolveNonEmpty(root, "kernel", kernel); err != nil {
		return nil, err
	}
	initrds, err := candidates(root, "/boot", func(name string) bool {
		return strings.HasPrefix(name, "initrd") || strings.HasPrefix(name, "initramfs")
	})
	if err != nil {
		b.Close()
		return nil, err
	}
	switch len(initrds) {
	case 0:
	case 1:
		if b.Initrd, b.InitrdFile, err = resolveNonEmpty(root, "initrd", initrds[0]); err != nil {
			b.Close()
			return nil, err
		}
	default:
		b.Close()
		return nil, invalidf("more than one initrd in image: %s", strings.Join(initrds, ", "))
	}
	return b, nil
}

func prefixMatch(prefix string) func(string) bool {
	return func(name string) bool { return strings.HasPrefix(name, prefix) }
}

// candidates lists, as rootfs-relative paths, the non-hidden entries of dir
// (itself resolved inside root) whose names match. A missing dir gives none.
func candidates(root, dir string, match func(string) bool) ([]string, error) {
	p, err := securejoin.SecureJoin(root, dir)
	if err != nil {
		return nil, invalidf("image %s: %v", dir, pathErr(err))
	}
	fi, err := os.Lstat(p)
	if errors.Is(err, fs.ErrNotExist) || (err == nil && !fi.IsDir()) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", dir, pathErr(err))
	}
	entries, err := os.ReadDir(p)
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", dir, pathErr(err))
	}
	var out []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") || !match(e.Name()) {
			continue
		}
		out = append(out, path.Join(dir, e.Name()))
	}
	sort.Strings(out)
	return out, nil
}

// resolveFile opens rel, resolved inside root, and requires a regular
// file. It returns the file's host path, for names, and the file, open
// read-only. The path is resolved once, by openat2 with the rootfs as the
// root of the resolution, and the file is opened by its descriptor after
// its type was checked, so no special file is ever opened and no symlink
// leads out of the image.
func resolveFile(root, what, rel string) (string, *os.File, error) {
	p, err := securejoin.SecureJoin(root, rel)
	if err != nil {
		return "", nil, invalidf("%s %s: %v", what, rel, pathErr(err))
	}
	dir, err := openRoot(root)
	if err != nil {
		return "", nil, fmt.Errorf("%s %s: %w", what, rel, err)
	}
	defer dir.Close()
	f, err := regfile.Openat(int(dir.Fd()), strings.TrimPrefix(rel, "/"), regfile.Options{
		Flags:   os.O_RDONLY,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
		Follow:  true,
	})
	var nr *regfile.NotRegularError
	switch {
	case errors.Is(err, unix.ENOENT):
		return "", nil, notFoundf("%s %s: points to %s, which is not in the image", what, rel, relTo(root, p))
	case errors.As(err, &nr):
		return "", nil, invalidf("%s %s: %v", what, rel, nr)
	case err != nil:
		return "", nil, fmt.Errorf("%s %s: %w", what, rel, err)
	}
	return p, f, nil
}

// resolveNonEmpty is resolveFile for a file that must not be empty.
func resolveNonEmpty(root, what, rel string) (string, *os.File, error) {
	p, f, err := resolveFile(root, what, rel)
	if err != nil {
		return "", nil, err
	}
	if fi, err := f.Stat(); err != nil || fi.Size() == 0 {
		f.Close()
		return "", nil, invalidf("%s %s: empty file", what, rel)
	}
	return p, f, nil
}

// pathErr drops the host path from a *fs.PathError; the caller names the file.
func pathErr(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

func fileKind(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "directory"
	case m&fs.ModeSymlink != 0:
		return "symlink"
	case m&fs.ModeCharDevice != 0:
		return "character device"
	case m&fs.ModeDevice != 0:
		return "block device"
	case m&fs.ModeNamedPipe != 0:
		return "fifo"
	case m&fs.ModeSocket != 0:
		return "socket"
	}
	return "special file"
}

// relTo names p as a path inside root ("/disk/vm.qcow2") when it is under root.
func relTo(root, p string) string {
	if root == "" {
		return p
	}
	r, err := filepath.Rel(root, p)
	if err != nil || r == ".." || strings.HasPrefix(r, "../") {
		return p
	}
	return "/" + filepath.ToSlash(r)
}

// InImage returns p as a path inside the image's rootfs when Root is set.
func (b *Boot) InImage(p string) string {
	return relTo(b.Root, p)
}
