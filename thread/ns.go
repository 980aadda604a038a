package thread

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// nsFiles names, for each namespace type JoinNamespace takes, the type
// in messages and the calling thread's file under /proc/thread-self/ns
// that leads back to where its children start: for a pid namespace, that
// is pid_for_children, not the thread's own (which setns never changes).
var nsFiles = map[int]struct{ kind, self string }{
	unix.CLONE_NEWIPC: {"ipc", "ipc"},
	unix.CLONE_NEWUTS: {"uts", "uts"},
	unix.CLONE_NEWPID: {"pid", "pid_for_children"},
}

// JoinNamespace is the Step that moves the calling thread into the
// namespace of type nstype (unix.CLONE_NEWIPC, CLONE_NEWUTS or
// CLONE_NEWPID) at path, a /proc/PID/ns file or a bind mount of one. A
// pid namespace is the one the thread's children start in; the thread
// itself stays in its own.
func JoinNamespace(path string, nstype int) Step {
	return func() (func() bool, error) {
		f, ok := nsFiles[nstype]
		if !ok {
			return nil, fmt.Errorf("join namespace %s: type %#x is not ipc, uts or pid", path, nstype)
		}
		target, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("open %s namespace: %w", f.kind, &os.PathError{Op: "open", Path: path, Err: err})
		}
		defer unix.Close(target)
		orig, err := openSelf(f.self)
		if err != nil {
			return nil, err
		}
		if err := unix.Setns(target, nstype); err != nil {
			unix.Close(orig)
			if errors.Is(err, unix.EINVAL) {
				return nil, fmt.Errorf("join %s namespace %s: it is no %s namespace this process may join", f.kind, path, f.kind)
			}
			return nil, fmt.Errorf("join %s namespace %s: %w", f.kind, path, err)
		}
		return wayBack(orig, nstype), nil
	}
}

// NewUTS is the Step that moves the calling thread into a new UTS
// namespace and names it hostname there ("": keeps the name it had).
// The name is set where nothing but this thread and the children it
// forks can be.
func NewUTS(hostname string) Step {
	return func() (func() bool, error) {
		orig, err := openSelf("uts")
		if err != nil {
			return nil, err
		}
		if err := unix.Unshare(unix.CLONE_NEWUTS); err != nil {
			unix.Close(orig)
			return nil, fmt.Errorf("new uts namespace: %w", err)
		}
		back := wayBack(orig, unix.CLONE_NEWUTS)
		if hostname != "" {
			if err := unix.Sethostname([]byte(hostname)); err != nil {
				return back, fmt.Errorf("set host name %q: %w", hostname, err)
			}
		}
		return back, nil
	}
}

// openSelf opens the calling thread's namespace file self.
func openSelf(self string) (int, error) {
	p := "/proc/thread-self/ns/" + self
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("current namespace: %w", &os.PathError{Op: "open", Path: p, Err: err})
	}
	return fd, nil
}

// wayBack moves the calling thread back into orig, a namespace of type
// nstype that openSelf opened, and closes it.
func wayBack(orig, nstype int) func() bool {
	return func() bool {
		defer unix.Close(orig)
		return unix.Setns(orig, nstype) == nil
	}
}
