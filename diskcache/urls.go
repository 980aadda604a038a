package diskcache

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net/url"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// Bounds on the record of the URLs a disk was fetched from.
const (
	// maxURLs is the most URLs recorded for a disk; the oldest beyond are
	// dropped.
	maxURLs = 32
	// maxURLsFile is the largest urls file read; a bigger one counts as
	// empty.
	maxURLsFile = 4 << 10
	// urlsNewSuffix is the temp file a urls file is written to before it
	// is renamed over the old one.
	urlsNewSuffix = ".new"
)

// urlKey is what the urls file records for u: the sha256, in hex, of its
// canonical string, so nothing of the URL (such as a credential) is on
// disk.
func urlKey(u *url.URL) string {
	h := sha256.Sum256([]byte(u.String()))
	return hex.EncodeToString(h[:])
}

// parseURLs returns the keys of a urls file: one lowercase hex sha256 a
// line, each ended by a newline, oldest first, at most maxURLs. Anything
// else counts as an empty file.
func parseURLs(b []byte) []string {
	if len(b) == 0 || len(b) > maxURLsFile || b[len(b)-1] != '\n' {
		return nil
	}
	lines := bytes.Split(b[:len(b)-1], []byte{'\n'})
	if len(lines) > maxURLs {
		return nil
	}
	keys := make([]string, 0, len(lines))
	for _, l := range lines {
		k := string(l)
		if h, err := ParseDigest(k); err != nil || h != k {
			return nil
		}
		keys = append(keys, k)
	}
	return keys
}

// formatURLs is the content of a urls file of keys.
func formatURLs(keys []string) []byte {
	var b bytes.Buffer
	for _, k := range keys {
		b.WriteString(k)
		b.WriteByte('\n')
	}
	return b.Bytes()
}

// readURLs returns the keys recorded for the disk hex. A missing file, one
// that is not a regular file (a symlink, a FIFO: never waited on), is too
// big or does not parse counts as empty. It needs no lock: the file is
// only ever replaced whole, by rename.
func readURLs(r *root, hex string) []string {
	f, err := openAt(r.urls, hex, unix.O_RDONLY|unix.O_NONBLOCK, 0, r.label(urlsDir, hex))
	if err != nil {
		return nil
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size > maxURLsFile {
		return nil
	}
	b, err := io.ReadAll(io.LimitReader(f, maxURLsFile+1))
	if err != nil {
		return nil
	}
	return parseURLs(b)
}

// urlRecorded reports whether u is recorded for the disk hex.
func urlRecorded(r *root, hex string, u *url.URL) bool {
	k := urlKey(u)
	for _, have := range readURLs(r, hex) {
		if have == k {
			return true
		}
	}
	return false
}

// recordURL records u for the disk hex, the newest of its URLs, after
// those already recorded unless fresh (a disk just fetched starts a new
// list). The caller holds the digest lock. The file is written beside the
// old one and renamed over it, so a reader sees one or the other whole.
func recordURL(r *root, hex string, u *url.URL, fresh bool) error {
	var keys []string
	if !fresh {
		keys = readURLs(r, hex)
	}
	k := urlKey(u)
	kept := keys[:0]
	for _, have := range keys {
		if have != k {
			kept = append(kept, have)
		}
	}
	keys = append(kept, k)
	if len(keys) > maxURLs {
		keys = keys[len(keys)-maxURLs:]
	}
	tmp := hex + urlsNewSuffix
	if err := removeAt(r.urls, tmp); err != nil {
		return errorf(errdefs.ErrUnavailable, err, "remove %s", r.label(urlsDir, tmp))
	}
	f, err := openAt(r.urls, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, 0o600, r.label(urlsDir, tmp))
	if err != nil {
		return errorf(errdefs.ErrUnavailable, err, "record the URL of sha256:%s", hex)
	}
	_, err = f.Write(formatURLs(keys))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = unix.Renameat(int(r.urls.Fd()), tmp, int(r.urls.Fd()), hex)
	}
	if err != nil {
		_ = removeAt(r.urls, tmp)
		return errorf(errdefs.ErrUnavailable, err, "write %s", r.label(urlsDir, hex))
	}
	return nil
}

// removeURLs removes the record of the URLs of the disk hex, whose digest
// lock the caller holds.
func removeURLs(r *root, hex string) error {
	return errors.Join(removeAt(r.urls, hex), removeAt(r.urls, hex+urlsNewSuffix))
}
