package launch

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/vmshim/vmshim/image"
	"github.com/vmshim/vmshim/jail"
	"github.com/vmshim/vmshim/thread"
)

// qemuImgJailID is the jail id qemu-img runs as in TestQEMUImgConfined.
const qemuImgJailID = 2000050

// TestQEMUImgConfined repeats what an image crafted against qemu-img
// would have it do, and looks at qemu-img while it runs, started as a
// create starts it: after the cgroup step, jailed. The image's disk is a
// FIFO no one writes to, so qemu-img waits in its open. It must show
// seccomp mode 2 and no_new_privs, the jail's uid, process 1 of a PID
// namespace of its own, a network namespace that is not the node's, and
// the VM's cgroup; once the create gives up, no process of the jail's
// uid is left.
func TestQEMUImgConfined(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("qemu-img runs confined and jailed, which needs root")
	}
	qemuImg, err := exec.LookPath("qemu-img")
	if err == nil {
		qemuImg, err = filepath.EvalSymlinks(qemuImg)
	}
	if err != nil || !jail.Shows(qemuImg) {
		t.Skip("qemu-img is not installed under /usr")
	}
	ctx := context.Background()
	c := testBuild(t, map[string]string{"/disk/": ""})
	cgPath := fmt.Sprintf("/vmshim-test-qemuimg-%d", os.Getpid())
	c.spec.Linux = &specs.Linux{CgroupsPath: cgPath}
	if err := c.cgroup(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.limits.cg.Delete(); err != nil {
			t.Error(err)
		}
	})
	c.img.Path = qemuImg
	c.img.Jail = &jail.Jail{Root: filepath.Join(t.TempDir(), "img"), UID: qemuImgJailID, GID: qemuImgJailID}
	if err := os.Mkdir(c.img.Jail.Root, 0o700); err != nil {
		t.Fatal(err)
	}
	pids := make(chan int, 1)
	start := c.img.Start
	c.img.Start = func(cmd *exec.Cmd, steps ...thread.Step) error {
		err := start(cmd, steps...)
		if err == nil {
			pids <- cmd.Process.Pid
		}
		return err
	}
	disk := filepath.Join(c.rootDir, "disk", "vm.raw")
	if err := unix.Mkfifo(disk, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(disk, os.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := &image.Boot{Disk: "/disk/vm.raw", Format: image.FormatRaw, Root: c.rootDir, DiskFile: f}

	ictx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := image.Inspect(ictx, c.img, b, image.Limits{})
		done <- err
	}()
	var pid int
	select {
	case pid = <-pids:
	case err := <-done:
		t.Fatalf("Inspect() returned %v before qemu-img started", err)
	}
	// The runner execs qemu-img once the shim lets it.
	var status map[string]string
	for {
		status = procStatus(t, pid)
		if status["Name"] == "qemu-img" {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("Inspect() returned %v before qemu-img ran", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	for k, want := range map[string]string{
		"Seccomp": "2", "NoNewPrivs": "1",
		"Uid":   fmt.Sprintf("%d\t%[1]d\t%[1]d\t%[1]d", qemuImgJailID),
		"NSpid": fmt.Sprintf("%d\t1", pid),
	} {
		if status[k] != want {
			t.Errorf("qemu-img's %s = %q, want %q", k, status[k], want)
		}
	}
	node, err1 := os.Readlink("/proc/self/ns/net")
	its, err2 := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err := errors.Join(err1, err2); err != nil {
		t.Fatal(err)
	}
	if its == node {
		t.Errorf("qemu-img runs in the node's network namespace %s", node)
	}
	cgroups, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("qemu-img, pid %d: Seccomp %s, NoNewPrivs %s, Uid %s, NSpid %s, netns %s (the node's %s)",
		pid, status["Seccomp"], status["NoNewPrivs"], status["Uid"], status["NSpid"], its, node)
	if !inCgroup(string(cgroups), cgPath) {
		t.Errorf("qemu-img's cgroups:\n%s\nwant %s", cgroups, cgPath)
	}

	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Inspect() = %v, want context.Canceled", err)
	}
	if killed, err := jail.KillID("/proc", qemuImgJailID, 5*time.Second); err != nil || len(killed) > 0 {
		t.Errorf("processes of the jail's uid left after the run: %v (%v)", killed, err)
	}
}

// procStatus reads /proc/PID/status into its fields.
func procStatus(t *testing.T, pid int) map[string]string {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, line := range strings.Split(string(data), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			out[k] = strings.TrimSpace(v)
		}
	}
	return out
}

// inCgroup reports whether a /proc/PID/cgroup lists path in the memory
// controller (v1) or the unified hierarchy (v2).
func inCgroup(cgroups, path string) bool {
	for _, line := range strings.Split(cgroups, "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 || parts[2] != path {
			continue
		}
		if parts[1] == "" || strings.Contains(","+parts[1]+",", ",memory,") {
			return true
		}
	}
	return false
}
