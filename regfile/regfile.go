// Package regfile opens files that someone else may have planted: it
// resolves the name to an O_PATH descriptor, which opens nothing, checks
// through it that the file is a regular file (with one link, when asked),
// and only then opens the file through that descriptor. A device node, a
// fifo, a socket or a symlink at the name is refused without ever being
// opened, and the file checked is the file opened.
package regfile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// Options say how a name is resolved and what is opened.
type Options struct {
	// Resolve holds openat2's RESOLVE_* flags for the whole path. With
	// none, only the last component is not followed (O_NOFOLLOW): for a
	// path that comes from a trusted source, such as an OCI spec.
	Resolve uint64
	// Flags opens the file once checked: O_RDONLY, O_RDWR, O_NONBLOCK…;
	// O_CLOEXEC and O_NOCTTY are always added. O_CREAT and O_TRUNC are
	// refused: a file is made with O_CREAT|O_EXCL|O_NOFOLLOW instead.
	Flags int
	// OneLink also refuses a regular file with more than one link (a hard
	// link to a file elsewhere).
	OneLink bool
	// Follow follows a symlink as the last component, where Resolve keeps
	// it in bounds (RESOLVE_IN_ROOT); otherwise a symlink is refused.
	Follow bool
}

// NotRegularError reports a name that is not a regular file, or one with
// more than one link when one was wanted.
type NotRegularError struct {
	Kind  string // "fifo", "character device", "symlink"…; "" for a regular file
	Links uint64 // the regular file's link count
}

// Error implements error.
func (e *NotRegularError) Error() string {
	if e.Kind == "" {
		return fmt.Sprintf("a regular file with %d links, not 1", e.Links)
	}
	return "not a regular file (" + e.Kind + ")"
}

// Unwrap classes the error as an invalid argument.
func (e *NotRegularError) Unwrap() error { return errdefs.ErrInvalidArgument }

// Openat opens name beneath the directory dirfd (unix.AT_FDCWD for the
// working directory) as o says. Errors are those of openat2 (os.ErrNotExist
// matches a missing name) or a *NotRegularError; they do not name the file.
func Openat(dirfd int, name string, o Options) (*os.File, error) {
	if o.Flags&(unix.O_CREAT|unix.O_TRUNC|unix.O_PATH) != 0 {
		return nil, fmt.Errorf("regfile: flags %#x create, truncate or only resolve: %w", o.Flags, errdefs.ErrInvalidArgument)
	}
	flags := uint64(unix.O_PATH | unix.O_CLOEXEC)
	if !o.Follow {
		flags |= unix.O_NOFOLLOW
	}
	fd, err := unix.Openat2(dirfd, name, &unix.OpenHow{Flags: flags, Resolve: o.Resolve})
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, &NotRegularError{Kind: Kind(st.Mode)}
	}
	if o.OneLink && st.Nlink != 1 {
		return nil, &NotRegularError{Links: uint64(st.Nlink)}
	}
	f, err := os.OpenFile(fmt.Sprintf("/proc/self/fd/%d", fd), o.Flags|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return nil, err
	}
	return f, nil
}

// ErrTooLarge reports a file larger than the reader's limit.
var ErrTooLarge = fmt.Errorf("file too large: %w", errdefs.ErrInvalidArgument)

// ReadFile reads the regular file at path, which must hold at most max
// bytes. Only the last component of path is not followed (see Options);
// the file is opened non-blocking and nothing beyond max+1 bytes is read.
// Errors are one line naming path.
func ReadFile(path string, max int64) ([]byte, error) {
	f, err := Openat(unix.AT_FDCWD, path, Options{Flags: unix.O_RDONLY | unix.O_NONBLOCK})
	if err != nil {
		return nil, &fs.PathError{Op: "read", Path: path, Err: err}
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, pathErr(err))
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("read %s: more than %d bytes: %w", path, max, ErrTooLarge)
	}
	return b, nil
}

// pathErr drops the path from a *fs.PathError; the caller names the file.
func pathErr(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// Kind names a file type from a stat mode, for messages.
func Kind(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		return "regular file"
	case unix.S_IFDIR:
		return "directory"
	case unix.S_IFLNK:
		return "symlink"
	case unix.S_IFCHR:
		return "character device"
	case unix.S_IFBLK:
		return "block device"
	case unix.S_IFIFO:
		return "fifo"
	case unix.S_IFSOCK:
		return "socket"
	}
	return "special file"
}
