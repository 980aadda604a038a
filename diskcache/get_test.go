package diskcache

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"github.com/ulikunitz/xz"
	"golang.org/x/sys/unix"
)

// compress returns b compressed in format ("" for as is).
func compress(t testing.TB, format string, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	var w io.WriteCloser
	var err error
	switch format {
	case "":
		return b
	case formatGzip:
		w = gzip.NewWriter(&buf)
	case formatXZ:
		w, err = xz.NewWriter(&buf)
	case formatZstd:
		w, err = zstd.NewWriter(&buf)
	}
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// readAll reads the whole disk from offset 0.
func readAll(t *testing.T, d *Disk) []byte {
	t.Helper()
	b, err := io.ReadAll(io.NewSectionReader(d.File, 0, 1<<40))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestGetFormats shows each format served is stored decompressed (anything
// else as is), read-only, in use, and found in the cache the second time.
func TestGetFormats(t *testing.T) {
	disk := append([]byte("QFI\xfb"), pattern(300<<10)...)
	for _, format := range []string{"", formatGzip, formatXZ, formatZstd} {
		t.Run("format="+format, func(t *testing.T) {
			body := compress(t, format, disk)
			f := &fake{body: body, etag: `"v1"`}
			srv := newFake(t, f)
			c := testCache(t)
			var got lines
			d, err := c.Get(context.Background(), mustURL(t, srv.URL+"/disk"), "sha256:"+strings.ToUpper(sum(body)), got.add)
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			if !bytes.Equal(readAll(t, d), disk) || d.Size != int64(len(disk)) || d.Digest != sum(body) {
				t.Fatalf("disk is wrong: size %d digest %s", d.Size, d.Digest)
			}
			st, err := os.Lstat(filepath.Join(c.Dir, disksDir, sum(body)))
			if err != nil || st.Mode().Perm() != 0o444 {
				t.Fatalf("final file: %v %v", st, err)
			}
			if _, err := d.File.Write([]byte("x")); err == nil {
				t.Fatal("disk file is writable")
			}
			other, err := os.Open(filepath.Join(c.Dir, disksDir, sum(body)))
			if err != nil {
				t.Fatal(err)
			}
			defer other.Close()
			if err := unix.Flock(int(other.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != unix.EWOULDBLOCK {
				t.Fatalf("disk is not locked shared: %v", err)
			}
			for _, want := range []string{"vmshim: downloading " + srv.URL + "/disk", "verified sha256:" + sum(body)} {
				if !got.has(want) {
					t.Errorf("no progress line %q in:\n%s", want, &got)
				}
			}
			if format != "" && !got.has("decompressing") {
				t.Errorf("no decompressing line in:\n%s", &got)
			}
			if tmp := files(t, c, tmpDir); len(tmp) != 0 {
				t.Errorf("temp files left: %v", tmp)
			}
			d2, err := c.Get(context.Background(), mustURL(t, srv.URL+"/disk"), sum(body), nil)
			if err != nil {
				t.Fatal(err)
			}
			d2.Close()
			if n := f.requests.Load(); n != 1 {
				t.Fatalf("%d requests, want 1 (the second Get must use the cache)", n)
			}
		})
	}
}

// TestGetMismatch shows a wrong digest fails with the one-line message and
// leaves nothing in the cache.
func TestGetMismatch(t *testing.T) {
	body := pattern(100 << 10)
	srv := newFake(t, &fake{body: body})
	c := testCache(t)
	want := sum([]byte("other"))
	u := mustURL(t, srv.URL+"/disk.img")
	_, err := c.Get(context.Background(), u, want, nil)
	if err == nil {
		t.Fatal("no error")
	}
	msg := "disk-url " + u.Redacted() + ": sha256 is " + sum(body) + ", want " + want
	if err.Error() != msg || !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("error %q (%T), want %q", err, err, msg)
	}
	for _, sub := range []string{disksDir, tmpDir, locksDir} {
		if left := files(t, c, sub); len(left) != 0 {
			t.Errorf("%s: left %v", sub, left)
		}
	}
}

// TestGetStatus shows HTTP errors are one-line, kinded, not retried, and
// never show the URL's password.
func TestGetStatus(t *testing.T) {
	for _, tc := range []struct {
		status int
		is     func(error) bool
		msg    string
	}{
		{404, errdefs.IsNotFound, "HTTP 404 Not Found"},
		{500, errdefs.IsFailedPrecondition, "HTTP 500 Internal Server Error"},
		{403, errdefs.IsFailedPrecondition, "HTTP 403 Forbidden"},
	} {
		f := &fake{status: tc.status}
		srv := newFake(t, f)
		c := testCache(t)
		u := mustURL(t, strings.Replace(srv.URL, "://", "://user:s3cret@", 1)+"/d")
		_, err := c.Get(context.Background(), u, sum(nil), nil)
		if err == nil || !tc.is(err) || err.Error() != "disk-url "+u.Redacted()+": "+tc.msg {
			t.Fatalf("HTTP %d: error %v", tc.status, err)
		}
		checkOneLine(t, err, "s3cret")
		if n := f.requests.Load(); n != 1 {
			t.Fatalf("HTTP %d: %d requests, want 1", tc.status, n)
		}
	}
}

// TestGetUnreachable shows a connection failure names the URL (redacted)
// and the cause on one line, after a few attempts.
func TestGetUnreachable(t *testing.T) {
	srv := newFake(t, &fake{})
	raw := strings.Replace(srv.URL, "://", "://user:s3cret@", 1) + "/d"
	srv.Close()
	c := testCache(t)
	u := mustURL(t, raw)
	_, err := c.Get(context.Background(), u, sum(nil), nil)
	if err == nil || !errdefs.IsUnavailable(err) || !strings.HasPrefix(err.Error(), "disk-url "+u.Redacted()+": ") ||
		!strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("error %v", err)
	}
	checkOneLine(t, err, "s3cret")
}

// TestGetLimits shows MaxDisk bounds the download (by Content-Length, or
// by a body that grows past it) and the decompressed disk (bombs), leaving
// nothing behind.
func TestGetLimits(t *testing.T) {
	const maxDisk = 1 << 20
	zeros := make([]byte, 4*maxDisk)
	for _, tc := range []struct {
		name string
		f    *fake
	}{
		{"content-length", &fake{body: pattern(maxDisk + 1)}},
		{"chunked", &fake{body: pattern(2 * maxDisk), chunked: true}},
		{"lying content-length", &fake{body: pattern(2 * maxDisk), lieLength: 1000}},
		{"gzip bomb", &fake{body: compress(t, formatGzip, zeros)}},
		{"xz bomb", &fake{body: compress(t, formatXZ, zeros)}},
		{"zstd bomb", &fake{body: compress(t, formatZstd, zeros)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newFake(t, tc.f)
			c := testCache(t)
			c.MaxDisk = maxDisk
			u := mustURL(t, srv.URL+"/disk")
			_, err := c.Get(context.Background(), u, sum(tc.f.body), nil)
			if tc.name == "lying content-length" {
				// Go reads the 1000 bytes announced: the digest is wrong.
				if err == nil || !strings.Contains(err.Error(), "sha256 is") {
					t.Fatalf("error %v", err)
				}
				return
			}
			if err == nil || !errdefs.IsFailedPrecondition(err) ||
				!strings.HasPrefix(err.Error(), "disk-url "+u.Redacted()) ||
				!strings.HasSuffix(err.Error(), "is larger than 1048576 bytes (config max_disk_size)") {
				t.Fatalf("error %v", err)
			}
			checkOneLine(t, err)
			for _, sub := range []string{disksDir, tmpDir} {
				if left := files(t, c, sub); len(left) != 0 {
					t.Errorf("%s: left %v", sub, left)
				}
			}
		})
	}
}

// TestGetXZDictionary shows an xz file whose dictionary would take more
// memory than allowed is refused before decompression.
func TestGetXZDictionary(t *testing.T) {
	body := compress(t, formatXZ, pattern(1000))
	patchXZDict(t, body, 40) // 4 GiB
	srv := newFake(t, &fake{body: body})
	c := testCache(t)
	_, err := c.Get(context.Background(), mustURL(t, srv.URL+"/d.xz"), sum(body), nil)
	if err == nil || !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "xz dictionary over 128.0 MiB") {
		t.Fatalf("error %v", err)
	}
}

// TestGetBadURLAndDigest shows Get checks its arguments.
func TestGetBadURLAndDigest(t *testing.T) {
	c := testCache(t)
	if _, err := c.Get(context.Background(), mustURL(t, "http://x/"), "abc", nil); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("bad digest: %v", err)
	}
	u := mustURL(t, "http://x/")
	u.Scheme = "file"
	if _, err := c.Get(context.Background(), u, sum(nil), nil); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("file URL: %v", err)
	}
}

// TestCacheDir shows the directory is made 0700 and a symlink is refused.
func TestCacheDir(t *testing.T) {
	dir := t.TempDir()
	c := &Cache{Dir: filepath.Join(dir, "a", "b"), MaxSize: 1}
	if err := c.Evict(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{c.Dir, filepath.Join(c.Dir, disksDir), filepath.Join(c.Dir, locksDir)} {
		if st, err := os.Lstat(p); err != nil || st.Mode().Perm() != 0o700 {
			t.Fatalf("%s: %v %v", p, st, err)
		}
	}
	if err := os.Chmod(c.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := c.Evict(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Lstat(c.Dir); st.Mode().Perm() != 0o700 {
		t.Fatalf("mode %v not fixed", st.Mode())
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(c.Dir, link); err != nil {
		t.Fatal(err)
	}
	c2 := &Cache{Dir: link, MaxSize: 1}
	if err := c2.Evict(context.Background()); err == nil || !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("symlink dir: %v", err)
	}
}
