package qemu

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/util/wait"
)

// launchTest launches a small TCG VM of spec for the test, killed when
// it ends.
func launchTest(ctx context.Context, t *testing.T, spec Spec) *VM {
	t.Helper()
	var stderr bytes.Buffer
	v, err := Launch(ctx, LaunchConfig{Binary: qemuBinary(t), Spec: spec, Stderr: &stderr, Dir: filepath.Dir(spec.QMPSocket)})
	if err != nil {
		t.Fatalf("launch: %v; stderr: %s", err, stderr.String())
	}
	t.Cleanup(func() {
		_ = v.Kill()
		<-v.Done()
	})
	return v
}

// TestSaveLoadState saves a running VM's state into a file after a
// header of the caller's, through an fd, and loads it into a second QEMU
// started to receive it: the second VM is paused with the state, and
// runs on Cont. A state cut short fails to load.
func TestSaveLoadState(t *testing.T) {
	ctx := testCtx(t, time.Minute)
	src := testSpec(t.TempDir())
	src.Paused = true
	a := launchTest(ctx, t, src)
	if err := a.Start(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if err := a.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "state")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	const header = "HEADER\n"
	if _, err := f.WriteString(header); err != nil {
		t.Fatal(err)
	}
	info, err := a.QMP().SaveState(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	if info.Status != "completed" || info.RAM == nil || info.RAM.Transferred <= 0 {
		t.Errorf("save: %+v", info)
	}
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if fi.Size() < int64(len(header))+4096 {
		t.Fatalf("state file of %d bytes", fi.Size())
	}
	if st, err := a.QMP().QueryStatus(ctx); err != nil || st.Status != "postmigrate" {
		t.Errorf("saved VM's status %+v, %v; want postmigrate", st, err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(data), header) {
		t.Fatalf("the header was overwritten: %q", data[:16])
	}

	load := func(data []byte) (*VM, error) {
		dst := testSpec(t.TempDir())
		dst.Paused, dst.Incoming = true, true
		b := launchTest(ctx, t, dst)
		in := filepath.Join(t.TempDir(), "in")
		if err := os.WriteFile(in, data, 0o600); err != nil {
			t.Fatal(err)
		}
		r, err := os.Open(in)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		if _, err := r.Seek(int64(len(header)), 0); err != nil {
			t.Fatal(err)
		}
		lctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		_, err = b.QMP().LoadState(lctx, r)
		return b, err
	}
	b, err := load(data)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := b.QMP().QueryStatus(ctx); err != nil || st.Status != "paused" {
		t.Errorf("loaded VM's status %+v, %v; want paused", st, err)
	}
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if st, err := b.QMP().QueryStatus(ctx); err != nil || st.Status != "running" {
		t.Errorf("resumed VM's status %+v, %v; want running", st, err)
	}

	if _, err := load(data[:len(data)/2]); err == nil {
		t.Errorf("a state cut in half loaded")
	}
}

// TestSaveStateNoRoom saves into a file on a filesystem too small for
// the state, and cancels a save whose context ends: both fail, and the
// VM stays where a fallback can take it (stopped, then running on Cont).
func TestSaveStateNoRoom(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: mounts a small tmpfs")
	}
	ctx := testCtx(t, time.Minute)
	spec := testSpec(t.TempDir())
	spec.Paused = true
	v := launchTest(ctx, t, spec)
	if err := v.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := v.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	small := t.TempDir()
	if err := unix.Mount("tmpfs", small, "tmpfs", 0, "size=256k"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(small, unix.MNT_DETACH) })
	f, err := os.Create(filepath.Join(small, "state"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := v.QMP().SaveState(ctx, f); err == nil {
		t.Fatal("a save onto a full filesystem succeeded")
	} else {
		t.Logf("save onto a full filesystem: %v", err)
	}
	if err := v.Resume(ctx); err != nil {
		t.Fatalf("cont after a failed save: %v", err)
	}
	if st, err := v.QMP().QueryStatus(ctx); err != nil || st.Status != "running" {
		t.Errorf("status after a failed save and cont: %+v, %v", st, err)
	}

	// A save cut short by its context is cancelled.
	if err := v.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe() // nobody reads: the save cannot finish
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	sctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if _, err := v.QMP().SaveState(sctx, w); err == nil {
		t.Fatal("a save that could not finish succeeded")
	}
	r.Close() // the writer gets EPIPE and QEMU's cancel can finish
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		var info MigrationInfo
		if err := v.QMP().Execute(ctx, "query-migrate", nil, &info); err != nil {
			return false, err
		}
		return info.Status == "cancelled" || info.Status == "failed", nil
	}); err != nil {
		t.Errorf("the cancelled save never ended: %v", err)
	}
	if err := v.Resume(ctx); err != nil {
		t.Fatalf("cont after a cancelled save: %v", err)
	}
}
