package diskcache

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"net/url"
	"os"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/net/http/httpproxy"
)

// Timeouts of the download client. There is no overall timeout: the
// caller's context bounds a download, which may be long.
const (
	dialTimeout           = 30 * time.Second
	tlsHandshakeTimeout   = 15 * time.Second
	responseHeaderTimeout = 60 * time.Second
	idleConnTimeout       = 90 * time.Second
	keepAlive             = 30 * time.Second
	maxRedirects          = 10
)

// NewClient returns the HTTP client for downloads from the caller's own
// network namespace (see NewPodClient for a pod's): the system CAs plus,
// when caFile != "", the PEM certificates in caFile (an error if it has
// none); proxies from HTTPS_PROXY, HTTP_PROXY and NO_PROXY as they are
// when NewClient is called; dial, TLS handshake and response header
// timeouts; redirects only to http or https URLs, at most 10. It never asks
// for or undoes a Content-Encoding: the digest is of the bytes as served.
func NewClient(caFile string) (*http.Client, error) {
	dialer := &net.Dialer{Timeout: dialTimeout, KeepAlive: keepAlive}
	return newClient(caFile, dialer.DialContext)
}

// NewPodClient returns the client of NewClient whose every connection,
// to the server, a server it redirects to, a proxy or a nameserver, is
// made from the pod's network namespace by n, and never to an address of
// n.Deny. It checks that n.Path is a network namespace of the pod's own.
func NewPodClient(caFile string, n *Netns) (*http.Client, error) {
	if err := CheckNetns(n.Path); err != nil {
		return nil, err
	}
	return newClient(caFile, n.DialContext)
}

func newClient(caFile string, dial func(ctx context.Context, network, addr string) (net.Conn, error)) (*http.Client, error) {
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, errorf(errdefs.ErrInvalidArgument, err, "read ca_file")
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, errorf(errdefs.ErrInvalidArgument, nil, "ca_file %s has no PEM certificate", caFile)
		}
	}
	proxy := httpproxy.FromEnvironment().ProxyFunc()
	transport := &http.Transport{
		Proxy:                 func(req *http.Request) (*url.URL, error) { return proxy(req.URL) },
		DialContext:           dial,
		TLSClientConfig:       &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout:   tlsHandshakeTimeout,
		ResponseHeaderTimeout: responseHeaderTimeout,
		IdleConnTimeout:       idleConnTimeout,
		ExpectContinueTimeout: time.Second,
		MaxIdleConns:          4,
		DisableCompression:    true,
		ForceAttemptHTTP2:     true,
	}
	return &http.Client{Transport: transport, CheckRedirect: checkRedirect}, nil
}

// checkRedirect allows at most maxRedirects redirects, to http or https.
func checkRedirect(req *http.Request, via []*http.Request) error {
	if len(via) > maxRedirects {
		return errorf(errdefs.ErrFailedPrecondition, nil, "stopped after %d redirects", maxRedirects)
	}
	if req.URL.Scheme != "http" && req.URL.Scheme != "https" {
		return errorf(errdefs.ErrFailedPrecondition, nil, "redirect to %s: scheme must be http or https", shownURL(req.URL))
	}
	return nil
}
