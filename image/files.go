package image

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// FilesDirName is the directory, at the root of the container's rootfs
// (its writable layer), that holds the files the shim makes for a VM: the
// root disk overlay, the cloud-init seed. The shim makes it itself, so an
// image that ships the name is refused: it would control where they go.
const FilesDirName = ".vmshim"

// Names of the files in the VM's files directory.
const (
	OverlayName = "root.qcow2"
	SeedName    = "seed.iso"
	VarsName    = "efivars.fd" // the VM's UEFI variables store
)

// FilesDir is the VM's files directory, open; every file in it is made
// through its descriptor, never through a path the image could redirect.
type FilesDir struct {
	dir  *os.File
	path string // for messages and the task record
}

// MakeFilesDir makes FilesDirName at the root of rootfs. It fails if the
// image has anything of that name (a symlink to a host directory, say);
// what it makes is the caller's to remove with RemoveFilesDir.
func MakeFilesDir(rootfs string) (*FilesDir, error) {
	root, err := openRoot(rootfs)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	if err := unix.Mkdirat(int(root.Fd()), FilesDirName, 0o700); err != nil {
		if errors.Is(err, unix.EEXIST) {
			var st unix.Stat_t
			kind := "file"
			if unix.Fstatat(int(root.Fd()), FilesDirName, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT != unix.S_IFREG {
				kind = fileKind(modeOf(st.Mode))
			}
			return nil, invalidf("image has /%s (%s): the name is reserved for the files vmshim makes for the VM", FilesDirName, kind)
		}
		return nil, fmt.Errorf("make /%s in rootfs: %w", FilesDirName, err)
	}
	fd, err := unix.Openat2(int(root.Fd()), FilesDirName, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_BENEATH | unix.RESOLVE_NO_XDEV,
	})
	if err != nil {
		_ = unix.Unlinkat(int(root.Fd()), FilesDirName, unix.AT_REMOVEDIR)
		return nil, fmt.Errorf("open /%s in rootfs: %w", FilesDirName, err)
	}
	p := filepath.Join(rootfs, FilesDirName)
	return &FilesDir{dir: os.NewFile(uintptr(fd), p), path: p}, nil
}

// Path is the directory's host path, for messages.
func (d *FilesDir) Path() string { return d.path }

// Create makes the file name in the directory, read-write, mode 0600; it
// must not exist.
func (d *FilesDir) Create(name string) (*os.File, error) {
	fd, err := unix.Openat(int(d.dir.Fd()), name, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", filepath.Join(d.path, name), err)
	}
	return os.NewFile(uintptr(fd), filepath.Join(d.path, name)), nil
}

// Close closes the directory; its files stay.
func (d *FilesDir) Close() error { return d.dir.Close() }

// RemoveFilesDir removes the VM's files directory under rootfs and the
// files in it, which are all the shim's: it is only called for a
// directory MakeFilesDir made. A directory that is already gone is
// removed successfully.
func RemoveFilesDir(rootfs string) error {
	root, err := openRoot(rootfs)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer root.Close()
	fd, err := unix.Openat2(int(root.Fd()), FilesDirName, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_BENEATH | unix.RESOLVE_NO_XDEV,
	})
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("open %s: %w", filepath.Join(rootfs, FilesDirName), err)
	}
	dir := os.NewFile(uintptr(fd), FilesDirName)
	defer dir.Close()
	names, err := dir.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("list %s: %w", filepath.Join(rootfs, FilesDirName), err)
	}
	var errs []error
	for _, name := range names {
		if err := unix.Unlinkat(fd, name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("remove %s: %w", filepath.Join(rootfs, FilesDirName, name), err))
		}
	}
	if err := unix.Unlinkat(int(root.Fd()), FilesDirName, unix.AT_REMOVEDIR); err != nil && !errors.Is(err, unix.ENOENT) {
		errs = append(errs, fmt.Errorf("remove %s: %w", filepath.Join(rootfs, FilesDirName), err))
	}
	return errors.Join(errs...)
}

// openRoot opens the rootfs directory itself (the shim's mount, not a
// path inside the image).
func openRoot(rootfs string) (*os.File, error) {
	if !filepath.IsAbs(rootfs) {
		return nil, invalidf("rootfs %q: not an absolute path", rootfs)
	}
	fd, err := unix.Open(rootfs, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open rootfs", Path: rootfs, Err: err}
	}
	return os.NewFile(uintptr(fd), rootfs), nil
}

// modeOf turns a stat mode's file type into an fs.FileMode type.
func modeOf(m uint32) os.FileMode {
	switch m & unix.S_IFMT {
	case unix.S_IFDIR:
		return os.ModeDir
	case unix.S_IFLNK:
		return os.ModeSymlink
	case unix.S_IFBLK:
		return os.ModeDevice
	case unix.S_IFCHR:
		return os.ModeDevice | os.ModeCharDevice
	case unix.S_IFIFO:
		return os.ModeNamedPipe
	case unix.S_IFSOCK:
		return os.ModeSocket
	}
	return 0
}
