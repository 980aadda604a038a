package diskcache

import (
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

// TestParseURL checks which disk URLs are accepted.
func TestParseURL(t *testing.T) {
	for _, tc := range []struct {
		in string
		ok bool
	}{
		{"http://example.com/disk.qcow2", true},
		{"https://u:p@example.com:8443/a/b.img.xz?sig=1", true},
		{"https://[::1]:8443/x", true},
		{"HTTP://EXAMPLE.COM/X", true},
		{"http://example.com", true},
		{"", false},
		{"ftp://example.com/x", false},
		{"file:///etc/passwd", false},
		{"http:///x", false},
		{"http://:80/x", false},
		{"http:example.com", false},
		{"http://example.com/x#frag", false},
		{"http://example.com/x#", false},
		{"http://example.com/a b", false},
		{"http://example.com/a\tb", false},
		{"http://example.com/\x00", false},
		{"http://example.com/\u00a0", false},
		{"http://example.com/\u2028", false},
		{"http://example.com/\xff", false},
		{"http://example.com:port/", false},
		{"http://example.com/" + strings.Repeat("a", 4096-19), true},
		{"http://example.com/" + strings.Repeat("a", 4096-18), false},
	} {
		u, err := ParseURL(tc.in)
		if (err == nil) != tc.ok {
			t.Errorf("ParseURL(%.40q) = %v, %v; want ok %v", tc.in, u, err, tc.ok)
			continue
		}
		if err != nil {
			checkOneLine(t, err)
			if !errdefs.IsInvalidArgument(err) {
				t.Errorf("ParseURL(%.40q): %v is not invalid-argument", tc.in, err)
			}
		}
	}
	_, err := ParseURL("ftp://user:hunter22@example.com/x")
	checkOneLine(t, err, "hunter22")
	// A fragment is never shown: it may repeat the password, or hold one.
	_, err = ParseURL("http://user:hunter22@example.com/x#user:hunter22@")
	checkOneLine(t, err, "hunter22")
	_, err = ParseURL("//:hunter22b@#:hunter22b@")
	checkOneLine(t, err, "hunter22b")
}

// TestParseDigest checks digest forms and normalization.
func TestParseDigest(t *testing.T) {
	hex := strings.Repeat("0123456789abcdef", 4)
	for _, tc := range []struct {
		in, want string
	}{
		{hex, hex},
		{"sha256:" + hex, hex},
		{strings.ToUpper(hex), hex},
		{"sha256:" + strings.ToUpper(hex), hex},
		{"SHA256:" + hex, ""},
		{"sha512:" + hex, ""},
		{hex[1:], ""},
		{hex + "0", ""},
		{hex[1:] + "g", ""},
		{" " + hex, ""},
		{"", ""},
		{"sha256:", ""},
	} {
		got, err := ParseDigest(tc.in)
		if got != tc.want || (err == nil) != (tc.want != "") {
			t.Errorf("ParseDigest(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
		if err != nil && !errdefs.IsInvalidArgument(err) {
			t.Errorf("ParseDigest(%q): %v is not invalid-argument", tc.in, err)
		}
	}
}

// TestParseContentRange checks Content-Range forms.
func TestParseContentRange(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want contentRange
		ok   bool
	}{
		{"bytes 0-499/1234", contentRange{0, 499, 1234}, true},
		{"bytes 500-1233/1234", contentRange{500, 1233, 1234}, true},
		{"bytes 7-7/*", contentRange{7, 7, -1}, true},
		{"Bytes 1-2/3", contentRange{1, 2, 3}, true},
		{"bytes */1234", contentRange{-1, -1, 1234}, true},
		{"bytes */*", contentRange{}, false},
		{"bytes 5-4/10", contentRange{}, false},
		{"bytes 0-10/10", contentRange{}, false},
		{"bytes -1-2/3", contentRange{}, false},
		{"bytes +1-2/3", contentRange{}, false},
		{"bytes 1-2", contentRange{}, false},
		{"bytes 1-/3", contentRange{}, false},
		{"bytes  1-2/3", contentRange{}, false},
		{"items 1-2/3", contentRange{}, false},
		{"bytes 1-2/3 ", contentRange{}, false},
		{"bytes 99999999999999999999-1/2", contentRange{}, false},
		{"", contentRange{}, false},
	} {
		got, err := parseContentRange(tc.in)
		if (err == nil) != tc.ok || (tc.ok && got != tc.want) {
			t.Errorf("parseContentRange(%q) = %+v, %v; want %+v ok %v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

// TestProgress checks the byte units and that a meter says at most one line
// a second, with the percent and rate.
func TestProgress(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 12 << 20: "12.0 MiB", 3 << 40: "3.0 TiB"} {
		if got := humanBytes(n); got != want {
			t.Errorf("humanBytes(%d) = %q, want %q", n, got, want)
		}
	}
	var got lines
	m := newMeter(got.add, "downloading", "http://h/d", 0, 96<<20)
	m.Write(make([]byte, 1<<20)) // too soon for a line
	m.start = m.start.Add(-2 * time.Second)
	m.last = m.start
	m.Write(make([]byte, 11<<20))
	if len(got.l) != 1 || !strings.HasPrefix(got.l[0], "vmshim: downloading http://h/d: 12.0 MiB of 96.0 MiB (12%), ") ||
		!strings.HasSuffix(got.l[0], "MiB/s") {
		t.Fatalf("lines %q", got.l)
	}
}
