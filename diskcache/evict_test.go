package diskcache

import (
	"context"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// multiFake serves several bodies by path.
func multiFake(t *testing.T, bodies map[string][]byte) string {
	t.Helper()
	mux := make(map[string]*fake)
	for p, b := range bodies {
		mux[p] = &fake{body: b}
	}
	srv := httptest.NewServer(httpMux(mux))
	t.Cleanup(srv.Close)
	return srv.URL
}

// exists reports whether the cache has sub/name.
func exists(c *Cache, sub, name string) bool {
	_, err := os.Lstat(filepath.Join(c.Dir, sub, name))
	return err == nil
}

// age sets the mtime of sub/name to d ago.
func age(t *testing.T, c *Cache, sub, name string, d time.Duration) {
	t.Helper()
	when := time.Now().Add(-d)
	if err := os.Chtimes(filepath.Join(c.Dir, sub, name), when, when); err != nil {
		t.Fatal(err)
	}
}

// TestEvict shows eviction removes the oldest unused disks and stale temp
// files until the cache fits, keeps a disk in use (even when only a dup of
// its descriptor is left open) and the disk just returned, and skips files
// whose digest lock is held.
func TestEvict(t *testing.T) {
	const size = 100 << 10
	a, b, cc, d := pattern(size), pattern(size+1), pattern(size+2), pattern(size+3)
	base := multiFake(t, map[string][]byte{"/a": a, "/b": b, "/c": cc, "/d": d})
	c := testCache(t)
	c.MaxSize = 2*size + size/2
	get := func(path string, body []byte) *Disk {
		t.Helper()
		disk, err := c.Get(context.Background(), mustURL(t, base+path), sum(body), nil)
		if err != nil {
			t.Fatal(err)
		}
		return disk
	}
	diskA := get("/a", a) // held open: in use
	get("/b", b).Close()
	age(t, c, disksDir, sum(a), 3*time.Hour)
	age(t, c, disksDir, sum(b), 2*time.Hour)
	stale := sum([]byte("stale")) + partSuffix
	if err := os.WriteFile(filepath.Join(c.Dir, tmpDir, stale), make([]byte, 10<<10), 0o600); err != nil {
		t.Fatal(err)
	}
	age(t, c, tmpDir, stale, 4*time.Hour)

	get("/c", cc).Close() // 310 KiB > 250 KiB: evicts the temp file, then b
	if !exists(c, disksDir, sum(a)) || exists(c, disksDir, sum(b)) || !exists(c, disksDir, sum(cc)) {
		t.Fatalf("after adding c: disks %v", files(t, c, disksDir))
	}
	if exists(c, tmpDir, stale) || exists(c, locksDir, sum(b)) {
		t.Fatalf("stale temp file or b's lock file left: %v %v", files(t, c, tmpDir), files(t, c, locksDir))
	}

	// Only a dup of a's descriptor is left, as when QEMU runs.
	dup, err := unix.Dup(int(diskA.File.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	diskA.Close()
	// A download in progress elsewhere: its digest lock is held.
	r, err := openRoot(c.Dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.close()
	busy := sum([]byte("busy"))
	l, err := lockDigest(context.Background(), r, busy, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(c.Dir, tmpDir, busy+partSuffix), make([]byte, 10), 0o600); err != nil {
		t.Fatal(err)
	}
	c.MaxSize = 1
	if err := c.Evict(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := files(t, c, disksDir); !slices.Equal(got, []string{sum(a)}) {
		t.Fatalf("after Evict with a in use: disks %v, want only a", got)
	}
	if !exists(c, tmpDir, busy+partSuffix) {
		t.Fatal("a temp file whose lock is held was removed")
	}
	l.unlock()
	unix.Close(dup)
	if err := c.Evict(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := files(t, c, disksDir); len(got) != 0 || exists(c, tmpDir, busy+partSuffix) {
		t.Fatalf("after the last user closed a: disks %v, temp %v", got, files(t, c, tmpDir))
	}

	// A download larger than the whole cache is refused before a byte
	// is written.
	_, err = c.Get(context.Background(), mustURL(t, base+"/d"), sum(d), nil)
	if err == nil || !strings.HasSuffix(err.Error(), "download needs at least 102403 bytes, more than the disk cache holds, 1 bytes (config cache_max_size)") {
		t.Fatalf("error %v", err)
	}
	if left := files(t, c, tmpDir); len(left) != 0 {
		t.Fatalf("temp files left: %v", left)
	}

	// The disk just returned survives even when alone it is over MaxSize.
	c.MaxSize = 0
	diskD := get("/d", d)
	defer diskD.Close()
	c.MaxSize = 1
	if _, err := c.evict(context.Background(), r, sum(d), 0); err != nil {
		t.Fatal(err)
	}
	if !exists(c, disksDir, sum(d)) {
		t.Fatal("the disk just returned was evicted")
	}
}

// TestEvictNoCap shows Evict does nothing without MaxSize.
func TestEvictNoCap(t *testing.T) {
	c := testCache(t)
	if err := c.Evict(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(c.Dir); !os.IsNotExist(err) {
		t.Fatalf("Evict without MaxSize touched the directory: %v", err)
	}
}

// TestRemove: Remove takes out a disk no one uses, keeps one in use, and
// finds nothing to do for a disk the cache does not have.
func TestRemove(t *testing.T) {
	a, b := pattern(10<<10), pattern(10<<10+1)
	base := multiFake(t, map[string][]byte{"/a": a, "/b": b})
	c := testCache(t)
	diskA, err := c.Get(context.Background(), mustURL(t, base+"/a"), sum(a), nil)
	if err != nil {
		t.Fatal(err)
	}
	diskB, err := c.Get(context.Background(), mustURL(t, base+"/b"), sum(b), nil)
	if err != nil {
		t.Fatal(err)
	}
	diskB.Close()
	if gone, err := c.Remove(sum(a)); gone || err != nil || !exists(c, disksDir, sum(a)) {
		t.Fatalf("Remove(a in use) = %v, %v", gone, err)
	}
	if gone, err := c.Remove("sha256:" + sum(b)); !gone || err != nil || exists(c, disksDir, sum(b)) {
		t.Fatalf("Remove(b) = %v, %v", gone, err)
	}
	if gone, err := c.Remove(sum([]byte("never"))); !gone || err != nil {
		t.Fatalf("Remove(absent) = %v, %v", gone, err)
	}
	diskA.Close()
	if _, err := c.Remove("nope"); err == nil {
		t.Fatal("Remove(bad digest) succeeded")
	}
}
