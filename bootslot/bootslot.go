// Package bootslot paces VM boots on a node: it is a counting semaphore
// shared by every shim on the node, so that no more than n guests are in
// their early boot at once.
//
// The semaphore is a directory of slot files, 0 to n-1: holding the
// exclusive flock(2) on a slot file holds the slot. The kernel drops the
// lock when the holder's descriptor is closed or its process dies, so a
// shim that crashes never keeps a slot. Files beyond n-1, left by a
// configuration with more slots, are ignored; shims configured with
// different n share the low slots and together hold at most the largest
// n. The directory and its files are never removed while shims run: a
// slot file made anew beside a held one that was unlinked would let one
// more boot through.
//
// Nothing at the directory's path or at a slot's name is followed or
// trusted: the path must be a directory of this process's user that
// nobody else can write, with no symlink anywhere on it, and a slot name
// that holds anything but a regular file (a symlink, a fifo, a device, a
// directory) is refused without being opened.
package bootslot

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/vmshim/vmshim/regfile"
)

// MaxSlots bounds the number of slots.
const MaxSlots = 1024

// pollInterval is how often Acquire tries again while all slots are held.
const pollInterval = 100 * time.Millisecond

// Slots is the node's boot slots: n slot files in one directory. Its
// methods may be called from several goroutines, Close once they are done.
type Slots struct {
	path  string
	dirfd int // O_PATH descriptor of the directory; closed by Close
	n     int
	// first picks the slot a try starts at: a random one, so that shims
	// do not all contend for slot 0 and a busy node's held slots are
	// spread out. With 6 of 8 held, a try from 0 opens 7 files; from a
	// random slot, 3 on average (BenchmarkTryAcquireBusy).
	first func(n int) int
}

// New opens the boot slots directory at path, an absolute path, making it
// (and its missing parents) mode 0700 if it is missing, and checks that
// it is a directory of this process's effective user that nobody else can
// write. n, from 1 to MaxSlots, is the number of slots. The caller closes
// the Slots; slots taken stay held after Close.
func New(path string, n int) (*Slots, error) {
	if n < 1 || n > MaxSlots {
		return nil, fmt.Errorf("boot slots: %d slots, want 1 to %d: %w", n, MaxSlots, errdefs.ErrInvalidArgument)
	}
	if !filepath.IsAbs(path) {
		return nil, fmt.Errorf("boot slots directory %q is not an absolute path: %w", path, errdefs.ErrInvalidArgument)
	}
	path = filepath.Clean(path)
	fd, err := openDir(path)
	if err != nil {
		return nil, err
	}
	return &Slots{path: path, dirfd: fd, n: n, first: rand.IntN}, nil
}

// Close closes the directory. Slots taken stay held until released.
func (s *Slots) Close() error {
	return unix.Close(s.dirfd)
}

// TryAcquire takes a free slot without waiting; ok is false when all n
// are held. A slot name that is not a regular file is an error, classed
// as a failed precondition.
func (s *Slots) TryAcquire() (*Slot, bool, error) {
	first := s.first(s.n)
	for k := range s.n {
		i := (first + k) % s.n
		slot, err := s.try(i)
		if err != nil {
			return nil, false, err
		}
		if slot != nil {
			return slot, true, nil
		}
	}
	return nil, false, nil
}

// Acquire takes a free slot, trying every pollInterval while all are
// held, until ctx ends; its error then wraps ctx's. A context that has
// already ended takes no slot.
func (s *Slots) Acquire(ctx context.Context) (*Slot, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("wait for a boot slot in %s: %w", s.path, err)
	}
	var slot *Slot
	err := wait.PollUntilContextCancel(ctx, pollInterval, true, func(context.Context) (taken bool, tryErr error) {
		slot, taken, tryErr = s.TryAcquire()
		return taken, tryErr
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("wait for a boot slot in %s: %w", s.path, err)
		}
		return nil, err
	}
	return slot, nil
}

// try takes slot i if it is free, and returns nil and no error if another
// holds it.
func (s *Slots) try(i int) (*Slot, error) {
	name := strconv.Itoa(i)
	f, err := s.open(name)
	if err != nil {
		return nil, err
	}
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, nil
		}
		return nil, fmt.Errorf("lock boot slot %s: %w", f.Name(), err)
	}
	return &Slot{f: f, index: i}, nil
}

// open opens the slot file name read-only, making it if it is missing.
// A slot is only ever locked, never written: a read-only descriptor is
// all flock needs.
func (s *Slots) open(name string) (*os.File, error) {
	path := filepath.Join(s.path, name)
	fd, err := unix.Openat(s.dirfd, name, unix.O_RDONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err == nil {
		return os.NewFile(uintptr(fd), path), nil
	}
	if !errors.Is(err, unix.EEXIST) {
		return nil, fmt.Errorf("make boot slot %s: %w", path, err)
	}
	// It exists (O_EXCL refuses a symlink too): open it only if it is a
	// regular file, checked before it is opened.
	f, err := regfile.Openat(s.dirfd, name, regfile.Options{
		Flags:   unix.O_RDONLY | unix.O_NONBLOCK,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		var nr *regfile.NotRegularError
		if errors.As(err, &nr) {
			return nil, fmt.Errorf("boot slot %s is %s: %w", path, nr.Error(), errdefs.ErrFailedPrecondition)
		}
		return nil, fmt.Errorf("open boot slot %s: %w", path, err)
	}
	return f, nil
}

// Slot is one held boot slot.
type Slot struct {
	once sync.Once
	// f holds the flock; Release closes it. A Slot that is dropped
	// unreleased is released when the garbage collector finalizes f.
	f     *os.File
	index int
}

// Release gives the slot back. It may be called more than once, from
// several goroutines; the slot is released once.
func (s *Slot) Release() {
	s.once.Do(func() { s.f.Close() })
}

// Index is the slot's number, for logs.
func (s *Slot) Index() int { return s.index }
