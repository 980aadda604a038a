package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestBadImagesFailCleanly runs images that cannot or must not boot: each
// `ctr run` fails with one line naming the problem and leaves nothing
// behind. The hostile disks, made with the host's qemu-img in a temp dir,
// point at files of the host, which must never be used.
func TestBadImagesFailCleanly(t *testing.T) {
	qcow2, err := os.ReadFile(filepath.Join(env.guestDir, "disk-wait.qcow2"))
	if err != nil {
		t.Fatal(err)
	}
	truncated := qcow2[:len(qcow2)/3]
	// -u: qemu-img create does not open the backing file.
	backed := makeQCOW2(t, "-u", "-b", "/etc/passwd", "-F", "raw", "64M")
	cases := []struct {
		name    string
		entries map[string]layerEntry
		want    string
	}{
		// An image with no VM is an ordinary container's, which runc runs:
		// this one's command (/vm) is missing, and runc says so.
		{"no-disk", map[string]layerEntry{"etc/motd": layerFile([]byte("hello\n"))}, `exec: "/vm": stat /vm: no such file or directory`},
		{"truncated", map[string]layerEntry{"disk/disk.qcow2": layerFile(truncated)}, "disk /disk/disk.qcow2: image is corrupt"},
		{"backing-file", map[string]layerEntry{"disk/disk.qcow2": layerFile(backed)},
			`disk /disk/disk.qcow2: image has a backing file "/etc/passwd"`},
		{"data-file", map[string]layerEntry{"disk/disk.qcow2": layerFile(dataFileQCOW2(t, "/etc/hostname"))},
			`disk /disk/disk.qcow2: image uses an external data file "/etc/hostname"`},
		// A symlink resolves inside the rootfs: an absolute target, or one
		// climbing out with "..", names the image's file, never the host's.
		{"symlink-absolute", map[string]layerEntry{"disk/disk.qcow2": layerLink("/etc/passwd")},
			"disk /disk/disk.qcow2: points to /etc/passwd, which is not in the image"},
		{"symlink-climbing", map[string]layerEntry{"disk/disk.qcow2": layerLink("../../../../etc/shadow")},
			"disk /disk/disk.qcow2: points to /etc/shadow, which is not in the image"},
		// The host's /etc/passwd is text (a raw disk that would boot into
		// SeaBIOS's "no bootable device"); the image's is a truncated qcow2,
		// named by its path in the image.
		{"symlink-to-image-file", map[string]layerEntry{
			"disk/disk.qcow2": layerLink("../../../../etc/passwd"),
			"etc/passwd":      layerFile(truncated),
		}, "disk /etc/passwd: image is corrupt"},
		// A disk named like a raw one whose bytes are a qcow2 header is a
		// qcow2, detected from the header (never probed by QEMU) and checked
		// as one: here its backing file is refused.
		{"raw-name-qcow2-header", map[string]layerEntry{"disk/disk.img": layerFile(backed)},
			`disk /disk/disk.img: image has a backing file "/etc/passwd"`},
		{"oversized", map[string]layerEntry{"disk/disk.qcow2": layerFile(makeQCOW2(t, "300G"))},
			"disk /disk/disk.qcow2: virtual size 300Gi is more than the limit 256Gi"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
			defer cancel()
			ref := "localhost/vmshim-test/bad:" + tc.name
			archive := filepath.Join(t.TempDir(), "image.tar")
			if err := writeLinkArchive(archive, ref, tc.entries); err != nil {
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
			t.Logf("%s", strings.Join(lines, " / "))
			assertNothingLeft(ctx, t, id)
		})
	}
}

// makeQCOW2 runs `qemu-img create -f qcow2 disk.qcow2 ARGS...` in a temp
// dir (ARGS ends with the size) and returns the image.
func makeQCOW2(t *testing.T, args ...string) []byte {
	t.Helper()
	dir := t.TempDir()
	size := args[len(args)-1]
	qemuImg(t, dir, append(append([]string{"create", "-q", "-f", "qcow2"}, args[:len(args)-1]...), "disk.qcow2", size)...)
	data, err := os.ReadFile(filepath.Join(dir, "disk.qcow2"))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// dataFileQCOW2 returns a qcow2 whose external data file is target. It is
// made with a data file of the same name length in a temp dir, whose name
// is then replaced in the header, so qemu-img never creates or opens
// target; qemu-img info confirms the result.
func dataFileQCOW2(t *testing.T, target string) []byte {
	t.Helper()
	dir := t.TempDir()
	placeholder := strings.Repeat("x", len(target))
	qemuImg(t, dir, "create", "-q", "-f", "qcow2", "-o", "data_file="+placeholder, "disk.qcow2", "64M")
	p := filepath.Join(dir, "disk.qcow2")
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count(data, []byte(placeholder)); n != 1 {
		t.Fatalf("data file name %q appears %d times in the qcow2 header", placeholder, n)
	}
	data = bytes.Replace(data, []byte(placeholder), []byte(target), 1)
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	var info struct {
		Specific struct {
			Data struct {
				DataFile string `json:"data-file"`
			} `json:"data"`
		} `json:"format-specific"`
	}
	out := qemuImg(t, dir, "info", "--output=json", "-f", "qcow2", "disk.qcow2")
	if err := json.Unmarshal(out, &info); err != nil || info.Specific.Data.DataFile != target {
		t.Fatalf("qemu-img info: data file %q (%v), want %q:\n%s", info.Specific.Data.DataFile, err, target, out)
	}
	return data
}

// qemuImg runs the host's qemu-img in dir and returns its stdout.
func qemuImg(t *testing.T, dir string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command("qemu-img", args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("qemu-img %s: %v: %s", strings.Join(args, " "), err, stderr.String())
	}
	return out
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
