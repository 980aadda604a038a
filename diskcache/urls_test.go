package diskcache

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// urlsOf returns the keys recorded for the cached disk of body.
func urlsOf(t *testing.T, dir string, body []byte) []string {
	t.Helper()
	r, err := openRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.close()
	return readURLs(r, sum(body))
}

// has reports whether keys holds the key of u.
func hasURL(t *testing.T, keys []string, u string) bool {
	t.Helper()
	k := urlKey(mustURL(t, u))
	for _, have := range keys {
		if have == k {
			return true
		}
	}
	return false
}

// TestURLRecorded shows a download records the hash of its URL, not the
// URL: no credential of it lands on disk.
func TestURLRecorded(t *testing.T) {
	f := &fake{body: pattern(50 << 10)}
	srv := newFake(t, f)
	c := testCache(t)
	u := strings.Replace(srv.URL, "http://", "http://user:s3cret@", 1) + "/d"
	getOK(t, c, u, f.body, nil)
	keys := urlsOf(t, c.Dir, f.body)
	if len(keys) != 1 || !hasURL(t, keys, u) {
		t.Fatalf("recorded %q, want the key of %s alone", keys, u)
	}
	b, err := os.ReadFile(filepath.Join(c.Dir, urlsDir, sum(f.body)))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "s3cret") || strings.Contains(string(b), "127.0.0.1") {
		t.Errorf("urls file shows the URL: %q", b)
	}
}

// TestURLProve shows a pod naming a cached digest with a URL it was not
// fetched from gets the disk only after that URL served its bytes in
// full; the URL is then recorded, and the next Get with it is a cache hit
// of one one-byte request.
func TestURLProve(t *testing.T) {
	f := &fake{body: pattern(200 << 10)}
	dir, first := cachedDisk(t, f)
	mirror := &fake{body: f.body}
	u := newFake(t, mirror).URL + "/mirror"
	c := &Cache{Dir: dir}
	var got lines
	d, err := c.Get(context.Background(), mustURL(t, u), sum(f.body), got.add)
	if err != nil {
		t.Fatal(err)
	}
	d.Close()
	if mirror.requests.Load() != 1 || mirror.full.Load() != 1 || mirror.probes.Load() != 1 {
		t.Errorf("the new URL had %d requests (%d whole) and %d probes, want one probe and one whole download", mirror.requests.Load(), mirror.full.Load(), mirror.probes.Load())
	}
	if !got.has("was not fetched from") || !got.has("served the same bytes") || !used(t, dir, f.body) {
		t.Errorf("the disk was not used, or the lines do not say why:\n%s", &got)
	}
	keys := urlsOf(t, dir, f.body)
	if len(keys) != 2 || !hasURL(t, keys, first) || !hasURL(t, keys, u) {
		t.Errorf("recorded %q, want the first URL's and the new one's", keys)
	}
	if names := files(t, c, tmpDir); len(names) != 0 {
		t.Errorf("tmp/ holds %q after the check", names)
	}
	d, err = c.Get(context.Background(), mustURL(t, u), sum(f.body), nil)
	if err != nil {
		t.Fatal(err)
	}
	d.Close()
	if mirror.requests.Load() != 1 || mirror.probes.Load() != 2 {
		t.Errorf("the second Get made %d requests and %d probes in all, want the first download's 1 and one probe more", mirror.requests.Load(), mirror.probes.Load())
	}
}

// TestURLProveWrong shows a pod that knows a cached digest but names a
// server of its own gets nothing: the server answers the one-byte request
// and serves other bytes (all of them, or a body cut short). The refusal is
// one line; the cached disk is not opened and the URL not recorded.
func TestURLProveWrong(t *testing.T) {
	for _, tc := range []struct {
		name string
		body func([]byte) []byte
	}{
		{"other bytes", func(b []byte) []byte { o := append([]byte(nil), b...); o[len(o)/2] ^= 1; return o }},
		{"first byte only", func(b []byte) []byte { return b[:1] }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fake{body: pattern(100 << 10)}
			dir, first := cachedDisk(t, f)
			liar := &fake{body: tc.body(f.body)}
			u := newFake(t, liar).URL + "/liar"
			c := &Cache{Dir: dir, attempts: 1}
			_, err := c.Get(context.Background(), mustURL(t, u), sum(f.body), nil)
			want := "disk-url " + u + ": sha256 is "
			if err == nil || !errdefs.IsFailedPrecondition(err) || !strings.HasPrefix(err.Error(), want) {
				t.Fatalf("error %v, want %q…", err, want)
			}
			checkOneLine(t, err)
			if used(t, dir, f.body) {
				t.Errorf("the cached disk was opened")
			}
			keys := urlsOf(t, dir, f.body)
			if len(keys) != 1 || !hasURL(t, keys, first) {
				t.Errorf("recorded %q, want the first URL's alone", keys)
			}
			if names := files(t, c, tmpDir); len(names) != 0 {
				t.Errorf("tmp/ holds %q after the refusal", names)
			}
			if names := files(t, c, locksDir); len(names) != 0 {
				t.Errorf("locks/ holds %q after the refusal", names)
			}
		})
	}
}

// TestURLsPlanted shows a urls file that is a FIFO, a symlink (to a file
// naming the URL), too big or not keys counts as empty: the URL must serve
// the bytes again, nothing blocks, and the file is then a regular one
// naming the URL.
func TestURLsPlanted(t *testing.T) {
	for _, tc := range []struct {
		name  string
		plant func(t *testing.T, path, key string)
	}{
		{"fifo", func(t *testing.T, path, _ string) {
			if err := unix.Mkfifo(path, 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{"symlink", func(t *testing.T, path, key string) {
			target := filepath.Join(t.TempDir(), "urls")
			if err := os.WriteFile(target, []byte(key+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(target, path); err != nil {
				t.Fatal(err)
			}
		}},
		{"oversized", func(t *testing.T, path, key string) {
			if err := os.WriteFile(path, []byte(strings.Repeat(key+"\n", maxURLsFile/len(key)+1)), 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{"garbage", func(t *testing.T, path, key string) {
			if err := os.WriteFile(path, []byte(key+"\nnot a key\n"), 0o600); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fake{body: pattern(64 << 10)}
			dir, u := cachedDisk(t, f)
			path := filepath.Join(dir, urlsDir, sum(f.body))
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
			tc.plant(t, path, urlKey(mustURL(t, u)))
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			c := &Cache{Dir: dir}
			d, err := c.Get(ctx, mustURL(t, u), sum(f.body), nil)
			if err != nil {
				t.Fatal(err)
			}
			d.Close()
			if f.requests.Load() != 2 || f.probes.Load() != 1 {
				t.Errorf("%d requests and %d probes, want the first download, a probe and a second download", f.requests.Load(), f.probes.Load())
			}
			var st unix.Stat_t
			if err := unix.Lstat(path, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
				t.Fatalf("urls file is not a regular file: %v, mode %o", err, st.Mode)
			}
			if keys := urlsOf(t, dir, f.body); len(keys) != 1 || !hasURL(t, keys, u) {
				t.Errorf("recorded %q, want the URL's key alone", keys)
			}
		})
	}
}

// TestURLsBounded shows at most maxURLs URLs are recorded for a disk, the
// oldest dropped, and one recorded again becomes the newest.
func TestURLsBounded(t *testing.T) {
	r, err := openRoot(filepath.Join(t.TempDir(), "cache"))
	if err != nil {
		t.Fatal(err)
	}
	defer r.close()
	hex := sum([]byte("disk"))
	u := func(i int) string { return fmt.Sprintf("http://example.test/%d", i) }
	for i := range maxURLs + 8 {
		if err := recordURL(r, hex, mustURL(t, u(i)), i == 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := recordURL(r, hex, mustURL(t, u(8)), false); err != nil {
		t.Fatal(err)
	}
	keys := readURLs(r, hex)
	if len(keys) != maxURLs || hasURL(t, keys, u(7)) || !hasURL(t, keys, u(9)) || keys[len(keys)-1] != urlKey(mustURL(t, u(8))) {
		t.Errorf("%d keys, want %d without the oldest 8 and with the 9th, the 8th again last", len(keys), maxURLs)
	}
	if err := recordURL(r, hex, mustURL(t, u(0)), true); err != nil {
		t.Fatal(err)
	}
	if keys := readURLs(r, hex); len(keys) != 1 {
		t.Errorf("a fresh record has %d keys, want 1", len(keys))
	}
	if names, _ := os.ReadDir(r.label(urlsDir, "")); len(names) != 1 {
		t.Errorf("urls/ holds %d files, want 1", len(names))
	}
}

// TestURLsEvicted shows the record of a disk's URLs goes with the disk,
// by Evict and by Remove.
func TestURLsEvicted(t *testing.T) {
	for _, how := range []string{"evict", "remove"} {
		t.Run(how, func(t *testing.T) {
			f := &fake{body: pattern(64 << 10)}
			dir, _ := cachedDisk(t, f)
			c := &Cache{Dir: dir, MaxSize: 1}
			if how == "evict" {
				if err := c.Evict(context.Background()); err != nil {
					t.Fatal(err)
				}
			} else if gone, err := c.Remove(sum(f.body)); err != nil || !gone {
				t.Fatalf("remove: %v, %v", gone, err)
			}
			if names := files(t, c, disksDir); len(names) != 0 {
				t.Fatalf("sha256/ holds %q", names)
			}
			if names := files(t, c, urlsDir); len(names) != 0 {
				t.Errorf("urls/ holds %q after the disk went", names)
			}
		})
	}
}
