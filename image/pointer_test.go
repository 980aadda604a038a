package image

import (
	"strings"
	"testing"
)

// testSum is a valid sha256 digest, in lowercase.
const testSum = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"

func TestParsePointer(t *testing.T) {
	const u = "https://example.org/vms/debian-12.qcow2"
	tests := []struct {
		name          string
		url, sum      string
		wantURL       string
		wantSum       string
		wantErrPrefix string
	}{
		{name: "digest alone", url: u, sum: testSum, wantURL: u, wantSum: testSum},
		{name: "trailing newlines", url: u + "\n", sum: testSum + "\n", wantURL: u, wantSum: testSum},
		{name: "CRLF and blank lines", url: "\r\n" + u + " \r\n\r\n", sum: "\n\t" + testSum + "\r\n", wantURL: u, wantSum: testSum},
		{name: "sha256sum output", url: u, sum: testSum + "  debian-12.qcow2\n", wantURL: u, wantSum: testSum},
		{name: "sha256sum binary mode", url: u, sum: testSum + " *debian-12.qcow2\n", wantURL: u, wantSum: testSum},
		{name: "sha256: prefix", url: u, sum: "sha256:" + testSum, wantURL: u, wantSum: testSum},
		{name: "SHA256: prefix, uppercase digest", url: u, sum: "SHA256:" + strings.ToUpper(testSum), wantURL: u, wantSum: testSum},
		{name: "http", url: "http://10.0.0.1:8080/d.img", sum: testSum, wantURL: "http://10.0.0.1:8080/d.img", wantSum: testSum},
		{name: "scheme in capitals", url: "HTTPS://Example.org/D.qcow2", sum: testSum, wantURL: "HTTPS://Example.org/D.qcow2", wantSum: testSum},
		{name: "query kept as written", url: u + "?X-Amz-Signature=ab%2Fcd&x=1", sum: testSum, wantURL: u + "?X-Amz-Signature=ab%2Fcd&x=1", wantSum: testSum},
		{name: "non-ASCII path", url: "https://example.org/disques/été.qcow2", sum: testSum, wantURL: "https://example.org/disques/été.qcow2", wantSum: testSum},
		{name: "longest URL", url: "https://e.org/" + strings.Repeat("a", MaxURLLength-len("https://e.org/")), sum: testSum,
			wantURL: "https://e.org/" + strings.Repeat("a", MaxURLLength-len("https://e.org/")), wantSum: testSum},

		{name: "empty URL", url: " \n", sum: testSum, wantErrPrefix: "pointer file /disk/disk.url: empty; want an http or https URL"},
		{name: "two URLs", url: u + "\nhttps://other.example/x\n", sum: testSum, wantErrPrefix: "pointer file /disk/disk.url: more than one line; want one URL"},
		{name: "URL and a comment line", url: u + "\r\n# mirror\n", sum: testSum, wantErrPrefix: "pointer file /disk/disk.url: more than one line"},
		{name: "too long", url: "https://e.org/" + strings.Repeat("a", MaxURLLength), sum: testSum, // 4110 bytes
			wantErrPrefix: "pointer file /disk/disk.url: larger than 4096 bytes"},
		{name: "space", url: "https://example.org/my disk.qcow2", sum: testSum,
			wantErrPrefix: "pointer file /disk/disk.url: URL has a space at byte 22; spaces and control characters must be percent-encoded"},
		{name: "tab", url: "https://example.org/a\tb", sum: testSum, wantErrPrefix: "pointer file /disk/disk.url: URL has the character U+0009 at byte 21"},
		{name: "escape", url: "https://example.org/\x1b[31m", sum: testSum, wantErrPrefix: "pointer file /disk/disk.url: URL has the character U+001B at byte 20"},
		{name: "bidi override", url: "https://example.org/\u202egpj.exe", sum: testSum, wantErrPrefix: "pointer file /disk/disk.url: URL has the character U+202E at byte 20"},
		{name: "invalid UTF-8", url: "https://example.org/\xff", sum: testSum, wantErrPrefix: "pointer file /disk/disk.url: not valid UTF-8"},
		{name: "ftp", url: "ftp://example.org/d.qcow2", sum: testSum, wantErrPrefix: `pointer file /disk/disk.url: URL scheme "ftp" is not http or https`},
		{name: "file", url: "file:///etc/shadow", sum: testSum, wantErrPrefix: `pointer file /disk/disk.url: URL scheme "file" is not http or https`},
		{name: "no scheme", url: "example.org/d.qcow2", sum: testSum, wantErrPrefix: `pointer file /disk/disk.url: URL "example.org/d.qcow2" has no scheme`},
		{name: "no host", url: "https:///d.qcow2", sum: testSum, wantErrPrefix: `pointer file /disk/disk.url: URL "https:///d.qcow2" has no host`},
		{name: "fragment", url: u + "#part", sum: testSum, wantErrPrefix: `pointer file /disk/disk.url: URL "` + u + `#part" has a fragment (#)`},
		{name: "empty fragment", url: u + "#", sum: testSum, wantErrPrefix: `pointer file /disk/disk.url: URL "` + u + `#" has a fragment (#)`},
		{name: "port without host", url: "https://:443/d.qcow2", sum: testSum, wantErrPrefix: `pointer file /disk/disk.url: URL "https://:443/d.qcow2" has no host`},
		{name: "replacement character", url: "https://example.org/�", sum: testSum, wantErrPrefix: "pointer file /disk/disk.url: URL has the character U+FFFD at byte 20"},
		{name: "opaque", url: "https:example.org", sum: testSum, wantErrPrefix: `pointer file /disk/disk.url: URL "https:example.org" has no host`},
		{name: "bad escape", url: "https://example.org/%zz", sum: testSum, wantErrPrefix: `pointer file /disk/disk.url: not a URL: invalid URL escape "%zz"`},
		{name: "bad port", url: "https://example.org:x/", sum: testSum, wantErrPrefix: `pointer file /disk/disk.url: not a URL: invalid port ":x" after host`},

		{name: "empty digest", url: u, sum: "", wantErrPrefix: "pointer file /disk/disk.sha256: empty; want a sha256 digest (64 hex digits)"},
		{name: "short digest", url: u, sum: testSum[:63], wantErrPrefix: `pointer file /disk/disk.sha256: "` + testSum[:63] + `" is not a sha256 digest (64 hex digits)`},
		{name: "long digest", url: u, sum: testSum + "0", wantErrPrefix: "pointer file /disk/disk.sha256: \"" + testSum[:maxQuoted] + "\"… is not a sha256 digest"},
		{name: "not hex", url: u, sum: "g" + testSum[1:], wantErrPrefix: `pointer file /disk/disk.sha256: "g` + testSum[1:] + `" is not a sha256 digest`},
		{name: "sha512 prefix", url: u, sum: "sha512:" + testSum, wantErrPrefix: `pointer file /disk/disk.sha256: "sha512:`},
		{name: "two digests", url: u, sum: testSum + "  a\n" + testSum + "  b\n", wantErrPrefix: "pointer file /disk/disk.sha256: more than one line; want one sha256 digest"},
		{name: "BSD format", url: u, sum: "SHA256 (d.qcow2) = " + testSum, wantErrPrefix: `pointer file /disk/disk.sha256: "SHA256" is not a sha256 digest`},
		{name: "control characters are quoted", url: u, sum: "\x1b]0;pwned\x07", wantErrPrefix: `pointer file /disk/disk.sha256: "\x1b]0;pwned\a" is not a sha256 digest`},
		{name: "digest invalid UTF-8", url: u, sum: testSum + " \xfe", wantErrPrefix: "pointer file /disk/disk.sha256: not valid UTF-8"},
		{name: "URL checked first", url: "ftp://x/", sum: "", wantErrPrefix: "pointer file /disk/disk.url: "},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			gotURL, gotSum, err := ParsePointer([]byte(tc.url), []byte(tc.sum))
			if tc.wantErrPrefix != "" {
				if err == nil {
					t.Fatalf("ParsePointer() = %q, %q, want error %q", gotURL, gotSum, tc.wantErrPrefix)
				}
				checkOneLine(t, err)
				if !strings.HasPrefix(err.Error(), tc.wantErrPrefix) {
					t.Fatalf("ParsePointer() error = %q, want prefix %q", err, tc.wantErrPrefix)
				}
				if gotURL != "" || gotSum != "" {
					t.Errorf("ParsePointer() = %q, %q with its error", gotURL, gotSum)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParsePointer() error = %v", err)
			}
			if gotURL != tc.wantURL || gotSum != tc.wantSum {
				t.Fatalf("ParsePointer() = %q, %q, want %q, %q", gotURL, gotSum, tc.wantURL, tc.wantSum)
			}
		})
	}
}

// TestParsePointerErrorLength checks an error quotes a bounded part of
// what the image holds, however long.
func TestParsePointerErrorLength(t *testing.T) {
	long := strings.Repeat("x", 3000)
	for _, in := range [][2]string{
		{"gopher://" + long, testSum},
		{"https:" + long, testSum},
		{"https://example.org/%" + long + "%zz", testSum},
		{"https://example.org:" + long + "/", testSum},
		{"https://e.org/", long},
		{"https://e.org/", "sha256:" + long},
	} {
		_, _, err := ParsePointer([]byte(in[0]), []byte(in[1]))
		if err == nil {
			t.Fatalf("ParsePointer(%.40q…, %.40q…) accepted", in[0], in[1])
		}
		checkOneLine(t, err)
		if len(err.Error()) > 300 {
			t.Errorf("error of %d bytes: %.400q", len(err.Error()), err)
		}
	}
}

func TestQuoteImageNames(t *testing.T) {
	tests := []struct {
		names []string
		want  string
	}{
		{[]string{"/disk/a.qcow2"}, `"/disk/a.qcow2"`},
		{[]string{"/disk/a", "/disk/b\n\x1b"}, `"/disk/a", "/disk/b\n\x1b"`},
		{[]string{"/disk/\xff"}, `"/disk/\xff"`},
		{[]string{"1", "2", "3", "4", "5", "6", "7"}, `"1", "2", "3", "4", "5" (and 2 more)`},
		{[]string{"/disk/" + strings.Repeat("é", 40)}, `"/disk/` + strings.Repeat("é", 29) + `"…`},
	}
	for _, tc := range tests {
		if got := quoteImageNames(tc.names); got != tc.want {
			t.Errorf("quoteImageNames(%q) = %s, want %s", tc.names, got, tc.want)
		}
	}
}
