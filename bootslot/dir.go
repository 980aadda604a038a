package bootslot

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/vmshim/vmshim/regfile"
)

// dirFlags open a directory on the way to the slots: without reading it
// (O_PATH needs only search permission) and never through a symlink.
const dirFlags = unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC

// openDir opens the directory at path, clean and absolute, one component
// at a time from /, making a missing one mode 0700; it returns an O_PATH
// descriptor of the last, once checked (see checkDir).
func openDir(path string) (int, error) {
	fd, err := unix.Open("/", dirFlags, 0)
	if err != nil {
		return -1, fmt.Errorf("open /: %w", err)
	}
	at := ""
	for _, name := range strings.Split(path, "/") {
		if name == "" {
			continue
		}
		at += "/" + name
		next, err := openOrMake(fd, name)
		if err != nil {
			err = describe(fd, name, at, path, err)
			unix.Close(fd)
			return -1, err
		}
		unix.Close(fd)
		fd = next
	}
	if err := checkDir(fd, path); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// openOrMake opens the directory name in dirfd, making it first if it is
// missing.
func openOrMake(dirfd int, name string) (int, error) {
	fd, err := unix.Openat(dirfd, name, dirFlags, 0)
	if !errors.Is(err, unix.ENOENT) {
		return fd, err
	}
	if err := unix.Mkdirat(dirfd, name, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
		return -1, err
	}
	return unix.Openat(dirfd, name, dirFlags, 0)
}

// describe makes the error of opening name in dirfd, at on the way to
// path, one line that says what is there when it is not a directory.
func describe(dirfd int, name, at, path string, err error) error {
	where := "boot slots directory " + path
	if at != path {
		where += ": " + at
	}
	if errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
		var st unix.Stat_t
		if unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil {
			return fmt.Errorf("%s is not a directory (%s): %w", where, regfile.Kind(st.Mode), errdefs.ErrFailedPrecondition)
		}
	}
	return fmt.Errorf("%s: %w", where, err)
}

// checkDir checks that the directory fd, at path, belongs to this
// process's effective user and that nobody else can write it, so that
// nobody else can put anything at a slot's name.
func checkDir(fd int, path string) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("boot slots directory %s: %w", path, err)
	}
	if euid := os.Geteuid(); int(st.Uid) != euid {
		return fmt.Errorf("boot slots directory %s is owned by uid %d, not %d: %w", path, st.Uid, euid, errdefs.ErrFailedPrecondition)
	}
	if st.Mode&0o022 != 0 {
		return fmt.Errorf("boot slots directory %s has mode %#o: group or others can write it: %w", path, st.Mode&0o7777, errdefs.ErrFailedPrecondition)
	}
	return nil
}
