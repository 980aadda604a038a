package diskcache

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// revalidateTimeout bounds the request that shows a client can fetch a
// URL whose disk is in the cache.
const revalidateTimeout = 30 * time.Second

// cached returns the disk hex from the cache, nil if it is not there or
// was not fetched from u, once the Cache's client (the pod's) has answered
// for u: a disk some other pod fetched is handed only to one that names a
// URL it was fetched from and could fetch it too. Nothing of the disk is
// opened before. locked says the caller holds the digest lock.
func (c *Cache) cached(ctx context.Context, r *root, u *url.URL, hex string, locked bool, p Progress) (*Disk, error) {
	if _, err := statAt(r.disks, hex); errors.Is(err, unix.ENOENT) {
		return nil, nil
	} else if err != nil {
		return nil, errorf(errdefs.ErrUnavailable, err, "stat %s", r.label(disksDir, hex))
	}
	if !urlRecorded(r, hex, u) {
		return nil, nil // getLocked has the URL prove it serves the bytes
	}
	status, err := c.revalidate(ctx, u)
	if err != nil {
		return nil, err
	}
	d, err := openDisk(ctx, r, hex, locked)
	if d != nil {
		p.say("using cached disk sha256:%s for %s (the pod's network answered %s)", hex, u.Redacted(), status)
	}
	return d, err
}

// revalidate asks for the first byte of u with the Cache's client and
// returns the status of a 2xx answer. Anything else, or no answer, is a
// one-line refusal that says no more than the client itself was told.
func (c *Cache) revalidate(ctx context.Context, u *url.URL) (string, error) {
	client := c.Client
	if client == nil {
		var err error
		if client, err = NewClient(""); err != nil {
			return "", err
		}
		defer client.CloseIdleConnections()
	}
	name := u.Redacted()
	rctx, cancel := context.WithTimeout(ctx, revalidateTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return "", errorf(errdefs.ErrInvalidArgument, err, "disk-url %s", name)
	}
	req.Header.Set("Range", "bytes=0-0")
	req.Header.Set("Accept-Encoding", "identity")
	req.Header.Set("User-Agent", "vmshim-diskcache")
	resp, err := client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return "", ctxError(ctx, "disk-url "+name+": check that the pod's network can fetch it")
		}
		if rctx.Err() != nil {
			return "", errorf(errdefs.ErrUnavailable, nil, "disk-url %s: the pod's network cannot fetch it: no answer in %s", name, revalidateTimeout)
		}
		return "", errorf(errdefs.ErrFailedPrecondition, err, "disk-url %s: the pod's network cannot fetch it", name)
	}
	// The one byte of a 206 lets the connection be used again; of a
	// server that ignores Range and sends it all, no more is read.
	_, _ = io.CopyN(io.Discard, resp.Body, 1)
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		var kind error = errdefs.ErrFailedPrecondition
		if resp.StatusCode == http.StatusNotFound {
			kind = errdefs.ErrNotFound
		}
		return "", errorf(kind, nil, "disk-url %s: the pod's network cannot fetch it: HTTP %s", name, status(resp))
	}
	return status(resp), nil
}
