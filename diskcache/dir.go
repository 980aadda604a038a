package diskcache

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// Names inside the cache directory.
const (
	disksDir      = "sha256"
	tmpDir        = "tmp"
	locksDir      = "locks"
	urlsDir       = "urls"
	partSuffix    = ".part"
	unpackSuffix  = ".unpack"
	reserveSuffix = ".reserve"
	// reserveLock (in locksDir, never a digest) serialises reservations.
	reserveLock = "reserve"
)

// root is the cache directory and its subdirectories, open as descriptors:
// every file inside is opened relative to them, without following links.
type root struct {
	path  string
	dir   *os.File
	disks *os.File
	tmp   *os.File
	locks *os.File
	urls  *os.File
}

// openRoot makes (0700, with parents) and opens the cache directory at
// path, which must not be a symlink and must belong to this process's user,
// and its subdirectories.
func openRoot(path string) (_ *root, retErr error) {
	if path == "" {
		return nil, errorf(errdefs.ErrInvalidArgument, nil, "disk cache directory is not set")
	}
	path = filepath.Clean(path)
	if err := os.MkdirAll(path, 0o700); err != nil {
		return nil, errorf(errdefs.ErrUnavailable, err, "make disk cache directory")
	}
	dir, err := openDir(unix.AT_FDCWD, path)
	if err != nil {
		return nil, errorf(errdefs.ErrFailedPrecondition, err, "open disk cache directory %s", path)
	}
	r := &root{path: path, dir: dir}
	defer func() {
		if retErr != nil {
			r.close()
		}
	}()
	for _, sub := range []struct {
		name string
		f    **os.File
	}{{disksDir, &r.disks}, {tmpDir, &r.tmp}, {locksDir, &r.locks}, {urlsDir, &r.urls}} {
		if err := unix.Mkdirat(int(dir.Fd()), sub.name, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
			return nil, errorf(errdefs.ErrUnavailable, err, "make %s", filepath.Join(path, sub.name))
		}
		if *sub.f, err = openDir(int(dir.Fd()), sub.name); err != nil {
			return nil, errorf(errdefs.ErrFailedPrecondition, err, "open %s", filepath.Join(path, sub.name))
		}
	}
	return r, nil
}

// openDir opens the directory name in dirfd without following a symlink,
// checks it belongs to this process's user and makes it mode 0700.
func openDir(dirfd int, name string) (*os.File, error) {
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
			return nil, fmt.Errorf("not a directory, or a symlink: %w", err)
		}
		return nil, err
	}
	f := os.NewFile(uintptr(fd), name)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		f.Close()
		return nil, err
	}
	if int(st.Uid) != os.Geteuid() {
		f.Close()
		return nil, fmt.Errorf("owned by uid %d, not %d", st.Uid, os.Geteuid())
	}
	if st.Mode&0o7777 != 0o700 {
		if err := unix.Fchmod(fd, 0o700); err != nil {
			f.Close()
			return nil, err
		}
	}
	return f, nil
}

// close closes the directory descriptors.
func (r *root) close() {
	for _, f := range []*os.File{r.urls, r.locks, r.tmp, r.disks, r.dir} {
		if f != nil {
			f.Close()
		}
	}
}

// openAt opens name in dir with flags plus O_NOFOLLOW|O_CLOEXEC; label
// names the returned file.
func openAt(dir *os.File, name string, flags int, mode uint32, label string) (*os.File, error) {
	fd, err := unix.Openat(int(dir.Fd()), name, flags|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: label, Err: err}
	}
	return os.NewFile(uintptr(fd), label), nil
}

// statAt returns the lstat of name in dir.
func statAt(dir *os.File, name string) (unix.Stat_t, error) {
	var st unix.Stat_t
	err := unix.Fstatat(int(dir.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW)
	return st, err
}

// sameFile reports whether name in dir is the file f is open on. A missing
// name is not an error: it is not the same file.
func sameFile(f *os.File, dir *os.File, name string) (bool, error) {
	var fst unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &fst); err != nil {
		return false, err
	}
	st, err := statAt(dir, name)
	if errors.Is(err, unix.ENOENT) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return st.Dev == fst.Dev && st.Ino == fst.Ino, nil
}

// label returns the path of name in the subdirectory sub, for messages.
func (r *root) label(sub, name string) string {
	return filepath.Join(r.path, sub, name)
}

// removeAt unlinks name in dir; a missing name is not an error.
func removeAt(dir *os.File, name string) error {
	if err := unix.Unlinkat(int(dir.Fd()), name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return err
	}
	return nil
}
