package diskcache

import (
	"context"
	"os"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// growChunk is the least a reservation grows by when the final size is
// not known (a body with no Content-Length, a decompression).
const growChunk = 64 << 20

// reservation is the room a digest's temp files may take in the cache,
// recorded as the apparent size of tmp/<hex>.reserve (a sparse file, so it
// costs no blocks), which every shim counts when it makes room. It is held
// with the digest lock; a reservation whose lock is free was left by a
// process that died, and the next Get or Evict removes it.
type reservation struct {
	c    *Cache
	r    *root
	hex  string
	size int64 // bytes reserved; with no MaxSize, what was asked for
}

// reserve returns the (empty) reservation of digest hex, whose lock the
// caller holds.
func (c *Cache) reserve(r *root, hex string) *reservation {
	return &reservation{c: c, r: r, hex: hex}
}

// grow reserves room for the digest's temp files to hold want bytes in
// all, or as much as the cache has when that is less, but never less than
// need; to make room it evicts, oldest first, disks nobody uses and stale
// temp files. It returns the bytes now reserved, or a one-line error naming
// cache_max_size when need does not fit. Growths of all shims are
// serialised by a lock, so together they never reserve more than MaxSize.
func (rv *reservation) grow(ctx context.Context, name, what string, want, need int64) (int64, error) {
	c := rv.c
	if want <= rv.size {
		return rv.size, nil
	}
	if c.MaxSize <= 0 {
		rv.size = want
		return want, nil
	}
	if need > c.MaxSize {
		return 0, errorf(errdefs.ErrFailedPrecondition, nil, "disk-url %s: %s needs at least %d bytes, more than the disk cache holds, %d bytes (config cache_max_size)", name, what, need, c.MaxSize)
	}
	lock, err := openAt(rv.r.locks, reserveLock, unix.O_RDWR|unix.O_CREAT, 0o600, rv.r.label(locksDir, reserveLock))
	if err != nil {
		return 0, errorf(errdefs.ErrUnavailable, err, "open reservation lock")
	}
	defer lock.Close()
	if err := pollFlock(ctx, lock, unix.LOCK_EX, nil); err != nil {
		return 0, err
	}
	room, err := c.evict(ctx, rv.r, rv.hex, want)
	if err != nil {
		return 0, err
	}
	size := min(want, room)
	if size < need {
		return 0, errorf(errdefs.ErrFailedPrecondition, nil, "disk-url %s: no room in the disk cache for the %s: it needs at least %d bytes, and disks in use and other downloads leave %d of %d bytes (config cache_max_size)", name, what, need, max(room, 0), c.MaxSize)
	}
	if err := rv.set(size); err != nil {
		return 0, err
	}
	return size, nil
}

// set records size as the reservation; the caller holds the lock of
// reservations.
func (rv *reservation) set(size int64) error {
	label := rv.r.label(tmpDir, rv.hex+reserveSuffix)
	f, err := openAt(rv.r.tmp, rv.hex+reserveSuffix, unix.O_WRONLY|unix.O_CREAT, 0o600, label)
	if err != nil {
		return errorf(errdefs.ErrUnavailable, err, "open reservation")
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		return errorf(errdefs.ErrUnavailable, err, "truncate %s", label)
	}
	rv.size = size
	return nil
}

// release removes the reservation's file.
func (rv *reservation) release() error {
	rv.size = 0
	return removeAt(rv.r.tmp, rv.hex+reserveSuffix)
}

// grower is an io.Writer that grows a reservation ahead of what it writes:
// base bytes are already there, and at most limit bytes may be written.
type grower struct {
	ctx   context.Context
	rv    *reservation
	w     *os.File
	name  string
	what  string
	base  int64
	n     int64
	limit int64 // the most bytes to write
	err   error // the last error, a reservation's or a write's
}

// Write reserves room for b, in chunks, and writes it.
func (g *grower) Write(b []byte) (int, error) {
	end := g.base + g.n + int64(len(b))
	if g.rv != nil && end > g.rv.size {
		want := max(end, addSize(g.rv.size, max(growChunk, g.rv.size/8)))
		want = min(want, max(end, addSize(g.base, g.limit)))
		if _, err := g.rv.grow(g.ctx, g.name, g.what, want, end); err != nil {
			g.err = err
			return 0, err
		}
	}
	n, err := g.w.Write(b)
	g.n += int64(n)
	if err != nil {
		g.err = errorf(errdefs.ErrUnavailable, err, "write %s", g.w.Name())
	}
	return n, err
}
