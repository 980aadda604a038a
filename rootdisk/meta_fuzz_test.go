package rootdisk

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzParseMeta feeds hostile MetaName contents (anyone who reaches the
// volume can write it): parseMeta never panics, accepts only version 1
// with a well-formed fingerprint, and what source says of it is one
// printable line.
func FuzzParseMeta(f *testing.F) {
	fp := "sha256:" + strings.Repeat("ab", 32)
	f.Add([]byte(`{"version":1,"image":"` + fp + `","source":"/disk/a.qcow2","made":"2026-11-26T03:00:00Z"}`))
	f.Add([]byte(`{"version":2,"image":"` + fp + `"}`))
	f.Add([]byte(`{"version":1,"image":"sha256:ZZ","source":"\u0000\n"}`))
	f.Add([]byte(`{"version":1,"image":"` + fp + `","source":"a\nb\u202e` + strings.Repeat("x", 300) + `"}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m := parseMeta(b)
		if m != (meta{}) && (m.Version != 1 || !isFingerprint(m.Image)) {
			t.Fatalf("accepted %+v", m)
		}
		s := m.source()
		if strings.ContainsAny(s, "\n\r") || !utf8.ValidString(s) || len(s) > 400 {
			t.Fatalf("source() = %q", s)
		}
	})
}
