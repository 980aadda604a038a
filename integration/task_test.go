package integration

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	apievents "github.com/containerd/containerd/api/events"
	"github.com/containerd/containerd/v2/core/events"
	"github.com/containerd/typeurl/v2"
)

// TestCtrRunPowersOff runs each image layout with `ctr run --rm`: the
// console reaches ctr's stdout and a guest that powers off exits 0.
func TestCtrRunPowersOff(t *testing.T) {
	for name, ref := range map[string]string{"disk": imageDiskPoweroff, "kernel": imageKernelOff} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
			defer cancel()
			id := uniqueID(t)
			out, err := env.daemon.ctr(ctx, "run", "--rm", "--runtime", runtimeName, ref, id)
			if err != nil {
				t.Fatalf("ctr run: %v\n%s\ncontainerd log:\n%s", err, out, env.daemon.logTail())
			}
			for _, m := range []string{markerBooted, markerPoweroff} {
				if !strings.Contains(out, m) {
					t.Errorf("console lacks %q:\n%s", m, out)
				}
			}
			assertNothingLeft(ctx, t, id)
		})
	}
}

// TestSIGTERMPowersDown checks that SIGTERM presses the ACPI power button:
// the guest powers itself off and the task exits 0. The image's disk is
// untouched by the run.
func TestSIGTERMPowersDown(t *testing.T) {
	for name, ref := range map[string]string{"disk": imageDiskWait, "kernel": imageKernelWait} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
			defer cancel()
			var before string
			if name == "disk" {
				before = imageFileDigest(ctx, t, ref, "disk/disk.qcow2")
			}
			v := startVM(ctx, t, ref)
			v.console.waitFor(ctx, t, markerBooted)
			if err := v.task.Kill(ctx, syscall.SIGTERM); err != nil {
				t.Fatalf("kill SIGTERM: %v", err)
			}
			if code := v.waitExit(ctx, t); code != 0 {
				t.Errorf("exit status %d, want 0\nconsole:\n%s", code, v.console.String())
			}
			if !strings.Contains(v.console.String(), markerACPI) {
				t.Errorf("guest did not see the power button:\n%s", v.console.String())
			}
			v.remove(t)
			assertNothingLeft(ctx, t, v.id)
			if name == "disk" {
				if after := imageFileDigest(ctx, t, ref, "disk/disk.qcow2"); after != before {
					t.Errorf("image disk changed: %s -> %s", before, after)
				}
			}
		})
	}
}

// TestSIGKILL checks that SIGKILL stops the VM at once with status 137.
func TestSIGKILL(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	v := startVM(ctx, t, imageKernelWait)
	v.console.waitFor(ctx, t, markerBooted)
	if err := v.task.Kill(ctx, syscall.SIGKILL); err != nil {
		t.Fatalf("kill SIGKILL: %v", err)
	}
	if code := v.waitExit(ctx, t); code != 137 {
		t.Errorf("exit status %d, want 137", code)
	}
	v.remove(t)
	assertNothingLeft(ctx, t, v.id)
}

// TestQEMUKilled kills the QEMU process behind the task's back: containerd
// must get a TaskExit with a non-zero status promptly.
func TestQEMUKilled(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	exits := subscribeExits(ctx, t)
	v := startVM(ctx, t, imageKernelWait)
	v.console.waitFor(ctx, t, markerBooted)
	if err := syscall.Kill(int(v.task.Pid()), syscall.SIGKILL); err != nil {
		t.Fatalf("kill qemu: %v", err)
	}
	killed := time.Now()
	// The acceptance bound for noticing a dead QEMU: exits are seen by
	// waiting on the process, not by polling.
	exit := exits.next(ctx, t, v.id, 2*time.Second)
	if exit.ExitStatus == 0 {
		t.Errorf("TaskExit status 0, want non-zero")
	}
	t.Logf("TaskExit %d after %v", exit.ExitStatus, time.Since(killed))
	v.remove(t)
	assertNothingLeft(ctx, t, v.id)
}

// exitEvents delivers containerd's /tasks/exit events.
type exitEvents struct {
	events <-chan *events.Envelope
	errs   <-chan error
}

// subscribeExits subscribes to TaskExit events before a test acts.
func subscribeExits(ctx context.Context, t *testing.T) *exitEvents {
	events, errs := env.client.EventService().Subscribe(ctx, `topic=="/tasks/exit"`)
	return &exitEvents{events: events, errs: errs}
}

// next returns the next TaskExit of container id, failing the test if none
// comes within limit.
func (e *exitEvents) next(ctx context.Context, t *testing.T, id string, limit time.Duration) *apievents.TaskExit {
	t.Helper()
	deadline := time.After(limit)
	for {
		select {
		case env := <-e.events:
			ev, err := typeurl.UnmarshalAny(env.Event)
			if err != nil {
				t.Fatal(err)
			}
			if exit, ok := ev.(*apievents.TaskExit); ok && exit.ContainerID == id {
				return exit
			}
		case err := <-e.errs:
			t.Fatalf("events: %v", err)
		case <-deadline:
			t.Fatalf("no TaskExit for %s within %v", id, limit)
		case <-ctx.Done():
			t.Fatalf("no TaskExit for %s: %v", id, ctx.Err())
		}
	}
}

// TestShimKilled kills the shim behind containerd's back: containerd runs
// the shim's delete action, which must stop QEMU and release everything
// from the record in the bundle.
func TestShimKilled(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	v := startVM(ctx, t, imageKernelWait)
	v.console.waitFor(ctx, t, markerBooted)
	killShim(ctx, t, v)
}

// killShim kills the shim of a running VM with SIGKILL and waits until
// containerd has run its delete action: the task exits non-zero, QEMU is
// gone and nothing of the task is left.
func killShim(ctx context.Context, t *testing.T, v *vm) {
	t.Helper()
	shims := processesMentioning("containerd-shim-vm-v2 -namespace " + testNamespace + " -id " + v.id)
	if len(shims) != 1 {
		t.Fatalf("want one shim process for %s, found %v", v.id, shims)
	}
	pid, _, _ := strings.Cut(shims[0], ":")
	shimPid, err := strconv.Atoi(pid)
	if err != nil {
		t.Fatal(err)
	}
	qemuPid := int(v.task.Pid())
	exits := subscribeExits(ctx, t)
	if err := syscall.Kill(shimPid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill shim: %v", err)
	}
	if exit := exits.next(ctx, t, v.id, time.Minute); exit.ExitStatus == 0 {
		t.Errorf("exit status 0 after the shim was killed, want non-zero")
	}
	// containerd has already deleted the task of the dead shim.
	v.task = nil
	v.remove(t)
	assertNothingLeft(ctx, t, v.id)
	if err := syscall.Kill(qemuPid, 0); err == nil {
		if st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", qemuPid)); !strings.Contains(string(st), ") Z") {
			t.Errorf("qemu pid %d still alive after the shim's delete action", qemuPid)
		}
	}
}
