package integration

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/opencontainers/image-spec/identity"
)

const runtimeName = "io.containerd.vm.v2"

// Markers the test guests print on their console.
const (
	markerBooted   = "VMSHIM-GUEST-BOOTED"
	markerPoweroff = "VMSHIM-GUEST-POWEROFF"
	markerACPI     = "VMSHIM-GUEST-ACPI-POWERDOWN"
)

// Test images imported by TestMain.
const (
	imageDiskWait     = "localhost/vmshim-test/disk:wait"
	imageDiskPoweroff = "localhost/vmshim-test/disk:poweroff"
	imageKernelWait   = "localhost/vmshim-test/kernel:wait"
	imageKernelOff    = "localhost/vmshim-test/kernel:poweroff"
	imageKernelAgent  = "localhost/vmshim-test/kernel:agent" // runs qemu-guest-agent
	imageDiskAgent    = "localhost/vmshim-test/disk:agent"   // runs qemu-guest-agent
)

// bootTimeout is generous: the guests boot under TCG on two cores.
const bootTimeout = 3 * time.Minute

// consoleOut collects a task's stdout and lets a test wait for a marker.
type consoleOut struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	changed chan struct{}
}

func newConsoleOut() *consoleOut { return &consoleOut{changed: make(chan struct{})} }

func (c *consoleOut) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.buf.Write(p)
	close(c.changed)
	c.changed = make(chan struct{})
	return len(p), nil
}

func (c *consoleOut) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.buf.String()
}

// waitFor blocks until the output contains marker.
func (c *consoleOut) waitFor(ctx context.Context, t *testing.T, marker string) {
	t.Helper()
	c.waitForAfter(ctx, t, 0, marker)
}

// waitForAfter blocks until the output after its first from bytes
// contains marker.
func (c *consoleOut) waitForAfter(ctx context.Context, t *testing.T, from int, marker string) {
	t.Helper()
	for {
		c.mu.Lock()
		found, ch := strings.Contains(c.buf.String()[from:], marker), c.changed
		c.mu.Unlock()
		if found {
			return
		}
		select {
		case <-ch:
		case <-ctx.Done():
			t.Fatalf("console never showed %q from byte %d on: %v\nconsole:\n%s", marker, from, ctx.Err(), c.String())
		}
	}
}

// vm is a started VM task and what the test needs of it.
type vm struct {
	id        string
	container client.Container
	task      client.Task
	console   *consoleOut
	exit      <-chan client.ExitStatus
}

// uniqueID returns a container id derived from the test's name.
func uniqueID(t *testing.T) string {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	name := strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))
	return fmt.Sprintf("%s-%x", name, b)
}

// startVM creates and starts a VM task from an imported image.
func startVM(ctx context.Context, t *testing.T, ref string) *vm {
	t.Helper()
	v, err := createVM(ctx, t, uniqueID(t), ref, nil)
	if err != nil {
		t.Fatalf("create task: %v\ncontainerd log:\n%s", err, env.daemon.logTail())
	}
	v.start(ctx, t)
	return v
}

// createVM creates VM task id from an imported image, with the runtime
// options and spec options given; the task is not started.
func createVM(ctx context.Context, t *testing.T, id, ref string, runtimeOpts any, opts ...oci.SpecOpts) (*vm, error) {
	t.Helper()
	return env.createVM(ctx, t, id, ref, runtimeOpts, nil, opts...)
}

// createVM creates VM task id on the suite's daemon. The task's IO is
// ioc's, or, when ioc is nil, its console and a discarded stderr.
func (s *suite) createVM(ctx context.Context, t *testing.T, id, ref string, runtimeOpts any,
	ioc func(*vm) cio.Creator, opts ...oci.SpecOpts) (*vm, error) {
	t.Helper()
	img, err := s.client.GetImage(ctx, ref)
	if err != nil {
		t.Fatalf("get image %s: %v", ref, err)
	}
	c, err := s.client.NewContainer(ctx, id,
		client.WithImage(img),
		client.WithNewSnapshot(id, img),
		client.WithRuntime(runtimeName, runtimeOpts),
		client.WithNewSpec(append([]oci.SpecOpts{oci.WithImageConfig(img), oci.WithHostname(id)}, opts...)...),
	)
	if err != nil {
		t.Fatalf("create container: %v", err)
	}
	v := &vm{id: id, container: c, console: newConsoleOut()}
	t.Cleanup(func() { v.remove(t) })
	creator := cio.NewCreator(cio.WithStreams(nil, v.console, io.Discard))
	if ioc != nil {
		creator = ioc(v)
	}
	v.task, err = c.NewTask(ctx, creator)
	return v, err
}

// start starts a created VM task.
func (v *vm) start(ctx context.Context, t *testing.T) {
	t.Helper()
	var err error
	if v.exit, err = v.task.Wait(ctx); err != nil {
		t.Fatalf("wait task: %v", err)
	}
	if err := v.task.Start(ctx); err != nil {
		t.Fatalf("start task: %v", err)
	}
}

// waitExit waits for the task to exit and returns its status.
func (v *vm) waitExit(ctx context.Context, t *testing.T) uint32 {
	t.Helper()
	select {
	case st := <-v.exit:
		code, _, err := st.Result()
		if err != nil {
			t.Fatalf("exit status: %v", err)
		}
		return code
	case <-ctx.Done():
		t.Fatalf("task %s did not exit: %v\nconsole:\n%s", v.id, ctx.Err(), v.console.String())
	}
	return 0
}

// remove deletes the task and the container with its snapshot.
func (v *vm) remove(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if v.task != nil {
		if _, err := v.task.Delete(ctx, client.WithProcessKill); err != nil && !strings.Contains(err.Error(), "not found") {
			t.Errorf("delete task %s: %v", v.id, err)
		}
		v.task = nil
	}
	if v.container != nil {
		if err := v.container.Delete(ctx, client.WithSnapshotCleanup); err != nil && !strings.Contains(err.Error(), "not found") {
			t.Errorf("delete container %s: %v", v.id, err)
		}
		v.container = nil
	}
}

// assertNothingLeft checks that no trace of container id remains: no QEMU
// or shim process, no mount, no runtime dir, no bundle, no snapshot.
func assertNothingLeft(ctx context.Context, t *testing.T, id string) {
	t.Helper()
	env.assertNothingLeft(ctx, t, id)
}

// assertNothingLeft is assertNothingLeft on the suite's daemon.
func (s *suite) assertNothingLeft(ctx context.Context, t *testing.T, id string) {
	t.Helper()
	// Processes may take a moment to be reaped after delete returns.
	deadline := time.Now().Add(5 * time.Second)
	for {
		procs := processesMentioning(id)
		if len(procs) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("processes left for %s: %v", id, procs)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, m := range mountsUnder(s.daemon.dir) {
		if strings.Contains(m, id) {
			t.Errorf("mount left for %s: %s", id, m)
		}
	}
	if _, err := os.Stat(shimRuntimeDir(testNamespace, id)); err == nil {
		t.Errorf("runtime dir left for %s", id)
	}
	if _, err := os.Stat(vmNetns(testNamespace, id)); err == nil {
		t.Errorf("network namespace left for %s", id)
	}
	// ctr's containers run in the cgroup /NAMESPACE/ID.
	if left, _ := filepath.Glob(filepath.Join(cgroupRoot, "*", testNamespace, id)); len(left) > 0 {
		t.Errorf("cgroups left for %s: %v", id, left)
	}
	bundle := filepath.Join(s.daemon.dir, "state", "io.containerd.runtime.v2.task", testNamespace, id)
	if _, err := os.Stat(bundle); err == nil {
		t.Errorf("bundle left for %s: %s", id, bundle)
	}
	if err := s.client.SnapshotService("overlayfs").Walk(ctx, func(_ context.Context, info snapshots.Info) error {
		if info.Name == id {
			t.Errorf("snapshot left for %s", id)
		}
		return nil
	}); err != nil {
		t.Errorf("walk snapshots: %v", err)
	}
}

// shimHash is the name the shim derives from a task's containerd
// namespace and id for what it makes of the task on the host (its
// runtime dir, its own network namespace).
func shimHash(ns, id string) string {
	sum := sha256.Sum256([]byte(ns + "/" + id))
	return hex.EncodeToString(sum[:8])
}

// shimRuntimeDir is the runtime dir of task id of namespace ns.
func shimRuntimeDir(ns, id string) string {
	return filepath.Join("/run/vmshim", shimHash(ns, id))
}

// vmNetns is the path of the network namespace the shim makes for a
// container that asks for one of its own.
func vmNetns(ns, id string) string {
	return filepath.Join("/run/netns", "vmshim-"+shimHash(ns, id))
}

// processesMentioning lists "pid: cmdline" of processes whose command
// line contains s.
func processesMentioning(s string) []string {
	entries, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range entries {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		data, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(data) == 0 {
			continue
		}
		cmdline := strings.ReplaceAll(string(data), "\x00", " ")
		if strings.Contains(cmdline, s) {
			out = append(out, e.Name()+": "+cmdline)
		}
	}
	return out
}

// dumpShimStacks has the shim of container id write its goroutines into
// the daemon's log (shimStackDump), and returns the end of that log: for
// a test that finds the shim stuck.
func dumpShimStacks(d *daemon, id string) string {
	for _, p := range processesMentioning(" -id " + id + " ") {
		pid, cmdline, _ := strings.Cut(p, ": ")
		if n, err := strconv.Atoi(pid); err == nil && strings.Contains(cmdline, "containerd-shim-vm-v2") {
			_, _ = shimStackDump(d, n, 5*time.Second)
		}
	}
	return tailFile(d.logPath, 64<<10)
}

// shimStackDump has shim pid write its goroutines into the daemon's log
// (containerd's shim library dumps them on SIGUSR1, as one line with the
// shim's pid, its newlines escaped) and returns that line once it is
// there, within limit.
func shimStackDump(d *daemon, pid int, limit time.Duration) (string, error) {
	st, err := os.Stat(d.logPath)
	if err != nil {
		return "", err
	}
	if err := syscall.Kill(pid, syscall.SIGUSR1); err != nil {
		return "", fmt.Errorf("SIGUSR1 to shim %d: %w", pid, err)
	}
	mark := fmt.Sprintf("pid=%d ", pid)
	for deadline := time.Now().Add(limit); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		f, err := os.Open(d.logPath)
		if err != nil {
			return "", err
		}
		var data []byte
		if _, err := f.Seek(st.Size(), io.SeekStart); err == nil {
			data, _ = io.ReadAll(f)
		}
		f.Close()
		for line := range strings.Lines(string(data)) {
			if strings.Contains(line, "END goroutine stack dump") && strings.Contains(line, mark) {
				return line, nil
			}
		}
	}
	return "", fmt.Errorf("shim %d wrote no stack dump to %s within %v of SIGUSR1", pid, d.logPath, limit)
}

// imageFileDigest returns the sha256 of a file inside an image's layers,
// read through a read-only view of its snapshot.
func imageFileDigest(ctx context.Context, t *testing.T, ref, path string) string {
	t.Helper()
	img, err := env.client.GetImage(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	diffIDs, err := img.RootFS(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sn := env.client.SnapshotService("overlayfs")
	key := uniqueID(t) + "-view"
	mounts, err := sn.View(ctx, key, identity.ChainID(diffIDs).String())
	if err != nil {
		t.Fatalf("view image snapshot: %v", err)
	}
	defer sn.Remove(ctx, key)
	dir := t.TempDir()
	if err := mount.All(mounts, dir); err != nil {
		t.Fatalf("mount image view: %v", err)
	}
	defer mount.UnmountAll(dir, 0)
	f, err := os.Open(filepath.Join(dir, path))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}
