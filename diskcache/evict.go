package diskcache

import (
	"context"
	"errors"
	"math"
	"sort"
	"strings"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// entry is what eviction may remove: a disk, or the temp files of one
// digest (its download, decompression and reservation) taken together.
type entry struct {
	dir   string   // disksDir or tmpDir
	names []string // the disk's name, or the digest's temp files
	hex   string
	size  int64 // bytes it holds, or has reserved
	mtime int64 // ns, the newest of its files
}

// Evict removes stale temp files, then the least recently used disks that
// are not in use and kept partial downloads until the cache holds at most MaxSize bytes; it does
// nothing when MaxSize is 0. Get calls it after it adds a disk.
func (c *Cache) Evict(ctx context.Context) error {
	if c.MaxSize <= 0 {
		return nil
	}
	r, err := openRoot(c.Dir)
	if err != nil {
		return err
	}
	defer r.close()
	_, err = c.evict(ctx, r, "", 0)
	return err
}

// evict removes every stale temp file (whose digest lock nobody holds,
// but for the partial downloads kept for a retry), then the oldest disks
// and kept partial downloads it may until what the cache holds, besides
// keep's temp files, plus need fits in MaxSize. It never removes the files
// of keep. It returns the room left for keep's temp files: MaxSize less
// what the rest holds, which may be less than need.
func (c *Cache) evict(ctx context.Context, r *root, keep string, need int64) (int64, error) {
	entries, err := listEntries(r)
	if err != nil {
		return 0, err
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].mtime < entries[j].mtime })
	parts := c.keptParts(entries)
	var total int64
	kept := entries[:0]
	for _, e := range entries {
		if e.hex == keep && e.dir == tmpDir {
			continue // replaced by need
		}
		if e.dir == tmpDir && !parts[e.hex] {
			// A temp file whose digest lock is free was left by a
			// process that died, or is a kept partial download past
			// its age or count: remove it whatever the cache holds.
			if removed, err := c.evictEntry(r, e); err != nil {
				c.warn(err, "remove stale temp files of sha256:"+e.hex)
			} else if removed {
				continue
			}
		}
		total = addSize(total, e.size)
		kept = append(kept, e)
	}
	for _, e := range kept {
		if addSize(total, need) <= c.MaxSize {
			break
		}
		if err := ctx.Err(); err != nil {
			return 0, ctxError(ctx, "evict disks")
		}
		if e.hex == keep || (e.dir == tmpDir && !parts[e.hex]) {
			continue // keep's, or a download in progress
		}
		removed, err := c.evictEntry(r, e)
		if err != nil {
			c.warn(err, "evict "+r.label(e.dir, e.names[0]))
			continue
		}
		if removed {
			total -= e.size
		}
	}
	return c.MaxSize - total, nil
}

// sweep removes the temp files of every digest but keep whose lock nobody
// holds, a process that died left them, but for the partial downloads
// kept for a retry (see keptParts).
func (c *Cache) sweep(r *root, keep string) {
	entries, err := listEntries(r)
	if err != nil {
		c.warn(err, "list the disk cache")
		return
	}
	parts := c.keptParts(entries)
	for _, e := range entries {
		if e.dir == tmpDir && e.hex != keep && !parts[e.hex] {
			if _, err := c.evictEntry(r, e); err != nil {
				c.warn(err, "remove stale temp files of sha256:"+e.hex)
			}
		}
	}
}

// addSize is a+b, saturated at the largest int64.
func addSize(a, b int64) int64 {
	if b > math.MaxInt64-a {
		return math.MaxInt64
	}
	return a + b
}

// listEntries returns the disks of the cache and, for each digest with
// temp files, one entry whose size is the larger of what they hold and
// what the digest has reserved (tmp/<hex>.reserve's apparent size).
func listEntries(r *root) ([]entry, error) {
	var entries []entry
	temps := map[string]*entry{}
	reserved := map[string]int64{}
	for _, d := range []string{disksDir, tmpDir} {
		dir, err := openDir(int(r.dir.Fd()), d)
		if err != nil {
			return nil, errorf(errdefs.ErrUnavailable, err, "open %s", r.label(d, ""))
		}
		names, err := dir.Readdirnames(-1)
		if err != nil {
			dir.Close()
			return nil, errorf(errdefs.ErrUnavailable, err, "list %s", r.label(d, ""))
		}
		for _, name := range names {
			hex, ok := entryDigest(d, name)
			if !ok {
				continue
			}
			var st unix.Stat_t
			if err := unix.Fstatat(int(dir.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil ||
				st.Mode&unix.S_IFMT != unix.S_IFREG {
				continue
			}
			if d == disksDir {
				entries = append(entries, entry{dir: d, names: []string{name}, hex: hex, size: st.Size, mtime: st.Mtim.Nano()})
				continue
			}
			e := temps[hex]
			if e == nil {
				e = &entry{dir: d, hex: hex}
				temps[hex] = e
			}
			e.names = append(e.names, name)
			e.mtime = max(e.mtime, st.Mtim.Nano())
			if strings.HasSuffix(name, reserveSuffix) {
				reserved[hex] = st.Size
			} else {
				e.size = addSize(e.size, st.Size)
			}
		}
		dir.Close()
	}
	for hex, e := range temps {
		e.size = max(e.size, reserved[hex])
		entries = append(entries, *e)
	}
	return entries, nil
}

// entryDigest returns the digest a file of dir d is for, if it is one of
// the cache's: <hex> in sha256/, <hex>.part, <hex>.unpack or
// <hex>.reserve in tmp/.
func entryDigest(d, name string) (string, bool) {
	hex := name
	if d == tmpDir {
		ok := false
		for _, suffix := range []string{partSuffix, unpackSuffix, reserveSuffix} {
			if hex, ok = strings.CutSuffix(name, suffix); ok {
				break
			}
		}
		if !ok {
			return "", false
		}
	}
	h, err := ParseDigest(hex)
	return h, err == nil && h == hex
}

// evictEntry removes e unless its digest lock is held or, for a disk, it
// is in use; it reports whether it removed it.
func (c *Cache) evictEntry(r *root, e entry) (bool, error) {
	l, err := tryLockDigest(r, e.hex)
	if err != nil || l == nil {
		return false, err
	}
	if e.dir == tmpDir {
		var errs []error
		for _, name := range e.names {
			errs = append(errs, removeAt(r.tmp, name))
		}
		err := errors.Join(errs...)
		return err == nil, errors.Join(err, l.remove())
	}
	removed := false
	defer func() {
		if !removed {
			l.unlock()
		}
	}()
	name := e.names[0]
	f, err := openAt(r.disks, name, unix.O_RDONLY, 0, r.label(disksDir, name))
	if errors.Is(err, unix.ENOENT) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		if errors.Is(err, unix.EWOULDBLOCK) {
			return false, nil // in use
		}
		return false, err
	}
	if same, err := sameFile(f, r.disks, name); err != nil || !same {
		return false, err
	}
	// The record of its URLs goes first: a crash between leaves a disk
	// no URL may have without a download of its own.
	if err := removeURLs(r, e.hex); err != nil {
		return false, err
	}
	if err := removeAt(r.disks, name); err != nil {
		return false, err
	}
	if c.Logger != nil {
		c.Logger.WithField("digest", e.hex).WithField("size", e.size).Info("evicted disk")
	}
	removed = true
	return true, l.remove()
}

// Remove removes the disk of digest (hex, optionally "sha256:") from the
// cache unless a VM uses it, as when the shim refuses a disk it fetched:
// a verified download may still be no bootable disk. It reports whether
// the disk is gone.
func (c *Cache) Remove(digest string) (bool, error) {
	hex, err := ParseDigest(digest)
	if err != nil {
		return false, err
	}
	r, err := openRoot(c.Dir)
	if err != nil {
		return false, err
	}
	defer r.close()
	st, err := statAt(r.disks, hex)
	if errors.Is(err, unix.ENOENT) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	return c.evictEntry(r, entry{dir: disksDir, names: []string{hex}, hex: hex, size: st.Size})
}
