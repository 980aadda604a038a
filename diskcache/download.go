package diskcache

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// Retry defaults: attempts without progress, first backoff (doubled up to
// maxBackoff), and how long a response may send nothing.
const (
	defaultAttempts = 5
	defaultBackoff  = time.Second
	maxBackoff      = 10 * time.Second
	defaultStall    = time.Minute
)

// errStalled is the cause of an attempt ended for receiving nothing.
var errStalled = errors.New("stalled")

// part is the download of one digest in tmp/<hex>.part, owned by the
// holder of the digest lock.
type part struct {
	f         *os.File
	hash      hash.Hash
	have      int64  // bytes in f, all hashed
	got       int64  // bytes received by this process, for the rate
	total     int64  // size of the whole download, -1 if unknown
	validator string // ETag or Last-Modified, for If-Range
	resumed   bool   // bytes of an earlier attempt or process were kept
	werr      error  // the last error writing f
	meter     *meter

	// rv is the room reserved for the download in the cache; Write grows
	// it in chunks when the size is not known beforehand.
	rv   *reservation
	ctx  context.Context
	name string // the URL, redacted
	rerr error  // the last error growing rv
}

// retryError is a failed attempt worth another; now skips the backoff.
type retryError struct {
	err error
	now bool
}

func (e *retryError) Error() string { return e.err.Error() }
func (e *retryError) Unwrap() error { return e.err }

// openPart opens (or creates) tmp/<hex>.part; bytes left there by a process
// that died are hashed, to be resumed. The download's room in the cache is
// reserved in rv.
func (c *Cache) openPart(ctx context.Context, r *root, hex, name string, rv *reservation) (_ *part, retErr error) {
	label := r.label(tmpDir, hex+partSuffix)
	f, err := openAt(r.tmp, hex+partSuffix, unix.O_RDWR|unix.O_CREAT, 0o600, label)
	if err != nil {
		return nil, errorf(errdefs.ErrUnavailable, err, "open download file")
	}
	dl := &part{f: f, hash: sha256.New(), total: -1, rv: rv, ctx: ctx, name: name}
	defer func() {
		if retErr != nil {
			f.Close()
		}
	}()
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() {
		return nil, errorf(errdefs.ErrFailedPrecondition, err, "%s is not a regular file", label)
	}
	if limit, _ := c.downloadLimit(); st.Size() == 0 || (limit > 0 && st.Size() > limit) {
		return dl, dl.reset()
	}
	n, err := io.Copy(dl.hash, ctxReader{ctx, f})
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctxError(ctx, "hash "+label)
		}
		return nil, errorf(errdefs.ErrUnavailable, err, "read %s", label)
	}
	dl.have, dl.resumed = n, true
	return dl, nil
}

// Write appends b to the file, the hash and the meter, growing the
// reservation first when b goes past it.
func (dl *part) Write(b []byte) (int, error) {
	if end := dl.have + int64(len(b)); dl.rv != nil && end > dl.rv.size {
		want := max(end, addSize(dl.rv.size, max(growChunk, dl.rv.size/8)))
		if dl.total >= 0 {
			want = max(end, dl.total)
		}
		if _, err := dl.rv.grow(dl.ctx, dl.name, "download", want, end); err != nil {
			dl.rerr = err
			return 0, err
		}
	}
	n, err := dl.f.Write(b)
	dl.hash.Write(b[:n])
	dl.have += int64(n)
	dl.got += int64(n)
	if dl.meter != nil {
		dl.meter.Write(b[:n])
	}
	if err != nil {
		dl.werr = err
	}
	return n, err
}

// reset empties the download, to start again from byte 0.
func (dl *part) reset() error {
	if err := dl.f.Truncate(0); err != nil {
		return errorf(errdefs.ErrUnavailable, err, "truncate %s", dl.f.Name())
	}
	if _, err := dl.f.Seek(0, io.SeekStart); err != nil {
		return errorf(errdefs.ErrUnavailable, err, "seek %s", dl.f.Name())
	}
	dl.hash.Reset()
	dl.have, dl.total, dl.validator, dl.resumed = 0, -1, "", false
	return nil
}

// download completes dl from u, retrying lost connections with Range
// requests; a few attempts in a row without progress end it.
func (c *Cache) download(ctx context.Context, client *http.Client, dl *part, u *url.URL, p Progress) error {
	attempts, backoff := c.attempts, c.backoff
	if attempts <= 0 {
		attempts = defaultAttempts
	}
	if backoff <= 0 {
		backoff = defaultBackoff
	}
	for failed := 0; ; {
		had := dl.have
		err := c.attempt(ctx, client, dl, u, p)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctxError(ctx, fmt.Sprintf("disk-url %s: download stopped at %d bytes", u.Redacted(), dl.have))
		}
		var re *retryError
		if !errors.As(err, &re) {
			return err
		}
		if dl.have > had {
			failed = 0
		}
		if failed++; failed >= attempts {
			return re.err
		}
		if re.now {
			continue
		}
		p.say("%s; retrying in %s", re.err, backoff)
		select {
		case <-ctx.Done():
			return ctxError(ctx, fmt.Sprintf("disk-url %s: download stopped at %d bytes", u.Redacted(), dl.have))
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// attempt makes one request for the rest of dl and copies its body.
func (c *Cache) attempt(ctx context.Context, client *http.Client, dl *part, u *url.URL, p Progress) error {
	name := u.Redacted()
	stall := c.stall
	if stall <= 0 {
		stall = defaultStall
	}
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	watchdog := time.AfterFunc(stall, func() { cancel(errStalled) })
	defer watchdog.Stop()
	req, err := http.NewRequestWithContext(actx, http.MethodGet, u.String(), nil)
	if err != nil {
		return errorf(errdefs.ErrInvalidArgument, err, "disk-url %s", name)
	}
	req.Header.Set("Accept-Encoding", "identity")
	req.Header.Set("User-Agent", "vmshim-diskcache")
	if dl.have > 0 {
		req.Header.Set("Range", fmt.Sprintf("bytes=%d-", dl.have))
		if dl.validator != "" {
			req.Header.Set("If-Range", dl.validator)
		}
	}
	resp, err := client.Do(req)
	if err != nil {
		if context.Cause(actx) == errStalled && ctx.Err() == nil {
			return &retryError{err: errorf(errdefs.ErrUnavailable, nil, "disk-url %s: no response for %s", name, stall)}
		}
		return doError(name, err)
	}
	defer resp.Body.Close()
	if done, err := c.start(ctx, dl, resp, name, p); done || err != nil {
		return err
	}
	var body io.Reader = stallReader{resp.Body, watchdog, stall}
	limit, key := c.downloadLimit()
	if limit > 0 {
		body = io.LimitReader(body, limit-dl.have+1)
	}
	dl.meter = newMeter(p, "downloading", name, dl.have, dl.total)
	started := time.Now()
	_, err = io.Copy(dl, body)
	switch {
	case dl.rerr != nil:
		return dl.rerr
	case dl.werr != nil:
		return errorf(errdefs.ErrUnavailable, dl.werr, "write %s", dl.f.Name())
	case limit > 0 && dl.have > limit:
		return tooLarge(name, "download", limit, key)
	case err != nil && context.Cause(actx) == errStalled && ctx.Err() == nil:
		return &retryError{err: errorf(errdefs.ErrUnavailable, nil, "disk-url %s: no data for %s at %d bytes", name, stall, dl.have)}
	case err != nil:
		return &retryError{err: errorf(errdefs.ErrUnavailable, err, "disk-url %s: download interrupted at %d bytes", name, dl.have)}
	case dl.total >= 0 && dl.have != dl.total:
		return &retryError{err: errorf(errdefs.ErrUnavailable, nil, "disk-url %s: body ended at %d of %d bytes", name, dl.have, dl.total)}
	}
	p.say("downloaded %s: %s in %s", name, humanBytes(dl.have), time.Since(started).Round(time.Second))
	return nil
}

// start checks the response's status and headers against dl, resetting dl
// when the response starts from byte 0, and reserves room in the cache for
// the size it announces before a byte of the body is written. It returns
// done when dl already holds the whole download (416 for a range starting
// at its end).
func (c *Cache) start(ctx context.Context, dl *part, resp *http.Response, name string, p Progress) (done bool, err error) {
	switch resp.StatusCode {
	case http.StatusOK:
		if dl.have > 0 {
			p.say("%s: the server sent the whole file, restarting from 0", name)
			if err := dl.reset(); err != nil {
				return false, err
			}
		}
		dl.total, dl.validator = resp.ContentLength, validator(resp.Header)
		size := "size unknown"
		if dl.total >= 0 {
			size = humanBytes(dl.total)
		}
		p.say("downloading %s (%s)", name, size)
	case http.StatusPartialContent:
		cr, err := parseContentRange(resp.Header.Get("Content-Range"))
		if err != nil || cr.Start != dl.have {
			return false, restart(dl, p, name, "a Content-Range of "+quote(resp.Header.Get("Content-Range")))
		}
		dl.total, dl.resumed = cr.Total, true
		if dl.validator == "" {
			dl.validator = validator(resp.Header)
		}
		p.say("resuming %s at %d bytes", name, dl.have)
	case http.StatusRequestedRangeNotSatisfiable:
		cr, err := parseContentRange(resp.Header.Get("Content-Range"))
		if err == nil && cr.Start < 0 && dl.have > 0 && cr.Total == dl.have {
			dl.total = cr.Total
			return true, nil
		}
		return false, restart(dl, p, name, "HTTP 416")
	case http.StatusNotFound:
		return false, errorf(errdefs.ErrNotFound, nil, "disk-url %s: HTTP %s", name, status(resp))
	default:
		return false, errorf(errdefs.ErrFailedPrecondition, nil, "disk-url %s: HTTP %s", name, status(resp))
	}
	if limit, key := c.downloadLimit(); limit > 0 && dl.total > limit {
		return false, tooLarge(name, "download", limit, key)
	}
	if dl.total >= 0 && dl.rv != nil {
		if _, err := dl.rv.grow(ctx, name, "download", dl.total, dl.total); err != nil {
			return false, err
		}
	}
	return false, nil
}

// downloadLimit is the largest download and the config key that sets it:
// the smaller of MaxDownload and MaxDisk (a download larger than the
// largest disk is no disk); 0 means none.
func (c *Cache) downloadLimit() (int64, string) {
	if c.MaxDownload > 0 && (c.MaxDisk <= 0 || c.MaxDownload <= c.MaxDisk) {
		return c.MaxDownload, "max_download_size"
	}
	return c.MaxDisk, "max_disk_size"
}

// restart resets dl after a response that does not continue it, and
// returns the error that asks for an immediate new attempt.
func restart(dl *part, p Progress, name, what string) error {
	p.say("%s: the server answered a resume at %d bytes with %s, restarting from 0", name, dl.have, what)
	if err := dl.reset(); err != nil {
		return err
	}
	return &retryError{err: errorf(errdefs.ErrUnavailable, nil, "disk-url %s: the server answered resumes with %s", name, what), now: true}
}

// tooLarge is the error for a download or disk larger than limit, which
// the config key sets.
func tooLarge(name, what string, limit int64, key string) error {
	return errorf(errdefs.ErrFailedPrecondition, nil, "disk-url %s: %s is larger than %d bytes (config %s)", name, what, limit, key)
}

// status is the response's code and standard text, never the server's.
func status(resp *http.Response) string {
	return fmt.Sprintf("%d %s", resp.StatusCode, http.StatusText(resp.StatusCode))
}

// validator returns the response's strong ETag or, failing that, its
// Last-Modified, for If-Range; "" if it has neither.
func validator(h http.Header) string {
	if etag := h.Get("ETag"); etag != "" && !strings.HasPrefix(etag, "W/") {
		return etag
	}
	return h.Get("Last-Modified")
}

// doError is the error of a request that got no response: certificate and
// redirect errors are final, anything else is worth retrying.
func doError(name string, err error) error {
	var (
		fail     *failure
		verify   *tls.CertificateVerificationError
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
	)
	if errors.As(err, &fail) || errors.As(err, &verify) || errors.As(err, &unknown) || errors.As(err, &hostname) {
		return errorf(errdefs.ErrFailedPrecondition, err, "disk-url %s", name)
	}
	return &retryError{err: errorf(errdefs.ErrUnavailable, err, "disk-url %s", name)}
}

// stallReader re-arms a watchdog each time its reader returns data.
type stallReader struct {
	r     io.Reader
	timer *time.Timer
	d     time.Duration
}

func (s stallReader) Read(b []byte) (int, error) {
	n, err := s.r.Read(b)
	if n > 0 {
		s.timer.Reset(s.d)
	}
	return n, err
}

// ctxReader fails reads once its context has ended.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(b []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(b)
}
