package diskcache

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net/url"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/ulikunitz/xz"
)

// The checked-in corpus of each target is in testdata/fuzz/<target>.

// FuzzParseURL checks that an accepted URL is http(s) with a host and no
// fragment, that it prints again as an accepted URL, and that errors are
// one line that never shows a password.
func FuzzParseURL(f *testing.F) {
	for _, s := range []string{
		"http://example.com/disk.qcow2", "https://u:p@h:8443/a/b?x=1", "https://[::1]:1/x",
		"ftp://h/x", "http:///x", "http://h/x#f", "http://h/ x", "http://h/\x7f", "HTTP://H/X",
		"http://user:hunter22@h:bad/", "http://h/%zz", "http://h\n/", "\xff", "http:opaque",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		u, err := ParseURL(s)
		if err != nil {
			msg := err.Error()
			if strings.ContainsAny(msg, "\r\n") || !utf8.ValidString(msg) {
				t.Fatalf("error is not one line: %q", msg)
			}
			if pu, perr := url.Parse(s); perr == nil && pu.User != nil {
				if p, ok := pu.User.Password(); ok && len(p) >= 6 && strings.Contains(msg, ":"+p+"@") {
					t.Fatalf("error %q shows the password", msg)
				}
			}
			return
		}
		if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Fragment != "" || len(s) > maxURLLen {
			t.Fatalf("accepted %q: %#v", s, u)
		}
		if again := u.String(); len(again) <= maxURLLen {
			if _, err := ParseURL(again); err != nil {
				t.Fatalf("%q prints as %q, refused: %v", s, again, err)
			}
		}
	})
}

// FuzzParseDigest checks that an accepted digest is 64 lowercase hex
// digits, the input's, and that errors are one line.
func FuzzParseDigest(f *testing.F) {
	for _, s := range []string{
		strings.Repeat("a", 64), "sha256:" + strings.Repeat("AB", 32), strings.Repeat("g", 64),
		"sha256:", "sha512:" + strings.Repeat("0", 64), "", strings.Repeat("0", 63), "sha256:sha256:",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		h, err := ParseDigest(s)
		if err != nil {
			if msg := err.Error(); strings.ContainsAny(msg, "\r\n") || !utf8.ValidString(msg) {
				t.Fatalf("error is not one line: %q", msg)
			}
			return
		}
		if len(h) != 64 || strings.Trim(h, "0123456789abcdef") != "" ||
			h != strings.ToLower(strings.TrimPrefix(s, digestPrefix)) {
			t.Fatalf("ParseDigest(%q) = %q", s, h)
		}
		if again, err := ParseDigest(h); err != nil || again != h {
			t.Fatalf("ParseDigest(%q) = %q, %v", h, again, err)
		}
	})
}

// FuzzContentRange checks the invariants of an accepted Content-Range and
// that it prints and parses back to itself.
func FuzzContentRange(f *testing.F) {
	for _, s := range []string{
		"bytes 0-499/1234", "bytes 500-1233/1234", "bytes 0-0/*", "bytes */1234", "BYTES 1-2/3",
		"bytes 5-4/10", "bytes 0-10/10", "bytes */*", "bytes -1-2/3", "bytes +1-2/3", "bytes 1-2",
		"bytes 9223372036854775807-9223372036854775807/*", "bytes 99999999999999999999-1/2", "items 0-1/2", "bytes  0-1/2",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		cr, err := parseContentRange(s)
		if err != nil {
			return
		}
		var again string
		switch {
		case cr.Start < 0:
			if cr.End != -1 || cr.Total < 0 {
				t.Fatalf("%q: %+v", s, cr)
			}
			again = fmt.Sprintf("bytes */%d", cr.Total)
		case cr.End < cr.Start || (cr.Total >= 0 && cr.End >= cr.Total) || cr.Total < -1:
			t.Fatalf("%q: %+v", s, cr)
		case cr.Total < 0:
			again = fmt.Sprintf("bytes %d-%d/*", cr.Start, cr.End)
		default:
			again = fmt.Sprintf("bytes %d-%d/%d", cr.Start, cr.End, cr.Total)
		}
		if cr2, err := parseContentRange(again); err != nil || cr2 != cr {
			t.Fatalf("%q: %+v prints as %q: %+v, %v", s, cr, again, cr2, err)
		}
	})
}

// FuzzScanXZ checks that scanXZ never panics, and that when it accepts a
// file that the xz decoder decodes without error, the decoder's output has
// the size scanXZ predicted.
func FuzzScanXZ(f *testing.F) {
	for _, s := range xzSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		const maxDict = 1 << 20
		size, err := scanXZ(bufio.NewReader(bytes.NewReader(b)), maxDict, 0)
		if err != nil || size > 8<<20 {
			return
		}
		dec, err := xz.ReaderConfig{DictCap: 4096}.NewReader(bytes.NewReader(b))
		if err != nil {
			return
		}
		n, err := io.Copy(io.Discard, io.LimitReader(dec, size+1))
		if err == nil && n != size {
			t.Fatalf("scanXZ says %d bytes, the decoder gave %d", size, n)
		}
	})
}

// TestScanXZ checks scanXZ's sizes, its dictionary limit and its early
// stop past the size limit on files of the xz writer.
func TestScanXZ(t *testing.T) {
	seeds := xzSeeds(t) // one, big, dict, two, truncated, header, empty
	for _, tc := range []struct {
		in      []byte
		maxDict int64
		limit   int64
		size    int64
		err     error
	}{
		{seeds[0], 8 << 20, 0, 11, nil},
		{seeds[1], 8 << 20, 0, 200 << 10, nil},
		{seeds[3], 8 << 20, 0, 11 + 200<<10, nil},
		{seeds[6], 8 << 20, 0, 0, nil},
		{seeds[2], 1 << 20, 0, 0, errXZDict},
		{seeds[2], 128 << 20, 0, 11, nil},
		{seeds[4], 8 << 20, 0, 11, errXZ},
		{seeds[5], 8 << 20, 0, 0, errXZ},
		{seeds[1], 8 << 20, 1000, 0, nil}, // stops past the limit, after a chunk
	} {
		size, err := scanXZ(bufio.NewReader(bytes.NewReader(tc.in)), tc.maxDict, tc.limit)
		if !errors.Is(err, tc.err) || (tc.limit == 0 && err == nil && size != tc.size) || (tc.limit > 0 && size <= tc.limit) {
			t.Errorf("scanXZ(%d bytes, %d, %d) = %d, %v; want %d, %v", len(tc.in), tc.maxDict, tc.limit, size, err, tc.size, tc.err)
		}
	}
}

// xzSeeds returns xz files: whole, with two streams, cut short, with a
// large dictionary.
func xzSeeds(t testing.TB) [][]byte {
	one := compress(t, formatXZ, []byte("hello, disk"))
	big := compress(t, formatXZ, pattern(200<<10))
	dict := append([]byte(nil), one...)
	patchXZDict(t, dict, 30)
	two := append(append(append([]byte(nil), one...), 0, 0, 0, 0), big...)
	return [][]byte{one, big, dict, two, one[:len(one)-3], one[:20], compress(t, formatXZ, nil)}
}

// patchXZDict sets the LZMA2 dictionary byte of the first block header of
// the xz file b to d and fixes the header's CRC32.
func patchXZDict(t testing.TB, b []byte, d byte) {
	t.Helper()
	hdr := b[12 : 12+(int(b[12])+1)*4]
	i := bytes.Index(hdr, []byte{lzma2Filter, 1})
	if i < 0 {
		t.Fatal("no LZMA2 filter in the first block header")
	}
	hdr[i+2] = d
	body := hdr[:len(hdr)-4]
	binary.LittleEndian.PutUint32(hdr[len(hdr)-4:], crc32.ChecksumIEEE(body))
}
