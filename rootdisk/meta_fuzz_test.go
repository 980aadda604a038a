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

// FuzzParseHeader feeds hostile block volume headers (anyone with the
// volume writes them): parseHeader never panics and accepts only a
// well-formed record after the magic line.
func FuzzParseHeader(f *testing.F) {
	fp := "sha256:" + strings.Repeat("cd", 32)
	f.Add([]byte(headerMagic + `{"version":1,"image":"` + fp + `","source":"/disk/a.img"}` + "\n\x00\x00"))
	f.Add([]byte(headerMagic + `{"version":1,"image":"` + fp + `"}`))
	f.Add([]byte("VMSHIM-ROOT-DISK v2\n{}\n"))
	f.Add([]byte(headerMagic + "\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m := parseHeader(b)
		if m != (meta{}) && (m.Version != 1 || !isFingerprint(m.Image) || !strings.HasPrefix(string(b), headerMagic)) {
			t.Fatalf("accepted %+v", m)
		}
	})
}
