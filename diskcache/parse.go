package diskcache

import (
	"encoding/hex"
	"fmt"
	"net/url"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/containerd/errdefs"
)

// maxURLLen is the longest disk URL ParseURL accepts, in bytes.
const maxURLLen = 4096

// digestPrefix is the optional algorithm prefix of a digest.
const digestPrefix = "sha256:"

// ParseURL checks a disk URL: http or https, a host, no fragment, at most
// 4096 bytes, valid UTF-8 with no control characters or spaces. It returns
// the parsed URL; errors are errdefs.ErrInvalidArgument and never show a
// password.
func ParseURL(s string) (*url.URL, error) {
	switch {
	case s == "":
		return nil, errorf(errdefs.ErrInvalidArgument, nil, "disk-url is empty")
	case len(s) > maxURLLen:
		return nil, errorf(errdefs.ErrInvalidArgument, nil, "disk-url is longer than %d bytes", maxURLLen)
	case !utf8.ValidString(s):
		return nil, errorf(errdefs.ErrInvalidArgument, nil, "disk-url is not valid UTF-8")
	}
	for _, r := range s {
		if unicode.IsControl(r) || unicode.IsSpace(r) {
			return nil, errorf(errdefs.ErrInvalidArgument, nil, "disk-url has a space or control character %U", r)
		}
	}
	u, err := url.Parse(s)
	if err != nil {
		return nil, errorf(errdefs.ErrInvalidArgument, err, "disk-url is not a URL")
	}
	if strings.Contains(s, "#") {
		return nil, errorf(errdefs.ErrInvalidArgument, nil, "disk-url %s: has a fragment", shownURL(u))
	}
	if err := checkURL(u); err != nil {
		return nil, err
	}
	return u, nil
}

// shownURL is u as an error or log line shows it: its password
// redacted, and without its fragment, which a URL the shim takes never
// has and which may hold anything, a password included.
func shownURL(u *url.URL) string {
	v := *u
	v.Fragment, v.RawFragment = "", ""
	return v.Redacted()
}

// checkURL checks the parts of a parsed disk URL: http or https, a host,
// no fragment.
func checkURL(u *url.URL) error {
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return errorf(errdefs.ErrInvalidArgument, nil, "disk-url %s: scheme must be http or https", shownURL(u))
	case u.Opaque != "" || u.Host == "" || u.Hostname() == "":
		return errorf(errdefs.ErrInvalidArgument, nil, "disk-url %s: no host", shownURL(u))
	case u.Fragment != "":
		return errorf(errdefs.ErrInvalidArgument, nil, "disk-url %s: has a fragment", shownURL(u))
	}
	return nil
}

// ParseDigest accepts "HEX" or "sha256:HEX" (64 hex digits, either case)
// and returns the lowercase hex. Errors are errdefs.ErrInvalidArgument.
func ParseDigest(s string) (string, error) {
	h := strings.TrimPrefix(s, digestPrefix)
	if len(h) != 2*32 {
		return "", digestError(s)
	}
	if _, err := hex.DecodeString(h); err != nil {
		return "", digestError(s)
	}
	return strings.ToLower(h), nil
}

// digestError is the error for a malformed digest s, quoting at most its
// first 80 bytes.
func digestError(s string) error {
	if len(s) > 80 {
		s = s[:80] + "..."
	}
	return errorf(errdefs.ErrInvalidArgument, nil,
		"disk-sha256 %s: want 64 hex digits, alone or after %q", quote(s), digestPrefix)
}

// quote is s in Go quotes, so that any byte prints as one line.
func quote(s string) string {
	return fmt.Sprintf("%q", s)
}
