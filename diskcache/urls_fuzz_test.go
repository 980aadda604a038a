package diskcache

import (
	"bytes"
	"testing"
)

// FuzzParseURLs shows the urls file parser takes any bytes: what it
// accepts is at most maxURLs keys that format back to the same bytes.
func FuzzParseURLs(f *testing.F) {
	key := sum([]byte("u"))
	f.Add([]byte(""))
	f.Add([]byte(key + "\n"))
	f.Add([]byte(key + "\n" + key + "\n"))
	f.Add([]byte(key))
	f.Add([]byte("sha256:" + key + "\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		keys := parseURLs(b)
		if keys == nil {
			return
		}
		if len(keys) > maxURLs || len(b) > maxURLsFile {
			t.Fatalf("accepted %d keys from %d bytes", len(keys), len(b))
		}
		if !bytes.Equal(formatURLs(keys), b) {
			t.Fatalf("keys %q do not format to %q", keys, b)
		}
	})
}
