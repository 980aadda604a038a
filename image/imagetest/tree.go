// Package imagetest writes the rootfs trees that tests of image lookups
// read.
package imagetest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// WriteTree makes root and writes files into it: keys are paths under
// root, values file contents; "->target" makes a symlink, and a key that
// ends in "/" a directory.
func WriteTree(t testing.TB, root string, files map[string]string) {
	t.Helper()
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	for rel, content := range files {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		var err error
		switch {
		case strings.HasSuffix(rel, "/"):
			err = os.MkdirAll(p, 0o755)
		case strings.HasPrefix(content, "->"):
			err = os.Symlink(strings.TrimPrefix(content, "->"), p)
		default:
			err = os.WriteFile(p, []byte(content), 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}
