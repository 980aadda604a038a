package diskcache

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// lockPoll is how often a waiter tries a lock that another holds.
const lockPoll = 50 * time.Millisecond

// digestLock is a held exclusive flock on locks/<hex>.
type digestLock struct {
	f    *os.File
	hex  string
	root *root
}

// lockDigest takes the lock of digest hex, polling until ctx ends if
// another holds it; waiting, if not nil, is called once before the first
// wait. A wait is bounded by ctx alone: another's download never holds the
// caller past its own deadline, and the error says who it waited for and
// how long.
func lockDigest(ctx context.Context, r *root, hex string, waiting func()) (*digestLock, error) {
	start := time.Now()
	for {
		l, err := openLock(r, hex)
		if err != nil {
			return nil, err
		}
		if err := pollFlock(ctx, l.f, unix.LOCK_EX, waiting); err != nil {
			l.f.Close()
			if ctx.Err() != nil {
				return nil, ctxError(ctx, fmt.Sprintf("another shim is downloading sha256:%s; waited %s for it",
					hex, time.Since(start).Round(time.Millisecond)))
			}
			return nil, err
		}
		waiting = nil
		if ok, err := l.current(); err != nil || ok {
			if err != nil {
				l.f.Close()
				return nil, errorf(errdefs.ErrUnavailable, err, "lock %s", l.f.Name())
			}
			return l, nil
		}
		l.f.Close() // its holder unlinked it: lock the new one
	}
}

// tryLockDigest takes the lock of digest hex if nobody holds it; it
// returns nil and no error if somebody does.
func tryLockDigest(r *root, hex string) (*digestLock, error) {
	l, err := openLock(r, hex)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(l.f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		l.f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, nil
		}
		return nil, errorf(errdefs.ErrUnavailable, err, "lock %s", l.f.Name())
	}
	if ok, err := l.current(); err != nil || !ok {
		l.f.Close()
		return nil, err
	}
	return l, nil
}

// openLock opens (creating it) the lock file of digest hex.
func openLock(r *root, hex string) (*digestLock, error) {
	f, err := openAt(r.locks, hex, unix.O_RDWR|unix.O_CREAT, 0o600, r.label(locksDir, hex))
	if err != nil {
		return nil, errorf(errdefs.ErrUnavailable, err, "open lock")
	}
	return &digestLock{f: f, hex: hex, root: r}, nil
}

// current reports whether the locked file is still the one at its path.
func (l *digestLock) current() (bool, error) {
	return sameFile(l.f, l.root.locks, l.hex)
}

// unlock releases the lock.
func (l *digestLock) unlock() {
	l.f.Close()
}

// remove unlinks the lock file, which its holder may do since lockers check
// the path afterwards, and releases the lock.
func (l *digestLock) remove() error {
	err := removeAt(l.root.locks, l.hex)
	l.f.Close()
	return err
}

// pollFlock takes flock how (LOCK_EX or LOCK_SH) on f, trying every
// lockPoll until ctx ends; waiting, if not nil, is called before the first
// wait.
func pollFlock(ctx context.Context, f *os.File, how int, waiting func()) error {
	var tick *time.Ticker
	for {
		err := unix.Flock(int(f.Fd()), how|unix.LOCK_NB)
		if err == nil {
			return nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			return errorf(errdefs.ErrUnavailable, err, "lock %s", f.Name())
		}
		if tick == nil {
			if waiting != nil {
				waiting()
			}
			tick = time.NewTicker(lockPoll)
			defer tick.Stop()
		}
		select {
		case <-ctx.Done():
			return ctxError(ctx, "wait for lock "+f.Name())
		case <-tick.C:
		}
	}
}
