package image

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/vmshim/vmshim/jail"
)

func init() {
	// As the shim's main does: the main goroutine keeps the main thread,
	// so no goroutine that enters a jail for good runs on it and wedges it
	// there (/proc/self, the main thread's, would show the jail's mounts).
	runtime.LockOSThread()
}

// The ids jailed qemu-img runs as in these tests, and a group that is
// neither root's nor the jail's.
const (
	testJailID = 2000000
	testGroup  = 2000001
)

// hostQEMUImg runs the host's qemu-img confined, unjailed; confinement
// makes namespaces, which needs root.
func hostQEMUImg(t *testing.T) QEMUImg {
	t.Helper()
	needRoot(t)
	return QEMUImg{Path: needQEMUImg(t)}
}

// needRoot skips a test that runs anything confined, unless it runs as
// root.
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("confinement makes namespaces, which needs root")
	}
}

// jailedQEMUImg runs the host's qemu-img confined in a jail of the test
// ids, as the shim does; it needs root.
func jailedQEMUImg(t *testing.T) QEMUImg {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("a jail needs root")
	}
	q := hostQEMUImg(t)
	if !jail.Shows(q.Path) {
		t.Skipf("%s is outside /usr, which is all a jail shows", q.Path)
	}
	q.Jail = &jail.Jail{Root: filepath.Join(t.TempDir(), "jail"), UID: testJailID, GID: testJailID}
	if err := os.Mkdir(q.Jail.Root, 0o700); err != nil {
		t.Fatal(err)
	}
	return q
}

// needProgram finds name, resolved to the file it is, or skips the test.
func needProgram(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err == nil {
		p, err = filepath.EvalSymlinks(p)
	}
	if err != nil {
		t.Skipf("%s is not installed", name)
	}
	return p
}

// qemuImgModes are the ways the shim runs qemu-img.
func qemuImgModes(t *testing.T) []struct {
	name string
	q    func(t *testing.T) QEMUImg
} {
	return []struct {
		name string
		q    func(t *testing.T) QEMUImg
	}{{"host", hostQEMUImg}, {"jail", jailedQEMUImg}}
}

// TestQEMUImgLimits checks the program run as qemu-img runs under the
// limits and the seccomp filter, with no_new_privs, and, jailed, as the
// jail's ids. A shell stands in for qemu-img (the jail shows only /usr,
// so no test script can run there) and reports, with builtins only (the
// filter lets it exec nothing), its limits as ulimit reads them (CPU
// seconds, address space KiB, core blocks, open files), then its uid,
// seccomp mode and no_new_privs from /proc/self/status, then what its
// environment holds: MALLOC_ARENA_MAX, and none of the caller's (HOME).
func TestQEMUImgLimits(t *testing.T) {
	sh := needProgram(t, "sh")
	if !jail.Shows(sh) {
		t.Skipf("%s is outside /usr", sh)
	}
	limits := []string{strconv.Itoa(int(QEMUImgCPUTime.Seconds())), strconv.Itoa(QEMUImgAddressSpace >> 10), "0", "1024"}
	for _, m := range qemuImgModes(t) {
		t.Run(m.name, func(t *testing.T) {
			q := m.q(t)
			q.Path = sh
			res, err := q.run(context.Background(), nil, nil, "-c", "ulimit -t; ulimit -v; ulimit -c; ulimit -n; ulimit -H -t; ulimit -H -v; ulimit -H -c; ulimit -H -n; "+
				"while read -r k v rest; do case $k in Uid:|Seccomp:|NoNewPrivs:) echo $v;; esac; done </proc/self/status; "+
				"echo ${MALLOC_ARENA_MAX:-none} ${HOME:-nohome}")
			if err != nil || res.code != 0 {
				t.Fatalf("run() = %+v, %v", res, err)
			}
			uid := os.Geteuid()
			if q.Jail != nil {
				uid = testJailID
			}
			want := append(append(append([]string(nil), limits...), limits...), strconv.Itoa(uid), "1", "2", "1", "nohome")
			if got := strings.Fields(string(res.stdout)); !reflect.DeepEqual(got, want) {
				t.Errorf("soft limits, hard limits, uid, no_new_privs, seccomp, MALLOC_ARENA_MAX, HOME = %q, want %q", got, want)
			}
		})
	}
}

// TestQEMUImgArgv checks what qemu-img is run with: its arguments, with
// the disk passed open as an inherited fd.
func TestQEMUImgArgv(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	argsFile := filepath.Join(dir, "args")
	fake := filepath.Join(dir, "qemu-img")
	script := "#!/bin/sh\nprintf '%s\\n' \"$0\" \"$@\" > " + argsFile + "\nexit 1\n"
	if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	b := qcow2Boot(t)
	q := QEMUImg{Path: fake}
	if _, err := Inspect(context.Background(), q, b, Limits{}); err == nil {
		t.Fatal("Inspect() with a failing qemu-img succeeded")
	}
	data, err := os.ReadFile(argsFile)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{fake, "info", "--output=json", "-f", "qcow2", "/dev/fd/3"}
	if got := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n"); !reflect.DeepEqual(got, want) {
		t.Errorf("qemu-img argv = %q, want %q", got, want)
	}
}

// TestQEMUImgKilled checks a qemu-img killed by a signal, as the kernel
// kills one past its CPU limit, fails the call with a message that says
// so. The fake qemu-img spins past a CPU limit of 1s: it is process 1 of
// its PID namespace, which no signal from inside that namespace kills.
func TestQEMUImgKilled(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	q := QEMUImg{Path: filepath.Join(dir, "qemu-img"), CPUTime: time.Second}
	script := "#!/bin/sh\necho 'qemu-img: spinning' >&2\nkill -KILL $$\nwhile :; do :; done\n"
	if err := os.WriteFile(q.Path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	b := qcow2Boot(t)
	_, err := Inspect(context.Background(), q, b, Limits{})
	want := "disk /disk/vm.qcow2: qemu-img info was killed ("
	if err == nil || !strings.HasPrefix(err.Error(), want) || !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("Inspect() error = %v, want failed precondition %q...", err, want)
	}
	if !strings.Contains(err.Error(), "it may use 1s of CPU and 1Gi of address space: spinning") {
		t.Errorf("Inspect() error = %q, want the limits and qemu-img's message", err)
	}
	f, err := os.Create(filepath.Join(dir, "overlay.qcow2"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	err = CreateOverlay(context.Background(), q, f, FormatQCOW2, 1<<20, 0)
	want = "overlay " + f.Name() + ": qemu-img create was killed ("
	if err == nil || !strings.HasPrefix(err.Error(), want) || !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("CreateOverlay() error = %v, want failed precondition %q...", err, want)
	}
}

// TestInspectJailedReadable checks the modes a jailed qemu-img can read a
// disk with: readable by others, or by a group other than root's, which
// the jailed qemu-img then holds; a disk only its owner or root's group
// may read is refused before qemu-img runs, in one line that says why.
func TestInspectJailedReadable(t *testing.T) {
	q := jailedQEMUImg(t)
	tests := []struct {
		name    string
		mode    os.FileMode
		gid     int
		wantErr string // "" = accepted
	}{
		{"readable by others", 0o444, 0, ""},
		{"readable by others only", 0o404, testGroup, ""},
		{"readable by a non-root group", 0o440, testGroup, ""},
		{"kubevirt containerdisk", 0o440, 107, ""},
		{"owner only", 0o400, 0, "disk /disk/vm.qcow2: mode 0400, owner 0:0: vmshim checks images as an unprivileged user, which cannot read it; make the file readable by others, or by a group other than root's"},
		{"owner only, any group", 0o600, testGroup, "disk /disk/vm.qcow2: mode 0600, owner 0:2000001: vmshim checks images"},
		{"root's group only", 0o440, 0, "disk /disk/vm.qcow2: mode 0440, owner 0:0: vmshim checks images"},
		{"nobody", 0o000, testGroup, "disk /disk/vm.qcow2: mode 0000, owner 0:2000001: vmshim checks images"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root, disk := diskRoot(t, "vm.qcow2")
			qemuImgRun(t, "create", "-q", "-f", "qcow2", disk, "1M")
			if err := os.Chown(disk, 0, tc.gid); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(disk, tc.mode); err != nil {
				t.Fatal(err)
			}
			b, err := Find(root)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			info, err := Inspect(context.Background(), q, b, Limits{})
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("Inspect() error = %v", err)
				}
				if info.Format != FormatQCOW2 || info.VirtualSize != 1<<20 {
					t.Fatalf("Inspect() = %+v", *info)
				}
				return
			}
			if err == nil || !strings.HasPrefix(err.Error(), tc.wantErr) || !errdefs.IsInvalidArgument(err) {
				t.Fatalf("Inspect() error = %v, want invalid argument %q", err, tc.wantErr)
			}
			if strings.Contains(err.Error(), "\n") || strings.Contains(err.Error(), root) {
				t.Fatalf("Inspect() error is not one line naming rootfs paths: %q", err)
			}
		})
	}
}

// TestInspectUnjailedReadable checks the mode rules are the jail's: an
// unjailed qemu-img runs as the shim, which reads any disk.
func TestInspectUnjailedReadable(t *testing.T) {
	root, disk := diskRoot(t, "vm.qcow2")
	qemuImgRun(t, "create", "-q", "-f", "qcow2", disk, "1M")
	if err := os.Chmod(disk, 0o400); err != nil {
		t.Fatal(err)
	}
	b, err := Find(root)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := Inspect(context.Background(), hostQEMUImg(t), b, Limits{}); err != nil {
		t.Fatalf("Inspect() error = %v", err)
	}
}

// qcow2Boot finds a rootfs whose /disk/vm.qcow2 is a bare qcow2 header;
// the test closes the Boot.
func qcow2Boot(t *testing.T) *Boot {
	t.Helper()
	root, disk := diskRoot(t, "vm.qcow2")
	if err := os.WriteFile(disk, []byte(qcow2Header), 0o644); err != nil {
		t.Fatal(err)
	}
	b, err := Find(root)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}
