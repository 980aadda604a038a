package diskcache

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
)

// zstdBomb returns a zstd stream of n MiB of zeros: one frame of 1 MiB of
// zeros, repeated (a stream may hold many frames), which is quick to make
// and a few bytes a MiB.
func zstdBomb(t testing.TB, n int) []byte {
	t.Helper()
	var frame bytes.Buffer
	w, err := zstd.NewWriter(&frame, zstd.WithEncoderLevel(zstd.SpeedFastest))
	if err != nil {
		t.Fatal(err)
	}
	w.Write(make([]byte, 1<<20))
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return bytes.Repeat(frame.Bytes(), n)
}

// gzipBomb is zstdBomb's gzip twin: n members of 1 MiB of zeros.
func gzipBomb(t testing.TB, n int) []byte {
	t.Helper()
	var member bytes.Buffer
	w, _ := gzip.NewWriterLevel(&member, gzip.BestCompression)
	w.Write(make([]byte, 1<<20))
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return bytes.Repeat(member.Bytes(), n)
}

// assertNoTemps fails if the cache holds a temp file, or a lock file for
// digest hex.
func assertNoTemps(t *testing.T, c *Cache, hex string) {
	t.Helper()
	if left := files(t, c, tmpDir); len(left) != 0 {
		t.Errorf("temp files left: %v", left)
	}
	if exists(c, locksDir, hex) {
		t.Errorf("lock file of %s left", hex)
	}
}

// TestDownloadLimit shows max_download_size refuses a download by its
// Content-Length before the body is read, and a body that grows past it,
// in one line naming the key, leaving nothing behind.
func TestDownloadLimit(t *testing.T) {
	const limit = 1 << 20
	for _, tc := range []struct {
		name string
		f    *fake
	}{
		{"content-length", &fake{body: pattern(limit + 1)}},
		{"chunked", &fake{body: pattern(2 * limit), chunked: true}},
		{"content-length lies upwards", &fake{body: pattern(1000), lieLength: 2 * limit}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newFake(t, tc.f)
			c := testCache(t)
			c.MaxDownload, c.MaxDisk = limit, 1<<30
			u := mustURL(t, srv.URL+"/d")
			_, err := c.Get(context.Background(), u, sum(tc.f.body), nil)
			want := "disk-url " + u.Redacted() + ": download is larger than 1048576 bytes (config max_download_size)"
			if err == nil || err.Error() != want || !errdefs.IsFailedPrecondition(err) {
				t.Fatalf("error %v, want %q", err, want)
			}
			if n := tc.f.requests.Load(); n != 1 {
				t.Errorf("%d requests, want 1 (a refusal is not retried)", n)
			}
			assertNoTemps(t, c, sum(tc.f.body))
		})
	}
}

// TestDecompressionRatio shows bombs in each format fail in one line
// naming max_decompression_ratio, with little written, and leave nothing;
// a disk that compresses less than the ratio is fine. The zstd bomb is
// 1 GiB of zeros.
func TestDecompressionRatio(t *testing.T) {
	for _, tc := range []struct {
		name string
		body []byte
	}{
		{"zstd", zstdBomb(t, 1024)},
		{"gzip", gzipBomb(t, 64)},
		{"xz", compress(t, formatXZ, make([]byte, 2<<20))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newFake(t, &fake{body: tc.body})
			c := testCache(t)
			c.MaxRatio, c.MaxDisk, c.MaxSize = 100, 256<<30, 1<<30
			u := mustURL(t, srv.URL+"/d")
			_, err := c.Get(context.Background(), u, sum(tc.body), nil)
			want := fmt.Sprintf("disk-url %s: decompressed disk is larger than %d bytes, 100 times the %d-byte download (config max_decompression_ratio)",
				u.Redacted(), 100*len(tc.body), len(tc.body))
			if err == nil || err.Error() != want || !errdefs.IsFailedPrecondition(err) {
				t.Fatalf("error %v, want %q", err, want)
			}
			assertNoTemps(t, c, sum(tc.body))
			if left := files(t, c, disksDir); len(left) != 0 {
				t.Errorf("disks left: %v", left)
			}
		})
	}
	disk := make([]byte, 1<<20)
	rand.NewChaCha8([32]byte{1}).Read(disk[:len(disk)/64]) // compresses about 50 times
	body := compress(t, formatZstd, disk)
	srv := newFake(t, &fake{body: body})
	c := testCache(t)
	c.MaxRatio = 100
	got, err := c.Get(context.Background(), mustURL(t, srv.URL+"/d"), sum(body), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer got.Close()
	if !bytes.Equal(readAll(t, got), disk) {
		t.Fatal("disk is wrong")
	}
}

// TestReserve shows a download reserves its size before it writes,
// evicting the oldest unused disk to make room, and is refused in one
// line naming cache_max_size when disks in use leave too little; a
// decompression that outgrows the room is refused the same way.
func TestReserve(t *testing.T) {
	const size = 100 << 10
	a, b, cc, d := pattern(size), pattern(size+1), pattern(size+size/2), pattern(2*size)
	gz := compress(t, formatGzip, make([]byte, 4*size)) // small download, large disk
	base := multiFake(t, map[string][]byte{"/a": a, "/b": b, "/c": cc, "/d": d, "/gz": gz})
	c := testCache(t)
	c.MaxSize = 3 * size
	diskA, err := c.Get(context.Background(), mustURL(t, base+"/a"), sum(a), nil)
	if err != nil {
		t.Fatal(err)
	}
	diskA.Close()
	diskB, err := c.Get(context.Background(), mustURL(t, base+"/b"), sum(b), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer diskB.Close() // in use
	age(t, c, disksDir, sum(a), time.Hour)

	getOK(t, c, base+"/c", cc, nil) // 350 KiB > 300 KiB: a goes first
	if exists(c, disksDir, sum(a)) || !exists(c, disksDir, sum(b)) || !exists(c, disksDir, sum(cc)) {
		t.Fatalf("disks %v: want a evicted for c, b kept", files(t, c, disksDir))
	}

	// b is in use and c is newer than b: 200 KiB does not fit in the
	// 50 KiB left after evicting c.
	u := mustURL(t, base+"/d")
	_, err = c.Get(context.Background(), u, sum(d), nil)
	want := fmt.Sprintf("disk-url %s: no room in the disk cache for the download: it needs at least %d bytes, and disks in use and other downloads leave %d of %d bytes (config cache_max_size)",
		u.Redacted(), len(d), 3*size-len(b), 3*size)
	if err == nil || err.Error() != want {
		t.Fatalf("error %v, want %q", err, want)
	}
	assertNoTemps(t, c, sum(d))

	u = mustURL(t, base+"/gz")
	_, err = c.Get(context.Background(), u, sum(gz), nil)
	if err == nil || !strings.Contains(err.Error(), "no room in the disk cache for the decompressed disk") ||
		!strings.HasSuffix(err.Error(), "(config cache_max_size)") {
		t.Fatalf("error %v", err)
	}
	checkOneLine(t, err)
	assertNoTemps(t, c, sum(gz))
}

// TestReserveConcurrent shows a download in progress in another Cache
// (another shim) holds its reservation: a second download that would
// overshoot the cap with it is refused, and the first completes.
func TestReserveConcurrent(t *testing.T) {
	const size = 200 << 10
	x, y := pattern(size), pattern(size+1)
	fx := &fake{body: x, gate: make(chan struct{})}
	srv := httptest.NewServer(httpMux{"/x": fx, "/y": {body: y}})
	defer srv.Close()
	dir := testCache(t).Dir
	c1 := &Cache{Dir: dir, MaxSize: 300 << 10}
	c2 := &Cache{Dir: dir, MaxSize: 300 << 10}
	done := make(chan error, 1)
	go func() {
		d, err := c1.Get(context.Background(), mustURL(t, srv.URL+"/x"), sum(x), nil)
		if err == nil {
			d.Close()
		}
		done <- err
	}()
	reserved := filepath.Join(dir, tmpDir, sum(x)+reserveSuffix)
	for {
		if st, err := os.Stat(reserved); err == nil && st.Size() == size {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("x finished before its reservation was seen: %v", err)
		case <-time.After(5 * time.Millisecond):
		}
	}
	_, err := c2.Get(context.Background(), mustURL(t, srv.URL+"/y"), sum(y), nil)
	close(fx.gate)
	if err == nil || !strings.Contains(err.Error(), "no room in the disk cache for the download") || !strings.HasSuffix(err.Error(), "(config cache_max_size)") {
		t.Fatalf("y: error %v", err)
	}
	if err := <-done; err != nil {
		t.Fatalf("x: %v", err)
	}
	if got := files(t, c1, disksDir); len(got) != 1 || got[0] != sum(x) {
		t.Fatalf("disks %v, want x alone", got)
	}
	if left := files(t, c1, tmpDir); len(left) != 0 {
		t.Fatalf("temp files left: %v", left)
	}
}

// TestStaleTemps shows the temp files and reservation of a process that
// died (their digest lock is free) are removed by the next Get of another
// digest, with a cap or without, and do not count against the cap.
func TestStaleTemps(t *testing.T) {
	body := pattern(100 << 10)
	srv := newFake(t, &fake{body: body})
	for _, maxSize := range []int64{0, 1 << 20} {
		c := testCache(t)
		c.MaxSize = maxSize
		if err := os.MkdirAll(filepath.Join(c.Dir, tmpDir), 0o700); err != nil {
			t.Fatal(err)
		}
		dead := sum([]byte("dead"))
		for name, n := range map[string]int64{dead + partSuffix: 10 << 10, dead + unpackSuffix: 10 << 10, dead + reserveSuffix: 10 << 30} {
			f, err := os.Create(filepath.Join(c.Dir, tmpDir, name))
			if err != nil {
				t.Fatal(err)
			}
			f.Truncate(n)
			f.Close()
		}
		getOK(t, c, srv.URL+"/d", body, nil)
		if left := files(t, c, tmpDir); len(left) != 0 {
			t.Fatalf("MaxSize %d: temp files left: %v", maxSize, left)
		}
	}
}

// TestTrickle shows a server that trickles a download (64 KiB every
// 50 ms: never a stall, and 50 s for the whole) holds the digest lock no
// longer than download_timeout, and that a Get waiting for that digest
// ends with its own deadline, in one line saying what it waited for;
// neither leaves a file.
func TestTrickle(t *testing.T) {
	body := bytes.Repeat(pattern(64<<10), 1024)
	f := &fake{body: body, delay: 50 * time.Millisecond}
	srv := newFake(t, f)
	c := testCache(t)
	c.DownloadTimeout = 3 * time.Second
	u := mustURL(t, srv.URL+"/d")
	done := make(chan error, 1)
	go func() {
		_, err := c.Get(context.Background(), u, sum(body), nil)
		done <- err
	}()
	for f.requests.Load() == 0 {
		time.Sleep(5 * time.Millisecond)
	}
	waiter := &Cache{Dir: c.Dir}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := waiter.Get(ctx, u, sum(body), nil)
	if err == nil || !errdefs.IsDeadlineExceeded(err) ||
		!strings.HasPrefix(err.Error(), "another shim is downloading sha256:"+sum(body)+"; waited ") {
		t.Fatalf("waiter: error %v", err)
	}
	checkOneLine(t, err)
	err = <-done
	if err == nil || !errdefs.IsDeadlineExceeded(err) ||
		!strings.HasSuffix(err.Error(), "took longer than 3s (config download_timeout)") {
		t.Fatalf("trickled download: error %v", err)
	}
	checkOneLine(t, err)
	assertNoTemps(t, c, sum(body))
}
