package diskcache

import (
	"context"
	"errors"
	"sort"
	"strings"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// entry is a file of the cache that eviction may remove.
type entry struct {
	dir   string // disksDir or tmpDir
	name  string
	hex   string
	size  int64
	mtime int64 // ns
}

// Evict removes the least recently used disks that are not in use, and
// stale temp files, until the cache holds at most MaxSize bytes; it does
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
	return c.evict(ctx, r, "")
}

// evict is Evict on an open root; it never removes the files of keep.
func (c *Cache) evict(ctx context.Context, r *root, keep string) error {
	entries, total, err := listEntries(r)
	if err != nil {
		return err
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].mtime < entries[j].mtime })
	for _, e := range entries {
		if total <= c.MaxSize {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return ctxError(ctx, "evict disks")
		}
		if e.hex == keep {
			continue
		}
		removed, err := c.evictEntry(r, e)
		if err != nil {
			c.warn(err, "evict "+r.label(e.dir, e.name))
			continue
		}
		if removed {
			total -= e.size
		}
	}
	return nil
}

// listEntries returns the disks and temp files of the cache and the sum of
// their sizes.
func listEntries(r *root) ([]entry, int64, error) {
	var (
		entries []entry
		total   int64
	)
	for _, d := range []string{disksDir, tmpDir} {
		dir, err := openDir(int(r.dir.Fd()), d)
		if err != nil {
			return nil, 0, errorf(errdefs.ErrUnavailable, err, "open %s", r.label(d, ""))
		}
		names, err := dir.Readdirnames(-1)
		if err != nil {
			dir.Close()
			return nil, 0, errorf(errdefs.ErrUnavailable, err, "list %s", r.label(d, ""))
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
			entries = append(entries, entry{dir: d, name: name, hex: hex, size: st.Size, mtime: st.Mtim.Nano()})
			total += st.Size
		}
		dir.Close()
	}
	return entries, total, nil
}

// entryDigest returns the digest a file of dir d is for, if it is one of
// the cache's: <hex> in sha256/, <hex>.part or <hex>.unpack in tmp/.
func entryDigest(d, name string) (string, bool) {
	hex := name
	if d == tmpDir {
		var ok bool
		if hex, ok = strings.CutSuffix(name, partSuffix); !ok {
			hex, ok = strings.CutSuffix(name, unpackSuffix)
			if !ok {
				return "", false
			}
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
		err := removeAt(r.tmp, e.name)
		return err == nil, errors.Join(err, l.remove())
	}
	removed := false
	defer func() {
		if !removed {
			l.unlock()
		}
	}()
	f, err := openAt(r.disks, e.name, unix.O_RDONLY, 0, r.label(disksDir, e.name))
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
	if same, err := sameFile(f, r.disks, e.name); err != nil || !same {
		return false, err
	}
	if err := removeAt(r.disks, e.name); err != nil {
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
	return c.evictEntry(r, entry{dir: disksDir, name: hex, hex: hex, size: st.Size})
}
