package cloudinit

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestSeedBusyboxFindfs attaches seeds to loop devices and checks busybox's
// findfs, which CirrOS- and Alpine-style guests use to find their seed,
// finds each by its label, as util-linux's blkid does.
func TestSeedBusyboxFindfs(t *testing.T) {
	tools := needLoopTools(t, "losetup", "busybox", "blkid", "unshare", "mount", "mknod")
	for _, tc := range seedCases() {
		t.Run(tc.name, func(t *testing.T) {
			seed, _ := writeSeedImage(t, tc.files)
			dev := attachLoop(t, tools["losetup"], seed)
			if got := busyboxFindfs(t, tools, dev); got != dev {
				t.Errorf("busybox findfs LABEL=%s = %q, want %q", SeedLabel, got, dev)
			}
			// -c /dev/null: probe the device, not blkid's cache of what
			// an earlier user of the same loop device held.
			for tag, want := range map[string]string{"LABEL": SeedLabel, "TYPE": "iso9660"} {
				out, err := exec.Command(tools["blkid"], "-c", "/dev/null", "-o", "value", "-s", tag, dev).Output()
				if got := strings.TrimSpace(string(out)); err != nil || got != want {
					t.Errorf("blkid -s %s %s = %q (%v), want %q", tag, dev, got, err, want)
				}
			}
		})
	}
}

// TestSeedMount mounts a seed read-only with Linux's isofs, as a guest
// does, and checks it shows the three files under their lower-case (Rock
// Ridge) names with what was written.
func TestSeedMount(t *testing.T) {
	tools := needLoopTools(t, "losetup", "unshare", "mount", "umount", "tar")
	if !kernelHasISO9660() {
		t.Skip("the kernel has no iso9660 support (CONFIG_ISO9660_FS): cannot mount the seed")
	}
	files := seedFiles()
	seed, _ := writeSeedImage(t, files)
	dev := attachLoop(t, tools["losetup"], seed)
	got, err := mountedFiles(tools, dev, "ro", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if !equalFiles(got, files) {
		t.Errorf("mounted files = %q, want %q", names(got), names(files))
	}
}

// needLoopTools skips the test unless it runs as root with loop devices
// and the tools named, and returns their paths.
func needLoopTools(t *testing.T, tools ...string) map[string]string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("not root: attaching loop devices needs root")
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skipf("no loop devices: %v", err)
	}
	paths := map[string]string{}
	for _, tool := range tools {
		p, err := exec.LookPath(tool)
		if err != nil {
			t.Skipf("%s is not installed (integration/setup/deps.sh installs busybox-static and util-linux)", tool)
		}
		paths[tool] = p
	}
	return paths
}

// attachLoop attaches file read-only to a free loop device, detached in
// the test's Cleanup whatever the test's outcome, and returns the device.
func attachLoop(t *testing.T, losetup, file string) string {
	t.Helper()
	var stderr bytes.Buffer
	cmd := exec.Command(losetup, "-f", "--show", "-r", file)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	dev := strings.TrimSpace(string(out))
	if err != nil || !strings.HasPrefix(dev, "/dev/loop") {
		t.Fatalf("losetup -f --show -r %s: %q, %v: %s", file, dev, err, strings.TrimSpace(stderr.String()))
	}
	t.Cleanup(func() {
		if out, err := exec.Command(losetup, "-d", dev).CombinedOutput(); err != nil {
			t.Errorf("losetup -d %s: %v: %s", dev, err, strings.TrimSpace(string(out)))
		}
	})
	return dev
}

// busyboxFindfs runs busybox findfs LABEL=cidata and returns what it
// prints. It runs in a mount namespace of its own whose /dev holds only a
// node for dev, under dev's name: findfs prints the first device of /dev
// with the label, and another loop device labelled cidata must not answer
// for dev.
func busyboxFindfs(t *testing.T, tools map[string]string, dev string) string {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		t.Fatalf("stat %s: %v", dev, err)
	}
	major, minor := strconv.FormatUint(uint64(unix.Major(st.Rdev)), 10), strconv.FormatUint(uint64(unix.Minor(st.Rdev)), 10)
	const script = `set -e
"$1" -t tmpfs -o mode=0755 vmshim-test-dev /dev
"$2" -m 0400 "$3" b "$4" "$5"
exec "$6" findfs LABEL="$7"`
	var stderr bytes.Buffer
	cmd := exec.Command(tools["unshare"], "--mount", "--propagation", "private", "sh", "-c", script,
		"sh", tools["mount"], tools["mknod"], dev, major, minor, tools["busybox"], SeedLabel)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("busybox findfs: %v", err)
	}
	if err != nil {
		t.Logf("busybox findfs: %v: %s", err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(string(out))
}

// mountedFiles mounts dev on mnt with the iso9660 options opts and returns
// its root's regular files. The mount is made in a mount namespace of its
// own, so that no test outcome can leave it behind: the shell unmounts it
// on exit, and the namespace ends with the shell.
func mountedFiles(tools map[string]string, dev, opts, mnt string) (map[string][]byte, error) {
	const script = `set -e
"$1" -t iso9660 -o "$3" "$4" "$5"
trap '"$2" "$5"' EXIT
"$6" -C "$5" -cf - .`
	var stderr bytes.Buffer
	cmd := exec.Command(tools["unshare"], "--mount", "--propagation", "private", "sh", "-c", script,
		"sh", tools["mount"], tools["umount"], opts, dev, mnt, tools["tar"])
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("mount -o %s %s: %v: %s", opts, dev, err, strings.TrimSpace(stderr.String()))
	}
	files := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(out))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read the mounted files: %w", err)
		}
		name := path.Clean(h.Name)
		switch {
		case h.Typeflag == tar.TypeDir && name == ".":
		case h.Typeflag == tar.TypeReg && !strings.Contains(name, "/"):
			if files[name], err = io.ReadAll(tr); err != nil {
				return nil, fmt.Errorf("read the mounted %s: %w", name, err)
			}
		default:
			return nil, fmt.Errorf("the mounted seed holds %q (type %c), not a file of its root", h.Name, h.Typeflag)
		}
	}
}

// kernelHasISO9660 reports whether the running kernel mounts iso9660: it
// is built in or loaded, or a module of it is installed for mount to load.
func kernelHasISO9660() bool {
	if fss, err := os.ReadFile("/proc/filesystems"); err == nil && bytes.Contains(fss, []byte("\tiso9660\n")) {
		return true
	}
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return false
	}
	deps, err := os.ReadFile("/lib/modules/" + unix.ByteSliceToString(u.Release[:]) + "/modules.dep")
	return err == nil && bytes.Contains(deps, []byte("/isofs.ko"))
}
