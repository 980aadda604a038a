package diskcache

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"os"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"
)

// Cache is a directory of disks shared by every shim on the node. Its
// fields are set before the first call; a Cache may then be used by many
// goroutines, and many Cache values (in many processes) may share one Dir.
type Cache struct {
	// Dir is the cache directory, made 0700 with its parents if missing.
	Dir string
	// MaxSize is the bytes the cache may hold (disks, temp files and the
	// room reserved for downloads in progress); 0 means no cap.
	MaxSize int64
	// MaxDisk is the largest download and the largest decompressed disk,
	// in bytes; 0 means no limit.
	MaxDisk int64
	// MaxDownload is the largest download, in bytes as served
	// (compressed); 0 means only MaxDisk bounds it.
	MaxDownload int64
	// MaxRatio bounds a decompressed disk to this many times the size of
	// its download; 0 means only MaxDisk bounds it.
	MaxRatio int64
	// DownloadTimeout bounds the time a download and its decompression
	// may take, besides the caller's context; 0 means no bound of its own.
	DownloadTimeout time.Duration
	// Client makes the downloads; nil means NewClient("").
	Client *http.Client
	// Logger gets what is worth a line in the shim's log (evictions,
	// failures to evict); nil means no log.
	Logger *log.Entry

	// attempts is the number of tries of a download that keeps losing its
	// connection; 0 means defaultAttempts.
	attempts int
	// backoff is the wait after the first lost connection, doubled after
	// each other; 0 means defaultBackoff.
	backoff time.Duration
	// stall ends an attempt that receives nothing for this long; 0 means
	// defaultStall.
	stall time.Duration
	// keepRate, keepCount and keepAge bound the partial downloads kept
	// after a caller's deadline; 0 means defaultKeepRate, defaultKeepCount
	// and defaultKeepAge.
	keepRate  int64
	keepCount int
	keepAge   time.Duration
}

// Disk is a disk of the cache, open and in use until every copy of its
// file descriptor is closed.
type Disk struct {
	// File is open read-only on the disk, without following a symlink,
	// and holds the shared flock that marks the disk in use.
	File *os.File
	// Digest is the lowercase hex sha256 of the download.
	Digest string
	// Size is the size of the (decompressed) disk in bytes.
	Size int64
}

// Close closes the Disk's file. The disk stays in use while a dup of the
// descriptor (a VM's) is open.
func (d *Disk) Close() error {
	return d.File.Close()
}

// Get returns the disk for u whose download has the sha256 digest (hex,
// optionally "sha256:"), downloading, verifying and decompressing it into
// the cache if it is not there, then evicting what no longer fits. A disk
// already in the cache is returned only for a URL it was fetched from, once
// the Client has answered for u (a one-byte ranged GET): the pod asking
// must be able to fetch it itself. For any other URL, the Client must
// first download u in full and its sha256 be the digest; u is then
// recorded as one the disk was fetched from. Progress lines go to progress, which may be nil.
func (c *Cache) Get(ctx context.Context, u *url.URL, digest string, progress Progress) (*Disk, error) {
	if u == nil {
		return nil, errorf(errdefs.ErrInvalidArgument, nil, "disk-url is not set")
	}
	if err := checkURL(u); err != nil {
		return nil, err
	}
	hex, err := ParseDigest(digest)
	if err != nil {
		return nil, err
	}
	r, err := openRoot(c.Dir)
	if err != nil {
		return nil, err
	}
	defer r.close()
	if d, err := c.cached(ctx, r, u, hex, false, progress); d != nil || err != nil {
		return d, err
	}
	l, err := lockDigest(ctx, r, hex, func() {
		progress.say("waiting for another shim to download sha256:%s", hex)
	})
	if err != nil {
		return nil, err
	}
	d, added, err := c.getLocked(ctx, r, u, hex, progress)
	if err != nil {
		// The lock file goes even when the partial download is kept:
		// lockDigest makes it again.
		if rerr := l.remove(); rerr != nil {
			c.warn(rerr, "remove lock file")
		}
		return nil, err
	}
	l.unlock()
	if added && c.MaxSize > 0 {
		if _, err := c.evict(ctx, r, hex, 0); err != nil {
			c.warn(err, "evict disks")
		}
	}
	return d, nil
}

// getLocked returns the disk hex, downloading it if it is not there, and
// whether it did; the caller holds the digest lock.
func (c *Cache) getLocked(ctx context.Context, r *root, u *url.URL, hex string, p Progress) (*Disk, bool, error) {
	if d, err := c.cached(ctx, r, u, hex, true, p); d != nil || err != nil {
		if d != nil {
			// A crash between the rename of a decompressed disk and the
			// removal of its download leaves the download.
			if err := removeAt(r.tmp, hex+partSuffix); err != nil {
				c.warn(err, "remove download file")
			}
		}
		return d, false, err
	}
	// A disk still there was not fetched from u (cached said so): knowing
	// its digest is not enough, u must serve its bytes.
	_, serr := statAt(r.disks, hex)
	prove := serr == nil
	if prove {
		// An unreachable URL is refused as at a cache hit, before a
		// download.
		if _, err := c.revalidate(ctx, u); err != nil {
			return nil, false, err
		}
		p.say("sha256:%s is in the cache, but was not fetched from %s: downloading it to check it serves the same bytes", hex, u.Redacted())
	}
	if err := c.fetch(ctx, r, u, hex, prove, p); err != nil {
		return nil, false, err
	}
	if err := recordURL(r, hex, u, !prove); err != nil {
		c.warn(err, "record the URL of a disk")
	}
	d, err := openDisk(ctx, r, hex, true)
	if err == nil && d == nil {
		err = errorf(errdefs.ErrUnavailable, nil, "disk %s vanished", r.label(disksDir, hex))
	}
	if d != nil && prove {
		p.say("using cached disk sha256:%s for %s (the pod's network served the same bytes)", hex, u.Redacted())
	}
	return d, err == nil && !prove, err
}

// openDisk opens the final disk hex and takes its shared lock, returning
// nil and no error if it does not exist. Without the digest lock (locked
// false), it also returns nil if Evict is removing the disk at the time.
// It sets the disk's mtime to now: its last use, for eviction.
func openDisk(ctx context.Context, r *root, hex string, locked bool) (_ *Disk, retErr error) {
	label := r.label(disksDir, hex)
	f, err := openAt(r.disks, hex, unix.O_RDONLY, 0, label)
	if errors.Is(err, unix.ENOENT) {
		return nil, nil
	}
	if err != nil {
		return nil, errorf(errdefs.ErrFailedPrecondition, err, "open cached disk")
	}
	defer func() {
		if retErr != nil {
			f.Close()
		}
	}()
	if locked {
		err = pollFlock(ctx, f, unix.LOCK_SH, nil)
	} else if err = unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB); errors.Is(err, unix.EWOULDBLOCK) {
		f.Close()
		return nil, nil // being evicted: take the slow path
	}
	if err != nil {
		return nil, errorf(errdefs.ErrUnavailable, err, "lock %s", label)
	}
	same, err := sameFile(f, r.disks, hex)
	if err != nil {
		return nil, errorf(errdefs.ErrUnavailable, err, "stat %s", label)
	}
	if !same {
		f.Close()
		return nil, nil // evicted between open and lock
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil, errorf(errdefs.ErrUnavailable, err, "stat %s", label)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, errorf(errdefs.ErrFailedPrecondition, nil, "%s is not a regular file", label)
	}
	now := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, {Nsec: unix.UTIME_NOW}}
	if err := unix.UtimesNanoAt(int(r.disks.Fd()), hex, now, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return nil, errorf(errdefs.ErrUnavailable, err, "touch %s", label)
	}
	return &Disk{File: f, Digest: hex, Size: st.Size}, nil
}

// warn logs err, if the Cache has a Logger.
func (c *Cache) warn(err error, msg string) {
	if c.Logger != nil {
		c.Logger.WithError(err).Warn(msg)
	}
}
