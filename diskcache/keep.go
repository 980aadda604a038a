package diskcache

import (
	"context"
	"sort"
	"strings"
	"time"

	"github.com/containerd/errdefs"
)

// Bounds on the partial downloads kept after a create's own deadline, for
// the next create of the digest to resume.
const (
	// defaultKeepRate is the least average rate, in bytes a second, of a
	// download whose partial file is kept: below it the download was not
	// progressing (a trickle, a stall), and is removed.
	defaultKeepRate = 1 << 20
	// defaultKeepCount is the most kept partial downloads in tmp/; the
	// oldest beyond it are removed.
	defaultKeepCount = 4
	// defaultKeepAge is how long a kept partial download stays after its
	// last write.
	defaultKeepAge = time.Hour
)

// keepable reports whether the partial download dl, whose fetch began at
// began and failed with err, is kept for the next Get: only when the
// caller's context ended (its deadline or a cancel, not download_timeout,
// whose cause is timeout, nor any other failure) and the download received
// at least keepRate bytes a second on average since began.
func (c *Cache) keepable(caller, ctx context.Context, timeout error, dl *part, err error, began time.Time) bool {
	if caller.Err() == nil || context.Cause(ctx) == timeout ||
		!(errdefs.IsDeadlineExceeded(err) || errdefs.IsCanceled(err)) {
		return false
	}
	rate := c.keepRate
	if rate <= 0 {
		rate = defaultKeepRate
	}
	took := time.Since(began).Seconds()
	return dl.have > 0 && dl.got > 0 && took > 0 && float64(dl.got)/took >= float64(rate)
}

// keepPart keeps tmp/<hex>.part, the partial download dl, for the next Get
// of hex to resume; the caller holds the digest lock. Its reservation and
// decompression file go: from now on it counts as its size. Kept partial
// downloads beyond keepCount, the oldest first, are removed.
func (c *Cache) keepPart(r *root, hex string, dl *part, name string, p Progress) {
	for _, suffix := range []string{unpackSuffix, reserveSuffix} {
		if err := removeAt(r.tmp, hex+suffix); err != nil {
			c.warn(err, "remove "+r.label(tmpDir, hex+suffix))
		}
	}
	p.say("keeping the partial download of %s (%s) in the cache for the next try", name, humanBytes(dl.have))
	c.sweep(r, "")
}

// keptParts returns the digests of the kept partial downloads among
// entries: a lone tmp/<hex>.part whose mtime is less than keepAge ago, at
// most keepCount of them, the newest. Every other temp file of a digest
// whose lock is free is stale.
func (c *Cache) keptParts(entries []entry) map[string]bool {
	maxAge, count := c.keepAge, c.keepCount
	if maxAge <= 0 {
		maxAge = defaultKeepAge
	}
	if count <= 0 {
		count = defaultKeepCount
	}
	oldest := time.Now().Add(-maxAge).UnixNano()
	var parts []entry
	for _, e := range entries {
		if e.dir == tmpDir && len(e.names) == 1 && strings.HasSuffix(e.names[0], partSuffix) && e.mtime > oldest {
			parts = append(parts, e)
		}
	}
	sort.Slice(parts, func(i, j int) bool { return parts[i].mtime > parts[j].mtime })
	kept := map[string]bool{}
	for _, e := range parts[:min(len(parts), count)] {
		kept[e.hex] = true
	}
	return kept
}
