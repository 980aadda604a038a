package integration

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	runtimeoptions "github.com/containerd/containerd/api/types/runtimeoptions/v1"
	"golang.org/x/sys/unix"
)

// bootSlotsDir is where the node's shims keep their boot slots.
const bootSlotsDir = "/run/vmshim/boot-slots"

// Lines a paced VM writes into its log.
const (
	lineWaiting = "vmshim: waiting to boot: the node's 1 boot slots are taken"
	lineBooting = "vmshim: booting after waiting "
)

// holdBootSlot takes boot slot i as a shim would, waiting for a shim
// that holds it to give it back; the returned func gives it back.
func holdBootSlot(ctx context.Context, t *testing.T, i string) func() {
	t.Helper()
	if err := os.MkdirAll(bootSlotsDir, 0o700); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(bootSlotsDir, i), os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("boot slot %s stayed taken: %v", i, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	return func() { f.Close() }
}

// TestBootPacing runs VMs of a shim config with one boot slot, while
// the test holds that slot as a booting VM would:
//
//   - a VM started then is running but waits, and its log says so;
//     paused, it does not boot when the slot frees; resumed, it boots,
//     its log saying how long it waited, and gives the slot back once
//     its kernel is past its early boot;
//   - a VM stopped while it waits exits 0 at once, never having booted,
//     and leaves nothing.
func TestBootPacing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*bootTimeout)
	defer cancel()
	cfgPath := filepath.Join(t.TempDir(), "paced.toml")
	if err := os.WriteFile(cfgPath, []byte(env.daemon.shimConfig()+"boot_slots = 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	opts := &runtimeoptions.Options{ConfigPath: cfgPath}

	release := holdBootSlot(ctx, t, "0")
	v, err := createVM(ctx, t, uniqueID(t), imageKernelWait, opts)
	if err != nil {
		t.Fatalf("create task: %v\ncontainerd log:\n%s", err, env.daemon.logTail())
	}
	v.start(ctx, t)
	v.console.waitFor(ctx, t, lineWaiting)
	if err := v.task.Pause(ctx); err != nil {
		t.Fatalf("pause a waiting VM: %v", err)
	}
	release()
	time.Sleep(3 * time.Second)
	if out := v.console.String(); strings.Contains(out, lineBooting) || strings.Contains(out, markerBooted) {
		t.Fatalf("a paused VM booted when the slot freed:\n%s", out)
	}
	if err := v.task.Resume(ctx); err != nil {
		t.Fatalf("resume a waiting VM: %v", err)
	}
	v.console.waitFor(ctx, t, lineBooting)
	v.console.waitFor(ctx, t, markerBooted)
	// The guest's kernel is past its early boot: the slot is free again.
	release = holdBootSlot(ctx, t, "0")

	w, err := createVM(ctx, t, uniqueID(t), imageKernelWait, opts)
	if err != nil {
		t.Fatalf("create task: %v\ncontainerd log:\n%s", err, env.daemon.logTail())
	}
	w.start(ctx, t)
	w.console.waitFor(ctx, t, lineWaiting)
	if err := w.task.Kill(ctx, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := w.waitExit(ctx, t); code != 0 {
		t.Errorf("a VM stopped while it waited exited %d, want 0", code)
	}
	if out := w.console.String(); strings.Contains(out, markerBooted) {
		t.Errorf("a VM stopped while it waited booted:\n%s", out)
	}
	w.remove(t)
	assertNothingLeft(ctx, t, w.id)
	release()

	if err := v.task.Kill(ctx, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := v.waitExit(ctx, t); code != 0 {
		t.Errorf("the paced VM exited %d after a stop, want 0", code)
	}
	v.remove(t)
	assertNothingLeft(ctx, t, v.id)
}
