package diskcache

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// cachedDisk downloads body from f into a new cache and returns the cache
// directory and the URL; the disk's mtime is then set far in the past, so
// a later use shows.
func cachedDisk(t *testing.T, f *fake) (string, string) {
	t.Helper()
	srv := newFake(t, f)
	c := testCache(t)
	u := srv.URL + "/d"
	getOK(t, c, u, f.body, nil)
	old := []unix.Timespec{{Sec: 1}, {Sec: 1}}
	if err := unix.UtimesNano(c.Dir+"/sha256/"+sum(f.body), old); err != nil {
		t.Fatal(err)
	}
	return c.Dir, u
}

// recorded records u as a URL the cached disk of body was fetched from.
func recorded(t *testing.T, dir string, body []byte, u string) {
	t.Helper()
	r, err := openRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.close()
	if err := recordURL(r, sum(body), mustURL(t, u), false); err != nil {
		t.Fatal(err)
	}
}

// used reports whether the cached disk's mtime moved: whether it was
// opened for a caller.
func used(t *testing.T, dir string, body []byte) bool {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(dir+"/sha256/"+sum(body), &st); err != nil {
		t.Fatal(err)
	}
	return st.Mtim.Sec != 1
}

// TestCachedProbe shows a cache hit costs one one-byte request and no
// download.
func TestCachedProbe(t *testing.T) {
	f := &fake{body: pattern(200 << 10)}
	dir, u := cachedDisk(t, f)
	c := &Cache{Dir: dir}
	var got lines
	d, err := c.Get(context.Background(), mustURL(t, u), sum(f.body), got.add)
	if err != nil {
		t.Fatal(err)
	}
	d.Close()
	if f.probes.Load() != 1 || f.requests.Load() != 1 {
		t.Errorf("%d probes and %d requests, want 1 and the first download's 1", f.probes.Load(), f.requests.Load())
	}
	if !got.has("206 Partial Content") || !used(t, dir, f.body) {
		t.Errorf("the hit was not used, or does not say the pod's network answered:\n%s", &got)
	}
}

// TestCachedRefused shows a disk in the cache is not handed to a client
// that cannot fetch its URL: a server that now says 404 or 403, a client
// whose connections are denied, a server gone (at a URL the disk was
// fetched from, or a new one: no download is tried). The refusal is one line
// with the status and nothing of the disk; the disk is not opened.
func TestCachedRefused(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status int
		deny   bool
		gone   bool
		record bool // the gone server's URL is one the disk was fetched from
		is     func(error) bool
		msg    string
	}{
		{"404", 404, false, false, false, errdefs.IsNotFound, "HTTP 404 Not Found"},
		{"403", 403, false, false, false, errdefs.IsFailedPrecondition, "HTTP 403 Forbidden"},
		{"denied", 0, true, false, false, errdefs.IsFailedPrecondition, "url_deny_cidrs"},
		{"gone", 0, false, true, true, errdefs.IsFailedPrecondition, "connection refused"},
		{"gone, a new URL", 0, false, true, false, errdefs.IsFailedPrecondition, "connection refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fake{body: pattern(100 << 10)}
			dir, u := cachedDisk(t, f)
			f.status = tc.status
			c := &Cache{Dir: dir}
			if tc.deny {
				c.Client = podClient(t, &Netns{Deny: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}})
			}
			if tc.gone {
				ln, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				u = "http://" + ln.Addr().String() + "/d"
				ln.Close()
				if tc.record {
					recorded(t, dir, f.body, u) // a URL it was fetched from, whose server is gone
				}
			}
			_, err := c.Get(context.Background(), mustURL(t, u), sum(f.body), nil)
			want := "disk-url " + u + ": the pod's network cannot fetch it: "
			if err == nil || !tc.is(err) || !strings.HasPrefix(err.Error(), want) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("error %v, want %q … %q", err, want, tc.msg)
			}
			checkOneLine(t, err, "nope")
			if used(t, dir, f.body) {
				t.Errorf("the refused disk was opened")
			}
			if f.requests.Load() != 1 {
				t.Errorf("%d requests besides probes, want the first download's 1", f.requests.Load())
			}
		})
	}
}

// TestCachedHang shows a server that never answers the probe holds the
// caller no longer than its context.
func TestCachedHang(t *testing.T) {
	f := &fake{body: pattern(10 << 10)}
	dir, u := cachedDisk(t, f)
	f.hang = true
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	c := &Cache{Dir: dir}
	_, err := c.Get(ctx, mustURL(t, u), sum(f.body), nil)
	if err == nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("error %v, want the context's deadline", err)
	}
	checkOneLine(t, err)
	if used(t, dir, f.body) {
		t.Errorf("the disk was opened")
	}
}
