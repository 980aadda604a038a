package diskcache

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"
)

// fake is the behaviour of a misbehaving disk server.
type fake struct {
	body        []byte        // the bytes served
	etag        string        // sent as ETag when not ""
	etagLater   string        // ETag from the second request on (the file "changed")
	status      int           // answer every request with this status
	drops       int32         // drop the connection of this many requests...
	dropAt      int64         // ...after this byte of the body
	ignoreRange bool          // answer Range requests with 200
	badRange    bool          // answer Range requests with 206 from byte 0
	lieLength   int64         // Content-Length to send instead of the truth
	chunked     bool          // send no Content-Length
	stallAt     int64         // > 0: stop sending at this byte until the client leaves
	stalls      int32         // how many requests stall (0: all, with stallAt)
	delay       time.Duration // pause between 64 KiB writes
	redirect    string        // redirect every request here
	gate        chan struct{} // when not nil, send the body once it is closed

	requests atomic.Int32 // requests received, but for probes
	probes   atomic.Int32 // one-byte requests (Range: bytes=0-0) received
	hang     bool         // probes get no answer until the client leaves
	full     atomic.Int32 // whole bodies sent with 200
	mu       sync.Mutex
	ranges   []string // Range and If-Range of each request
}

// newFake starts an httptest server for f, closed with the test.
func newFake(t *testing.T, f *fake) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return srv
}

// ServeHTTP serves f.body as f says.
func (f *fake) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Range") == "bytes=0-0" {
		f.probe(w, r)
		return
	}
	n := f.requests.Add(1)
	etag := f.etag
	if n > 1 && f.etagLater != "" {
		etag = f.etagLater
	}
	f.mu.Lock()
	f.ranges = append(f.ranges, r.Header.Get("Range")+"|"+r.Header.Get("If-Range"))
	f.mu.Unlock()
	switch {
	case f.redirect != "":
		http.Redirect(w, r, f.redirect, http.StatusFound)
		return
	case f.status != 0:
		http.Error(w, "nope", f.status)
		return
	}
	size := int64(len(f.body))
	start, status := int64(0), http.StatusOK
	if rng := r.Header.Get("Range"); rng != "" && !f.ignoreRange {
		ifRange := r.Header.Get("If-Range")
		if s, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimPrefix(rng, "bytes="), "-"), 10, 64); err == nil &&
			(ifRange == "" || ifRange == etag) {
			start, status = s, http.StatusPartialContent
		}
	}
	if start >= size && status == http.StatusPartialContent {
		w.Header().Set("Content-Range", fmt.Sprintf("bytes */%d", size))
		w.WriteHeader(http.StatusRequestedRangeNotSatisfiable)
		return
	}
	if f.badRange && status == http.StatusPartialContent {
		w.Header().Set("Content-Range", fmt.Sprintf("bytes 0-%d/%d", size-1, size))
		w.WriteHeader(http.StatusPartialContent)
		w.Write(f.body)
		return
	}
	hdr := fmt.Sprintf("HTTP/1.1 %d %s\r\n", status, http.StatusText(status))
	if etag != "" {
		hdr += "ETag: " + etag + "\r\n"
	}
	if status == http.StatusPartialContent {
		hdr += fmt.Sprintf("Content-Range: bytes %d-%d/%d\r\n", start, size-1, size)
	}
	length := size - start
	if f.lieLength != 0 {
		length = f.lieLength
	}
	if !f.chunked {
		hdr += fmt.Sprintf("Content-Length: %d\r\n", length)
	}
	hdr += "Connection: close\r\n\r\n"
	end := size
	stall := f.stallAt > 0 && (f.stalls == 0 || n <= f.stalls)
	drop := n <= f.drops
	switch {
	case stall:
		end = max(start, f.stallAt)
	case drop:
		end = max(start, f.dropAt)
	}
	// Take the connection to write exactly what the test wants, then
	// close it: with Connection: close, EOF ends a chunked body.
	conn, rw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	if !f.write(rw, hdr, f.body[start:end]) {
		return
	}
	if stall {
		// A hijacked connection no longer ends r's context: wait for
		// the client to close it instead.
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		conn.Read(make([]byte, 1))
		return
	}
	if !drop && status == http.StatusOK && end == size && f.lieLength == 0 {
		f.full.Add(1)
	}
}

// write sends the header and body, slowly if f.delay says so.
func (f *fake) write(rw *bufio.ReadWriter, hdr string, body []byte) bool {
	if _, err := rw.WriteString(hdr); err != nil {
		return false
	}
	if f.gate != nil {
		if rw.Flush() != nil {
			return false
		}
		<-f.gate
	}
	for len(body) > 0 {
		n := min(len(body), 64<<10)
		if _, err := rw.Write(body[:n]); err != nil || rw.Flush() != nil {
			return false
		}
		body = body[n:]
		if f.delay > 0 {
			time.Sleep(f.delay)
		}
	}
	return rw.Flush() == nil
}

// probe answers a one-byte request with the first byte, or as f says.
func (f *fake) probe(w http.ResponseWriter, r *http.Request) {
	f.probes.Add(1)
	switch {
	case f.hang:
		<-r.Context().Done()
	case f.redirect != "":
		http.Redirect(w, r, f.redirect, http.StatusFound)
	case f.status != 0:
		http.Error(w, "nope", f.status)
	default:
		w.Header().Set("Content-Range", fmt.Sprintf("bytes 0-0/%d", len(f.body)))
		w.WriteHeader(http.StatusPartialContent)
		w.Write(f.body[:1])
	}
}

// rangesSeen returns the Range|If-Range of each request so far.
func (f *fake) rangesSeen() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.ranges...)
}

// sum is the sha256 of b in hex.
func sum(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// pattern returns n bytes that do not compress to nothing.
func pattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i/251)
	}
	return b
}

// testCache returns a Cache in a new directory that retries quickly.
func testCache(t *testing.T) *Cache {
	t.Helper()
	return &Cache{Dir: filepath.Join(t.TempDir(), "cache"), attempts: 3, backoff: 10 * time.Millisecond}
}

// mustURL parses s with ParseURL.
func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := ParseURL(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// lines collects progress lines, safe for concurrent use.
type lines struct {
	mu sync.Mutex
	l  []string
}

func (l *lines) add(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.l = append(l.l, s)
}

// has reports whether a line contains sub.
func (l *lines) has(sub string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range l.l {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

func (l *lines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.l, "\n")
}

// files returns the names in sub of the cache directory.
func files(t *testing.T, c *Cache, sub string) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(c.Dir, sub))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// checkOneLine fails unless err is one line of UTF-8 that does not contain
// any of secrets.
func checkOneLine(t *testing.T, err error, secrets ...string) {
	t.Helper()
	msg := err.Error()
	if msg == "" || strings.ContainsAny(msg, "\r\n") || !utf8.ValidString(msg) {
		t.Fatalf("error is not one line: %q", msg)
	}
	for _, s := range secrets {
		if strings.Contains(msg, s) {
			t.Fatalf("error %q shows %q", msg, s)
		}
	}
}

// httpMux serves each path with its fake.
type httpMux map[string]*fake

func (m httpMux) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f, ok := m[r.URL.Path]
	if !ok {
		http.NotFound(w, r)
		return
	}
	f.ServeHTTP(w, r)
}
