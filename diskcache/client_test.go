package diskcache

import (
	"context"
	"encoding/pem"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/containerd/errdefs"
)

// tlsFake starts an httptest TLS server for f and writes its CA to a file.
func tlsFake(t *testing.T, f *fake) (*httptest.Server, string) {
	t.Helper()
	srv := httptest.NewUnstartedServer(f)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // handshakes the tests fail
	srv.StartTLS()
	t.Cleanup(srv.Close)
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	pemBytes := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	if err := os.WriteFile(caFile, pemBytes, 0o600); err != nil {
		t.Fatal(err)
	}
	return srv, caFile
}

// TestTLS shows a server whose CA is in ca_file is trusted, and one whose
// CA is not fails at once (no retry) with a one-line error.
func TestTLS(t *testing.T) {
	body := pattern(100 << 10)
	srv, caFile := tlsFake(t, &fake{body: body})
	client, err := NewClient(caFile)
	if err != nil {
		t.Fatal(err)
	}
	c := testCache(t)
	c.Client = client
	getOK(t, c, srv.URL+"/d", body, nil)

	c2 := testCache(t)
	var got lines
	_, err = c2.Get(context.Background(), mustURL(t, srv.URL+"/d"), sum(body), got.add)
	if err == nil || !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("error %v", err)
	}
	checkOneLine(t, err)
	if got.has("retrying") {
		t.Fatalf("certificate error retried:\n%s", &got)
	}
}

// TestNewClientCAFile shows a ca_file without certificates is an error.
func TestNewClientCAFile(t *testing.T) {
	junk := filepath.Join(t.TempDir(), "junk.pem")
	if err := os.WriteFile(junk, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, file := range []string{junk, filepath.Join(t.TempDir(), "missing.pem")} {
		if _, err := NewClient(file); !errdefs.IsInvalidArgument(err) {
			t.Fatalf("NewClient(%s): %v", file, err)
		}
	}
}

// TestRedirect shows redirects to http(s) are followed, to another scheme
// refused at once, and loops stopped after 10.
func TestRedirect(t *testing.T) {
	body := pattern(10 << 10)
	tlsSrv, caFile := tlsFake(t, &fake{body: body})
	client, err := NewClient(caFile)
	if err != nil {
		t.Fatal(err)
	}
	toHTTPS := newFake(t, &fake{redirect: tlsSrv.URL + "/d"})
	c := testCache(t)
	c.Client = client
	getOK(t, c, toHTTPS.URL+"/d", body, nil)

	for _, tc := range []struct {
		f        *fake
		msg      string
		requests int32
	}{
		{&fake{redirect: "ftp://example.com/disk"}, "redirect to ftp://example.com/disk: scheme must be http or https", 1},
		{&fake{redirect: "/again"}, "stopped after 10 redirects", 11},
	} {
		srv := newFake(t, tc.f)
		u := mustURL(t, srv.URL+"/d")
		_, err := testCache(t).Get(context.Background(), u, sum(body), nil)
		if err == nil || !errdefs.IsFailedPrecondition(err) || err.Error() != "disk-url "+u.Redacted()+": "+tc.msg {
			t.Fatalf("error %v", err)
		}
		if n := tc.f.requests.Load(); n != tc.requests {
			t.Fatalf("%d requests, want %d", n, tc.requests)
		}
	}
}

// TestProxy shows NewClient takes HTTP_PROXY from the environment when it
// is called: the download of http://disk.example/ goes through the proxy.
func TestProxy(t *testing.T) {
	body := pattern(10 << 10)
	f := &fake{body: body}
	var proxied atomic.Int32
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Host != "disk.example" { // not an absolute-URI request
			http.Error(w, "not a proxy request", http.StatusBadRequest)
			return
		}
		proxied.Add(1)
		f.ServeHTTP(w, r)
	}))
	t.Cleanup(proxy.Close)
	for _, k := range []string{"HTTP_PROXY", "http_proxy"} {
		t.Setenv(k, proxy.URL)
	}
	for _, k := range []string{"NO_PROXY", "no_proxy", "REQUEST_METHOD"} {
		t.Setenv(k, "")
	}
	client, err := NewClient("")
	if err != nil {
		t.Fatal(err)
	}
	c := testCache(t)
	c.Client = client
	getOK(t, c, "http://disk.example/disk.img", body, nil)
	if proxied.Load() != 1 {
		t.Fatalf("%d requests through the proxy, want 1", proxied.Load())
	}
}
