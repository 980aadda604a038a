package integration

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBadImagesFailCleanly runs images that cannot boot: each `ctr run`
// fails with a one-line error naming the problem and leaves nothing behind.
func TestBadImagesFailCleanly(t *testing.T) {
	qcow2, err := os.ReadFile(filepath.Join(env.guestDir, "disk-wait.qcow2"))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name  string
		files map[string][]byte
		want  string
	}{
		{"no-disk", map[string][]byte{"etc/motd": []byte("hello\n")}, "no VM disk in image"},
		{"corrupt-disk", map[string][]byte{"disk/disk.qcow2": qcow2[:len(qcow2)/3]}, "disk/disk.qcow2"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
			defer cancel()
			ref := "localhost/vmshim-test/bad:" + tc.name
			archive := filepath.Join(t.TempDir(), "image.tar")
			if err := writeArchive(archive, ref, tc.files); err != nil {
				t.Fatal(err)
			}
			if out, err := env.daemon.ctr(ctx, "images", "import", archive); err != nil {
				t.Fatalf("import: %v: %s", err, out)
			}
			defer env.daemon.ctr(context.Background(), "images", "rm", ref)

			id := uniqueID(t)
			out, err := env.daemon.ctr(ctx, "run", "--rm", "--runtime", runtimeName, ref, id)
			if err == nil {
				t.Fatalf("ctr run succeeded:\n%s", out)
			}
			lines := errorLines(out)
			if len(lines) != 1 || !strings.Contains(lines[0], tc.want) {
				t.Errorf("want one line naming %q, got:\n%s", tc.want, out)
			}
			t.Logf("ctr: %s", out)
			assertNothingLeft(ctx, t, id)
		})
	}
}

// errorLines returns ctr's output without the warnings containerd's client
// logs on its own account (such as the cgroup v1 deprecation notice).
func errorLines(out string) []string {
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if strings.HasPrefix(l, "time=") && strings.Contains(l, "level=warning") {
			continue
		}
		lines = append(lines, l)
	}
	return lines
}
