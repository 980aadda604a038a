package image

import (
	"net/url"
	"strings"
	"testing"
	"unicode/utf8"
)

// pointerSeeds are FuzzParsePointer inputs: the contents of a pointer
// image's /disk/disk.url and /disk/disk.sha256, valid and not.
func pointerSeeds() [][2]string {
	return [][2]string{
		{"https://example.org/vms/debian-12.qcow2\n", testSum + "\n"},
		{"http://10.0.0.1:8080/d.img", testSum + "  d.img\n"},
		{"HTTPS://Example.org/D.qcow2?sig=a%2Fb", "sha256:" + strings.ToUpper(testSum)},
		{"https://example.org/été.qcow2\r\n", testSum + " *d.qcow2\r\n"},
		{"https://example.org/a\nhttps://example.org/b", testSum},
		{"ftp://example.org/d.qcow2", testSum},
		{"file:///etc/shadow", testSum},
		{"https:example.org", testSum},
		{"https:///d", testSum},
		{"//example.org/d", testSum},
		{"https://example.org/%zz", testSum},
		{"https://[::1", testSum},
		{"https://example.org/a b", testSum},
		{"https://example.org/\x1b[31m\u202e\u00a0", testSum},
		{"https://example.org/\xff\xfe", testSum},
		{"https://e.org/" + strings.Repeat("a", 200), testSum},
		{"https://e.org/", testSum[:63]},
		{"https://e.org/", testSum + "0"},
		{"https://e.org/", "sha512:" + testSum},
		{"https://e.org/", "SHA256 (d) = " + testSum},
		{"https://e.org/", testSum + "\n" + testSum},
		{"https://e.org/", "\x1b]0;x\x07"},
		{"", ""},
		{"https://example.org/d#frag", testSum},
		{"https://:443/d", testSum},
		{"https://example.org/\uFFFD", testSum},
	}
}

// FuzzParsePointer checks ParsePointer never panics, errs in one line,
// and accepts only a single-line http or https URL with a host and no
// fragment within MaxURLLength and a digest of 64 lowercase hex digits,
// which it accepts again as they are.
func FuzzParsePointer(f *testing.F) {
	for _, s := range pointerSeeds() {
		f.Add([]byte(s[0]), []byte(s[1]))
	}
	f.Fuzz(func(t *testing.T, urlText, sumText []byte) {
		u, sum, err := ParsePointer(urlText, sumText)
		if err != nil {
			checkOneLine(t, err)
			if msg := err.Error(); !strings.HasPrefix(msg, "pointer file "+PointerURLFile+": ") && !strings.HasPrefix(msg, "pointer file "+PointerSHA256File+": ") {
				t.Fatalf("error %q does not name the pointer file", msg)
			} else if len(msg) > 400 {
				t.Fatalf("error of %d bytes", len(msg))
			}
			if u != "" || sum != "" {
				t.Fatalf("ParsePointer = %q, %q with its error", u, sum)
			}
			return
		}
		if len(sum) != 64 || strings.Trim(sum, "0123456789abcdef") != "" {
			t.Fatalf("digest %q is not 64 lowercase hex digits", sum)
		}
		if u == "" || len(u) > MaxURLLength || !utf8.ValidString(u) || strings.ContainsAny(u, " \t\r\n\x00") {
			t.Fatalf("URL %q is not one line of UTF-8 within %d bytes", u, MaxURLLength)
		}
		lower := strings.ToLower(u)
		if !strings.HasPrefix(lower, "http://") && !strings.HasPrefix(lower, "https://") {
			t.Fatalf("URL %q is not http or https", u)
		}
		parsed, err := url.Parse(u)
		if err != nil {
			t.Fatalf("URL %q: %v", u, err)
		}
		if parsed.Hostname() == "" || parsed.Fragment != "" || strings.Contains(u, "#") || (parsed.Scheme != "http" && parsed.Scheme != "https") {
			t.Fatalf("URL %q: host %q, scheme %q, fragment %q", u, parsed.Host, parsed.Scheme, parsed.Fragment)
		}
		u2, sum2, err := ParsePointer([]byte(u), []byte(sum))
		if err != nil || u2 != u || sum2 != sum {
			t.Fatalf("ParsePointer of its own result %q, %q = %q, %q, %v", u, sum, u2, sum2, err)
		}
	})
}
