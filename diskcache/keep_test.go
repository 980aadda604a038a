package diskcache

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

// partSize is the size of tmp/<hex>.part, -1 if it is missing.
func partSize(c *Cache, hex string) int64 {
	st, err := os.Stat(filepath.Join(c.Dir, tmpDir, hex+partSuffix))
	if err != nil {
		return -1
	}
	return st.Size()
}

// cutGet runs Get of f's body in the background and cancels it once
// tmp/<hex>.part holds at least n bytes; it returns Get's error.
func cutGet(t *testing.T, c *Cache, rawURL string, f *fake, n int64, p Progress) error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		d, err := c.Get(ctx, mustURL(t, rawURL), sum(f.body), p)
		if d != nil {
			d.Close()
		}
		done <- err
	}()
	for partSize(c, sum(f.body)) < n {
		select {
		case err := <-done:
			t.Fatalf("Get ended before %d bytes: %v", n, err)
		case <-time.After(5 * time.Millisecond):
		}
	}
	cancel()
	return <-done
}

// plantPart writes a lone partial download of n bytes for digest hex,
// last written d ago, as a create that ended at its deadline keeps it.
func plantPart(t *testing.T, c *Cache, hex string, n int, d time.Duration) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(c.Dir, tmpDir), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(c.Dir, tmpDir, hex+partSuffix), pattern(n), 0o600); err != nil {
		t.Fatal(err)
	}
	age(t, c, tmpDir, hex+partSuffix, d)
}

// TestKeepPartial shows a download that was progressing when its caller's
// context ended (a cancel, or a deadline such as the kubelet's) keeps its
// partial file, counted as its size and without its reservation, and the
// next Get of the digest resumes it with a Range request from its end.
func TestKeepPartial(t *testing.T) {
	body := pattern(8 << 20)
	for _, tc := range []string{"cancel", "deadline"} {
		t.Run(tc, func(t *testing.T) {
			f := &fake{body: body, stallAt: 4 << 20, stalls: 1}
			srv := newFake(t, f)
			c := testCache(t)
			c.MaxSize, c.keepRate = 64<<20, 1 // the rate is shown by TestKeepTrickle
			var got lines
			var err error
			if tc == "cancel" {
				err = cutGet(t, c, srv.URL+"/d", f, 4<<20, got.add)
				if !errdefs.IsCanceled(err) {
					t.Fatalf("error %v", err)
				}
			} else {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				defer cancel()
				_, err = c.Get(ctx, mustURL(t, srv.URL+"/d"), sum(body), got.add)
				if !errdefs.IsDeadlineExceeded(err) {
					t.Fatalf("error %v", err)
				}
			}
			checkOneLine(t, err)
			kept := partSize(c, sum(body))
			if left := files(t, c, tmpDir); kept <= 0 || len(left) != 1 {
				t.Fatalf("tmp/ holds %v, want the .part alone (%d bytes)", left, kept)
			}
			want := fmt.Sprintf("keeping the partial download of %s (%s) in the cache for the next try", mustURL(t, srv.URL+"/d").Redacted(), humanBytes(kept))
			if !got.has(want) {
				t.Errorf("no line %q in:\n%s", want, &got)
			}
			r, err := openRoot(c.Dir)
			if err != nil {
				t.Fatal(err)
			}
			entries, err := listEntries(r)
			r.close()
			if err != nil || len(entries) != 1 || entries[0].size != kept {
				t.Fatalf("entries %+v (%v), want the .part counted as %d bytes", entries, err, kept)
			}

			got = lines{}
			getOK(t, c, srv.URL+"/d", body, got.add)
			if seen, want := f.rangesSeen(), []string{"|", fmt.Sprintf("bytes=%d-|", kept)}; !slices.Equal(seen, want) {
				t.Errorf("requests %q, want %q", seen, want)
			}
			if !got.has(fmt.Sprintf("found %d bytes of an earlier download", kept)) {
				t.Errorf("no line about the kept download in:\n%s", &got)
			}
			if left := files(t, c, tmpDir); len(left) != 0 {
				t.Errorf("temp files left: %v", left)
			}
		})
	}
}

// TestKeepTrickle shows a partial download is not kept when it was not
// progressing at 1 MiB/s (a trickle of 64 KiB every 200 ms, cut by the
// caller), nor when download_timeout, a limit, ended it however fast it
// went.
func TestKeepTrickle(t *testing.T) {
	body := pattern(4 << 20)
	f := &fake{body: body, delay: 200 * time.Millisecond}
	srv := newFake(t, f)
	c := testCache(t)
	err := cutGet(t, c, srv.URL+"/d", f, 3<<16, nil)
	if !errdefs.IsCanceled(err) {
		t.Fatalf("trickle: error %v", err)
	}
	assertNoTemps(t, c, sum(body))

	f2 := &fake{body: body, stallAt: 1 << 20, stalls: 1}
	srv2 := newFake(t, f2)
	c2 := testCache(t)
	c2.DownloadTimeout, c2.keepRate = time.Second, 1
	_, err = c2.Get(context.Background(), mustURL(t, srv2.URL+"/d"), sum(body), nil)
	if !errdefs.IsDeadlineExceeded(err) {
		t.Fatalf("download_timeout: error %v", err)
	}
	assertNoTemps(t, c2, sum(body))
}

// TestKeepBounds shows at most keepCount partial downloads are kept, the
// oldest beyond it removed when another is kept, and a kept one older than
// keepAge is removed by the next download's sweep, with a cap or without.
func TestKeepBounds(t *testing.T) {
	body := pattern(2 << 20)
	f := &fake{body: body, stallAt: 1 << 20, stalls: 1}
	srv := newFake(t, f)
	c := testCache(t)
	c.keepRate = 1
	var old []string
	for i := range defaultKeepCount {
		h := sum([]byte{byte(i)})
		old = append(old, h)
		plantPart(t, c, h, 1000, time.Duration(defaultKeepCount-i)*time.Minute) // old[0] is the oldest
	}
	if err := cutGet(t, c, srv.URL+"/d", f, 1<<20, nil); !errdefs.IsCanceled(err) {
		t.Fatalf("error %v", err)
	}
	left := files(t, c, tmpDir)
	slices.Sort(left)
	want := []string{sum(body) + partSuffix}
	for _, h := range old[1:] {
		want = append(want, h+partSuffix)
	}
	slices.Sort(want)
	if !slices.Equal(left, want) {
		t.Fatalf("tmp/ holds %v, want %v", left, want)
	}

	other := pattern(1000)
	srvOther := newFake(t, &fake{body: other})
	for _, maxSize := range []int64{0, 1 << 30} {
		c := testCache(t)
		c.MaxSize = maxSize
		stale, fresh := sum([]byte("stale")), sum([]byte("fresh"))
		plantPart(t, c, stale, 1000, defaultKeepAge+time.Minute)
		plantPart(t, c, fresh, 1000, time.Minute)
		getOK(t, c, srvOther.URL+"/d", other, nil)
		if left := files(t, c, tmpDir); !slices.Equal(left, []string{fresh + partSuffix}) {
			t.Fatalf("MaxSize %d: tmp/ holds %v, want the fresh .part alone", maxSize, left)
		}
	}
}

// TestKeepEvicted shows a kept partial download counts against MaxSize and
// is evicted, like an unused disk, when a download needs its room.
func TestKeepEvicted(t *testing.T) {
	body := pattern(300 << 10)
	srv := newFake(t, &fake{body: body})
	c := testCache(t)
	c.MaxSize = 400 << 10
	kept := sum([]byte("kept"))
	plantPart(t, c, kept, 200<<10, time.Minute)
	getOK(t, c, srv.URL+"/d", body, nil)
	if exists(c, tmpDir, kept+partSuffix) {
		t.Fatal("the kept partial download was not evicted to make room")
	}
}
