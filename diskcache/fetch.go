package diskcache

import (
	"bufio"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net/url"
	"os"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// fetch downloads u into tmp/<want>.part (resuming what is there), checks
// its sha256 is want, and installs it (decompressed) as sha256/<want>. The
// caller holds the digest lock. Room for the download and its
// decompression is reserved in the cache before it is written. On failure
// it leaves no file of want in tmp/, but for one case: when ctx ended
// while the download was progressing (see keepable), the partial download
// is kept for the next Get to resume.
//
// With prove, sha256/<want> is already there and the download only shows
// u serves its bytes: it starts from 0, is never kept, and is removed
// once verified instead of installed.
func (c *Cache) fetch(ctx context.Context, r *root, u *url.URL, want string, prove bool, p Progress) (retErr error) {
	client := c.Client
	if client == nil {
		var err error
		if client, err = NewClient(""); err != nil {
			return err
		}
		defer client.CloseIdleConnections()
	}
	caller, began := ctx, time.Now()
	var timeout error
	if c.DownloadTimeout > 0 {
		var cancel context.CancelFunc
		timeout = fmt.Errorf("took longer than %s (config download_timeout)", c.DownloadTimeout)
		ctx, cancel = context.WithTimeoutCause(ctx, c.DownloadTimeout, timeout)
		defer cancel()
	}
	name := u.Redacted()
	if c.MaxSize <= 0 {
		c.sweep(r, want) // with a cap, each reservation sweeps
	}
	rv := c.reserve(r, want)
	var dl *part
	defer func() {
		if dl != nil {
			dl.f.Close()
		}
		switch {
		case retErr != nil && !prove && dl != nil && c.keepable(caller, ctx, timeout, dl, retErr, began):
			c.keepPart(r, want, dl, name, p)
		case retErr != nil:
			c.removeTemps(r, want)
		default:
			if err := rv.release(); err != nil {
				c.warn(err, "remove reservation")
			}
		}
	}()
	if prove {
		// Bytes already there, some other URL's or a crash's, prove
		// nothing of u.
		c.removeTemps(r, want)
	}
	var err error
	dl, err = c.openPart(ctx, r, want, name, rv)
	if err != nil {
		return err
	}
	if dl.have > 0 {
		p.say("found %d bytes of an earlier download of %s", dl.have, name)
	}
	for try := 0; ; try++ {
		if err := c.download(ctx, client, dl, u, p); err != nil {
			return err
		}
		sum := hex.EncodeToString(dl.hash.Sum(nil))
		if sum == want {
			break
		}
		if dl.resumed && try == 0 {
			// The bytes kept may predate a change of the file, or a crash.
			p.say("%s: sha256 is wrong after a resume, downloading again from 0", name)
			if err := dl.reset(); err != nil {
				return err
			}
			continue
		}
		return errorf(errdefs.ErrFailedPrecondition, nil, "disk-url %s: sha256 is %s, want %s", name, sum, want)
	}
	p.say("verified sha256:%s of %s", want, name)
	if prove {
		c.removeTemps(r, want)
		return nil
	}
	return c.install(ctx, r, dl, name, want, p)
}

// removeTemps removes the temp files of digest hex, whose lock the caller
// holds: after a failure, nothing of the download stays.
func (c *Cache) removeTemps(r *root, hex string) {
	for _, suffix := range []string{partSuffix, unpackSuffix, reserveSuffix} {
		if err := removeAt(r.tmp, hex+suffix); err != nil {
			c.warn(err, "remove "+r.label(tmpDir, hex+suffix))
		}
	}
}

// install moves the verified download into sha256/<hex>, decompressed if
// it starts with the magic of gzip, xz or zstd.
func (c *Cache) install(ctx context.Context, r *root, dl *part, name, hex string, p Progress) error {
	format, err := sniff(dl.f)
	if err != nil {
		return errorf(errdefs.ErrUnavailable, err, "read %s", dl.f.Name())
	}
	if format == "" {
		return commit(r, dl.f, hex+partSuffix, hex)
	}
	p.say("decompressing %s (%s)", name, format)
	n, err := c.unpack(ctx, r, dl, format, name, hex, p)
	if err != nil {
		return err
	}
	p.say("decompressed %s: %s", name, humanBytes(n))
	if err := removeAt(r.tmp, hex+partSuffix); err != nil {
		c.warn(err, "remove download file")
	}
	return nil
}

// unpack decompresses dl into tmp/<hex>.unpack, at most MaxDisk bytes and
// MaxRatio times the download, reserving room in the cache ahead of what
// it writes, and commits it as sha256/<hex>. It returns the decompressed
// size.
func (c *Cache) unpack(ctx context.Context, r *root, dl *part, format, name, hex string, p Progress) (_ int64, retErr error) {
	tmp := hex + unpackSuffix
	out, err := openAt(r.tmp, tmp, unix.O_RDWR|unix.O_CREAT|unix.O_TRUNC, 0o600, r.label(tmpDir, tmp))
	if err != nil {
		return 0, errorf(errdefs.ErrUnavailable, err, "open decompression file")
	}
	defer func() {
		out.Close()
		if retErr != nil {
			if err := removeAt(r.tmp, tmp); err != nil {
				c.warn(err, "remove decompression file")
			}
		}
	}()
	limit, over := c.unpackLimit(name, dl.have)
	total := int64(-1)
	if format == formatXZ {
		if total, err = checkXZ(io.NewSectionReader(dl.f, 0, dl.have), name, limit, over); err != nil {
			return 0, err
		}
	}
	const what = "decompressed disk"
	if total >= 0 && dl.rv != nil {
		if _, err := dl.rv.grow(ctx, name, what, dl.have+total, dl.have+total); err != nil {
			return 0, err
		}
	}
	dec, err := newDecoder(format, bufio.NewReaderSize(io.NewSectionReader(dl.f, 0, dl.have), 1<<20))
	if err != nil {
		return 0, errorf(errdefs.ErrFailedPrecondition, err, "disk-url %s: decompress %s", name, format)
	}
	defer dec.Close()
	w := &grower{ctx: ctx, rv: dl.rv, w: out, name: name, what: what, base: dl.have, limit: limit}
	m := newMeter(p, "decompressing", name, 0, total)
	n, err := io.Copy(io.MultiWriter(w, m), io.LimitReader(ctxReader{ctx, dec}, limit+1))
	switch {
	case ctx.Err() != nil:
		return 0, ctxError(ctx, "disk-url "+name+": decompress")
	case w.err != nil:
		return 0, w.err
	case err != nil:
		return 0, errorf(errdefs.ErrFailedPrecondition, err, "disk-url %s: decompress %s", name, format)
	case n > limit:
		return 0, over
	}
	return n, commit(r, out, tmp, hex)
}

// commit makes the temp file f (tmp/<name>) read-only, syncs it and renames
// it to sha256/<hex>, then syncs sha256/ so the new name survives a crash.
func commit(r *root, f *os.File, name, hex string) error {
	if err := f.Chmod(0o444); err != nil {
		return errorf(errdefs.ErrUnavailable, err, "chmod %s", f.Name())
	}
	if err := f.Sync(); err != nil {
		return errorf(errdefs.ErrUnavailable, err, "sync %s", f.Name())
	}
	if err := unix.Renameat(int(r.tmp.Fd()), name, int(r.disks.Fd()), hex); err != nil {
		return errorf(errdefs.ErrUnavailable, err, "rename %s to %s", f.Name(), r.label(disksDir, hex))
	}
	if err := r.disks.Sync(); err != nil {
		return errorf(errdefs.ErrUnavailable, err, "sync %s", r.label(disksDir, ""))
	}
	return nil
}

// errWriter records the error of its writer, to tell it from a read error.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(b []byte) (int, error) {
	n, err := e.w.Write(b)
	if err != nil && e.err == nil {
		e.err = err
	}
	return n, err
}
