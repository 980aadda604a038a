package diskcache

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

// getOK runs Get and checks it returns body.
func getOK(t *testing.T, c *Cache, rawURL string, body []byte, p Progress) {
	t.Helper()
	d, err := c.Get(context.Background(), mustURL(t, rawURL), sum(body), p)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if d.Size != int64(len(body)) || sum(readAll(t, d)) != sum(body) {
		t.Fatalf("disk is wrong: %d bytes", d.Size)
	}
}

// TestResume shows how a dropped connection is resumed, depending on how
// the server answers the Range request.
func TestResume(t *testing.T) {
	body := pattern(512 << 10)
	const half = 256 << 10
	for _, tc := range []struct {
		name   string
		f      *fake
		ranges []string // Range|If-Range of each request
		line   string   // a progress line
		full   int32    // whole bodies the server sent
	}{
		{"etag", &fake{drops: 1, dropAt: half, etag: `"v1"`},
			[]string{"|", `bytes=262144-|"v1"`}, "resuming http", 0},
		{"no validator", &fake{drops: 1, dropAt: half},
			[]string{"|", "bytes=262144-|"}, "at 262144 bytes", 0},
		{"two drops", &fake{drops: 2, dropAt: half},
			[]string{"|", "bytes=262144-|", "bytes=262144-|"}, "retrying in", 0},
		{"range ignored", &fake{drops: 1, dropAt: half, ignoreRange: true},
			[]string{"|", "bytes=262144-|"}, "the server sent the whole file", 1},
		{"content-range from 0", &fake{drops: 1, dropAt: half, badRange: true},
			[]string{"|", "bytes=262144-|", "|"}, `with a Content-Range of "bytes 0-524287/524288"`, 1},
		{"if-range mismatch", &fake{drops: 1, dropAt: half, etag: `"v1"`, etagLater: `"v2"`},
			[]string{"|", `bytes=262144-|"v1"`}, "the server sent the whole file", 1},
		{"content-length too long", &fake{lieLength: 1 << 20},
			[]string{"|", "bytes=524288-|"}, "download interrupted at 524288 bytes: unexpected EOF", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.f.body = body
			srv := newFake(t, tc.f)
			c := testCache(t)
			var got lines
			getOK(t, c, srv.URL+"/d", body, got.add)
			if tc.ranges != nil && strings.Join(tc.f.rangesSeen(), " ") != strings.Join(tc.ranges, " ") {
				t.Errorf("requests %q, want %q", tc.f.rangesSeen(), tc.ranges)
			}
			if tc.line != "" && !got.has(tc.line) {
				t.Errorf("no line %q in:\n%s", tc.line, &got)
			}
			if n := tc.f.full.Load(); n != tc.full {
				t.Errorf("%d whole bodies, want %d", n, tc.full)
			}
		})
	}
}

// TestResumeLeftover shows a partial download left by a process that died
// is hashed and resumed; a wrong one is downloaded again, and a complete
// one (the crash came before the rename) costs only a 416.
func TestResumeLeftover(t *testing.T) {
	body := pattern(300 << 10)
	for _, tc := range []struct {
		name     string
		leftover []byte
		ranges   string
		full     int32
	}{
		{"half", body[:100<<10], "bytes=102400-|", 0},
		{"garbage", pattern(100 << 10)[1:], "bytes=102399-| |", 1},
		{"complete", body, "bytes=307200-|", 0},
		{"too long", append(append([]byte(nil), body...), 1, 2, 3), "bytes=307203-| |", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fake{body: body}
			srv := newFake(t, f)
			c := testCache(t)
			if err := os.MkdirAll(filepath.Join(c.Dir, tmpDir), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(c.Dir, tmpDir, sum(body)+partSuffix), tc.leftover, 0o600); err != nil {
				t.Fatal(err)
			}
			var got lines
			getOK(t, c, srv.URL+"/d", body, got.add)
			if seen := strings.Join(f.rangesSeen(), " "); seen != tc.ranges {
				t.Errorf("requests %q, want %q", seen, tc.ranges)
			}
			if !got.has("found ") {
				t.Errorf("no line about the leftover in:\n%s", &got)
			}
			if n := f.full.Load(); n != tc.full {
				t.Errorf("%d whole bodies, want %d", n, tc.full)
			}
		})
	}
}

// TestResumeGivesUp shows a server that keeps dropping the connection at
// the same byte fails after a few attempts without progress, with a
// one-line error, and leaves nothing of the download behind.
func TestResumeGivesUp(t *testing.T) {
	body := pattern(64 << 10)
	f := &fake{body: body, drops: 100, dropAt: 1000}
	srv := newFake(t, f)
	c := testCache(t)
	u := mustURL(t, srv.URL+"/d")
	_, err := c.Get(context.Background(), u, sum(body), nil)
	if err == nil || !errdefs.IsUnavailable(err) || !strings.HasPrefix(err.Error(), "disk-url "+u.Redacted()+": ") {
		t.Fatalf("error %v", err)
	}
	checkOneLine(t, err)
	if n := f.requests.Load(); n != 3 {
		t.Errorf("%d requests, want 3", n)
	}
	for _, sub := range []string{tmpDir, locksDir} {
		if left := files(t, c, sub); len(left) != 0 {
			t.Errorf("%s: left %v", sub, left)
		}
	}
}

// TestStall shows a stalled body ends with the context, promptly, leaving
// no partial download (the next Get starts again); and that without a
// deadline the stall watchdog retries by itself.
func TestStall(t *testing.T) {
	body := pattern(256 << 10)
	f := &fake{body: body, stallAt: 100 << 10, stalls: 1}
	srv := newFake(t, f)
	c := testCache(t)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.Get(ctx, mustURL(t, srv.URL+"/d"), sum(body), nil)
	if err == nil || !errdefs.IsDeadlineExceeded(err) || time.Since(start) > 3*time.Second {
		t.Fatalf("error %v after %s", err, time.Since(start))
	}
	checkOneLine(t, err)
	if left := files(t, c, tmpDir); len(left) != 0 {
		t.Fatalf("temp files left: %v", left)
	}
	getOK(t, c, srv.URL+"/d", body, nil)
	if seen := f.rangesSeen(); len(seen) != 2 || seen[1] != "|" {
		t.Fatalf("requests %q", seen)
	}

	f2 := &fake{body: body, stallAt: 100 << 10, stalls: 1}
	srv2 := newFake(t, f2)
	c2 := testCache(t)
	c2.stall = 200 * time.Millisecond
	var got lines
	getOK(t, c2, srv2.URL+"/d", body, got.add)
	if !got.has("no data for 200ms at 102400 bytes; retrying") {
		t.Fatalf("no stall line in:\n%s", &got)
	}
}

// TestCancelWhileWaiting shows a Get waiting for another's download ends
// with its context.
func TestCancelWhileWaiting(t *testing.T) {
	c := testCache(t)
	r, err := openRoot(c.Dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.close()
	h := sum([]byte("x"))
	l, err := lockDigest(context.Background(), r, h, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	var got lines
	_, err = c.Get(ctx, mustURL(t, "http://127.0.0.1:1/x"), h, got.add)
	if !errdefs.IsDeadlineExceeded(err) || !got.has("waiting for another shim") {
		t.Fatalf("error %v, lines:\n%s", err, &got)
	}
}
