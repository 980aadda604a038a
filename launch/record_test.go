package launch

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/vmshim/vmshim/image"
	"github.com/vmshim/vmshim/jail"
)

func TestRecordRoundTrip(t *testing.T) {
	bundle := t.TempDir()
	want := &Record{
		ID: "vm1", Bundle: bundle, RuntimeDir: "/run/vmshim/default/vm1",
		Rootfs: filepath.Join(bundle, "rootfs"), VMFiles: filepath.Join(bundle, "rootfs"),
		JailOwner: "default/vm1", JailID: 100042, Pid: 4242, PidStart: 123456,
		Made: []string{madeJailID, madeRuntimeDir, madeRootfs, madeVMFiles, madeProcess},
	}
	if err := want.save(); err != nil {
		t.Fatal(err)
	}
	// Saving again replaces the record.
	want.Pid = 4343
	if err := want.save(); err != nil {
		t.Fatal(err)
	}
	got, err := ReadRecord(bundle)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("read %+v, want %+v", *got, *want)
	}
	entries, err := os.ReadDir(bundle)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Name() != recordFile {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Fatalf("bundle holds %v, want only %s (no temporary file)", names, recordFile)
	}
	if fi, err := os.Stat(filepath.Join(bundle, recordFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("record file mode: %v, %v", fi, err)
	}
}

func TestRecordBundleFromPath(t *testing.T) {
	// The bundle is where the record was found, not what it says: bundles
	// can move (the delete action reads them from another path).
	old, moved := t.TempDir(), t.TempDir()
	if err := (&Record{ID: "vm1", Bundle: old}).save(); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(old, recordFile), filepath.Join(moved, recordFile)); err != nil {
		t.Fatal(err)
	}
	r, err := ReadRecord(moved)
	if err != nil || r.Bundle != moved || r.ID != "vm1" {
		t.Fatalf("readRecord: %+v, %v", r, err)
	}
}

func TestReadRecordErrors(t *testing.T) {
	if _, err := ReadRecord(t.TempDir()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing record: %v, want ErrNotExist", err)
	}
	bundle := t.TempDir()
	if err := os.WriteFile(filepath.Join(bundle, recordFile), []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := ReadRecord(bundle)
	if err == nil || !strings.Contains(err.Error(), bundle) {
		t.Fatalf("corrupt record: %v, want an error naming the bundle", err)
	}
}

func TestRecordSaveMissingBundle(t *testing.T) {
	r := &Record{ID: "vm1", Bundle: filepath.Join(t.TempDir(), "gone")}
	if err := r.save(); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("save to missing bundle: %v, want ErrNotExist", err)
	}
}

func TestReleaseRemovesEverything(t *testing.T) {
	ctx, logs := testLogger(t)
	bundle := t.TempDir()
	runDir := filepath.Join(t.TempDir(), "run", "vm1")
	if err := os.MkdirAll(runDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(runDir, "qmp.sock"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	rootfs := filepath.Join(bundle, "rootfs")
	imageFile := filepath.Join(rootfs, "disk", "vm.qcow2")
	if err := os.MkdirAll(filepath.Dir(imageFile), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(imageFile, []byte("QFI\xfb"), 0o644); err != nil {
		t.Fatal(err)
	}
	dir, err := image.MakeFilesDir(rootfs)
	if err != nil {
		t.Fatal(err)
	}
	var made []string
	for _, name := range []string{image.OverlayName, image.SeedName} {
		f, err := dir.Create(name)
		if err != nil {
			t.Fatal(err)
		}
		made = append(made, f.Name())
		f.Close()
	}
	dir.Close()
	r := &Record{ID: "vm1", Bundle: bundle, RuntimeDir: runDir, VMFiles: rootfs, Rootfs: rootfs}
	if err := r.save(); err != nil {
		t.Fatal(err)
	}

	r.Release(ctx)
	for _, p := range append(made, runDir, dir.Path(), filepath.Join(bundle, recordFile)) {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s still there after release (%v)", p, err)
		}
	}
	if _, err := os.Stat(imageFile); err != nil {
		t.Errorf("release removed the image's files: %v", err)
	}
	if w := logs.Warnings(); len(w) != 0 {
		t.Errorf("release warned: %q", w)
	}

	// Everything is gone now: a second release must not complain.
	r.Release(ctx)
	if w := logs.Warnings(); len(w) != 0 {
		t.Errorf("release of missing resources warned: %q", w)
	}
}

// TestReleaseKeepsImageFilesDir checks a record that names no VM files
// directory, as when the image had its own /.vmshim, leaves that alone.
func TestReleaseKeepsImageFilesDir(t *testing.T) {
	ctx, _ := testLogger(t)
	bundle := t.TempDir()
	dir := filepath.Join(bundle, "rootfs", image.FilesDirName)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(dir, image.OverlayName)
	if err := os.WriteFile(other, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	r := &Record{ID: "vm1", Bundle: bundle, Rootfs: filepath.Join(bundle, "rootfs")}
	r.Release(ctx)
	if _, err := os.Stat(other); err != nil {
		t.Fatalf("release removed a file it does not own: %v", err)
	}
}

// TestReleaseJailID checks release gives back the VM's jail id, and only
// while the record's owner holds it. idsDir is the node's, a constant:
// the test claims a real id there, in a range no VM uses, and needs root.
func TestReleaseJailID(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("claiming an id in " + idsDir + " needs root")
	}
	ctx, logs := testLogger(t)
	removeIfMade(t, runtimeRoot)
	removeIfMade(t, idsDir)
	ids := jail.IDRange{First: 2100000, Last: 2100099}
	owner := fmt.Sprintf("vmshim-test/%s-%d", t.Name(), os.Getpid())
	id, err := jail.Claim(idsDir, ids, owner)
	if err != nil {
		t.Fatal(err)
	}
	claim := filepath.Join(idsDir, strconv.FormatUint(uint64(id), 10))
	t.Cleanup(func() { _ = jail.Release(idsDir, id, owner) })
	other, err := jail.Claim(idsDir, ids, owner+"-other")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = jail.Release(idsDir, other, owner+"-other") })

	// A record whose owner does not hold the id leaves the claim.
	(&Record{ID: "vm1", Bundle: t.TempDir(), JailID: other, JailOwner: owner}).Release(ctx)
	if _, err := os.Stat(filepath.Join(idsDir, strconv.FormatUint(uint64(other), 10))); err != nil {
		t.Fatalf("release gave back another owner's id: %v", err)
	}

	r := &Record{ID: "vm1", Bundle: t.TempDir(), JailID: id, JailOwner: owner}
	r.Release(ctx)
	if _, err := os.Lstat(claim); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("claim %s still there after release (%v)", claim, err)
	}
	// A claim released already is released.
	r.Release(ctx)
	if w := logs.Warnings(); len(w) != 0 {
		t.Errorf("release warned: %q", w)
	}
}

// removeIfMade removes dir, once empty, at the end of the test if it does
// not exist now.
func removeIfMade(t *testing.T, dir string) {
	t.Helper()
	if _, err := os.Lstat(dir); err == nil {
		return
	}
	t.Cleanup(func() { _ = os.Remove(dir) })
}

func TestReleaseUnmountsRootfs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs to unmount needs root")
	}
	ctx, logs := testLogger(t)
	bundle := t.TempDir()
	rootfs := filepath.Join(bundle, "rootfs")
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", rootfs, "tmpfs", 0, "size=1m"); err != nil {
		t.Skipf("cannot mount tmpfs here: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(rootfs, unix.MNT_DETACH) })
	if err := os.WriteFile(filepath.Join(rootfs, "file"), nil, 0o600); err != nil {
		t.Fatal(err)
	}

	r := &Record{ID: "vm1", Bundle: bundle, Rootfs: rootfs}
	r.Release(ctx)
	if mounted, err := mountinfo.Mounted(rootfs); err != nil || mounted {
		t.Fatalf("rootfs still mounted after release (%v)", err)
	}
	if w := logs.Warnings(); len(w) != 0 {
		t.Errorf("release warned: %q", w)
	}
}

// startSleep starts a child that lives until the test kills it.
func startSleep(t *testing.T) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd
}

// reaped waits for cmd and returns how it ended.
func reaped(t *testing.T, cmd *exec.Cmd) error {
	t.Helper()
	ch := make(chan error, 1)
	go func() { ch <- cmd.Wait() }()
	select {
	case err := <-ch:
		return err
	case <-time.After(waitTimeout):
		t.Fatal("timed out waiting for the child's exit")
	}
	return nil
}

func TestKillProcess(t *testing.T) {
	ctx, _ := testLogger(t)
	cmd := startSleep(t)
	pid := cmd.Process.Pid
	start, err := processStart(pid)
	if err != nil {
		t.Fatal(err)
	}
	if err := killProcess(ctx, pid, start); err != nil {
		t.Fatal(err)
	}
	// killProcess returned once the child was a zombie: it is dead, only
	// waiting for us to reap it.
	if st, err := processState(pid); err == nil && st != 'Z' && st != 'X' {
		t.Fatalf("process %d in state %c after killProcess", pid, st)
	}
	err = reaped(t, cmd)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("child ended with %v, want SIGKILL", err)
	}
}

func TestKillProcessPidReuseGuard(t *testing.T) {
	ctx, _ := testLogger(t)
	cmd := startSleep(t)
	pid := cmd.Process.Pid
	start, err := processStart(pid)
	if err != nil {
		t.Fatal(err)
	}
	// The recorded start time is another process's: leave this one alone.
	if err := killProcess(ctx, pid, start+1); err != nil {
		t.Fatal(err)
	}
	if st, err := processState(pid); err != nil || st == 'Z' || st == 'X' {
		t.Fatalf("process %d was killed despite a different start time (state %c, %v)", pid, st, err)
	}
	if err := unix.Kill(pid, 0); err != nil {
		t.Fatalf("process %d gone: %v", pid, err)
	}
}

func TestKillProcessGone(t *testing.T) {
	ctx, _ := testLogger(t)
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	// A reaped child's pid, and one above any pid_max.
	for _, pid := range []int{cmd.Process.Pid, 1 << 30} {
		if err := killProcess(ctx, pid, 0); err != nil {
			t.Errorf("killProcess(%d) of a missing process: %v", pid, err)
		}
		if err := killProcess(ctx, pid, 12345); err != nil {
			t.Errorf("killProcess(%d) of a missing process: %v", pid, err)
		}
	}
}

func TestReleaseKillsQEMU(t *testing.T) {
	ctx, logs := testLogger(t)
	cmd := startSleep(t)
	start, err := processStart(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	r := &Record{ID: "vm1", Bundle: t.TempDir(), Pid: cmd.Process.Pid, PidStart: start}
	done := make(chan struct{})
	go func() {
		r.Release(ctx)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(waitTimeout):
		t.Fatal("release did not return")
	}
	if err := reaped(t, cmd); err == nil {
		t.Fatal("child exited cleanly; want killed")
	}
	if w := logs.Warnings(); len(w) != 0 {
		t.Errorf("release warned: %q", w)
	}
}

func TestProcessStartOfSelf(t *testing.T) {
	a, err := processStart(os.Getpid())
	if err != nil || a == 0 {
		t.Fatalf("processStart(self) = %d, %v", a, err)
	}
	b, _ := processStart(os.Getpid())
	if a != b {
		t.Fatalf("start time changed: %d then %d", a, b)
	}
	if st, err := processState(os.Getpid()); err != nil || (st != 'R' && st != 'S') {
		t.Fatalf("processState(self) = %c, %v", st, err)
	}
}

func TestProcessStartOddCommandName(t *testing.T) {
	// /proc/PID/stat puts the command name in parentheses; a name holding
	// ") " must not shift the fields.
	bin := filepath.Join(t.TempDir(), "q) Z (x")
	data, err := os.ReadFile("/bin/sleep")
	if err != nil {
		t.Skipf("no sleep binary to copy: %v", err)
	}
	if err := os.WriteFile(bin, data, 0o700); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "60")
	if err := cmd.Start(); err != nil {
		t.Skipf("cannot run a copied binary from the temporary directory: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	pid := cmd.Process.Pid
	start, err := processStart(pid)
	if err != nil {
		t.Fatal(err)
	}
	// A plain child started just after must have (nearly) the same start.
	plain, err := processStart(startSleep(t).Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if plain < start || plain-start > 500 {
		t.Fatalf("start %d of the odd child vs %d of a plain one: fields misparsed", start, plain)
	}
	if st, err := processState(pid); err != nil || (st != 'R' && st != 'S') {
		t.Fatalf("processState = %c, %v", st, err)
	}
	if err := killProcess(context.Background(), pid, start); err != nil {
		t.Fatal(err)
	}
	if err := reaped(t, cmd); err == nil {
		t.Fatal("child exited cleanly; want killed")
	}
}

// allMade is every kind of thing a task makes, in the order Create makes
// them.
var allMade = []string{
	madeJailID, madeRuntimeDir, madePod, madeRootfs, madeVMFiles, madeNetns,
	madePoststop, madeCNI, madeNetwork, madeCgroup, madeProcess,
}

// failingUndoers are undoers for every kind that note the kind in *ran
// and fail while fail names it.
func failingUndoers(fail map[string]bool) (map[string]undoer, *[]string) {
	var ran []string
	m := make(map[string]undoer, len(undoers))
	for kind := range undoers {
		m[kind] = func(context.Context, *Record) error {
			ran = append(ran, kind)
			if fail[kind] {
				return errors.New("failpoint")
			}
			return nil
		}
	}
	return m, &ran
}

// readWith reads the record in bundle, to be undone by undo.
func readWith(t *testing.T, bundle string, undo map[string]undoer) (*Record, error) {
	t.Helper()
	r, err := ReadRecord(bundle)
	if r != nil {
		r.undo = undo
	}
	return r, err
}

// pushAll pushes every kind on a new record in bundle, to be undone by
// undo.
func pushAll(t *testing.T, bundle string, undo map[string]undoer) *Record {
	t.Helper()
	r := &Record{ID: "vm1", Bundle: bundle, undo: undo}
	for _, kind := range allMade {
		if err := r.push(kind, nil); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

// TestReleaseUndoesNewestFirst checks that the undo stack survives in the
// bundle (as the delete action finds it after a crash) and is undone
// newest first, each thing once, and the record removed at the end.
func TestReleaseUndoesNewestFirst(t *testing.T) {
	undo, ran := failingUndoers(nil)
	bundle := t.TempDir()
	pushAll(t, bundle, undo)
	r, err := readWith(t, bundle, undo)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	want := slices.Clone(allMade)
	slices.Reverse(want)
	if !slices.Equal(*ran, want) {
		t.Errorf("undone %v, want %v", *ran, want)
	}
	if _, err := os.Stat(filepath.Join(bundle, recordFile)); !os.IsNotExist(err) {
		t.Errorf("record still there after release (%v)", err)
	}
}

// TestReleaseFailpoints fails each undo in turn: release reports it, the
// record keeps only it, the other undos run once, and a second release
// (the delete action's retry) finishes the job.
func TestReleaseFailpoints(t *testing.T) {
	for _, kind := range allMade {
		t.Run(kind, func(t *testing.T) {
			fail := map[string]bool{kind: true}
			undo, ran := failingUndoers(fail)
			bundle := t.TempDir()
			err := pushAll(t, bundle, undo).Release(context.Background())
			if err == nil || !strings.Contains(err.Error(), kind+": failpoint") {
				t.Fatalf("release = %v, want the failure of %s", err, kind)
			}
			if len(*ran) != len(allMade) {
				t.Errorf("undone %v, want every undo tried once", *ran)
			}
			r, err := readWith(t, bundle, undo)
			if err != nil {
				t.Fatalf("record gone after a failed undo: %v", err)
			}
			if !slices.Equal(r.Made, []string{kind}) {
				t.Fatalf("record keeps %v, want only %s", r.Made, kind)
			}
			delete(fail, kind)
			*ran = nil
			if err := r.Release(context.Background()); err != nil {
				t.Fatalf("second release: %v", err)
			}
			if !slices.Equal(*ran, []string{kind}) {
				t.Errorf("second release undid %v, want only %s", *ran, kind)
			}
			if _, err := os.Stat(filepath.Join(bundle, recordFile)); !os.IsNotExist(err) {
				t.Errorf("record still there after the second release (%v)", err)
			}
		})
	}
}

// TestPushUnsaved checks that a push whose record cannot be written fails
// and leaves the stack as it was, and that an unknown kind is refused.
func TestPushUnsaved(t *testing.T) {
	r := &Record{ID: "vm1", Bundle: filepath.Join(t.TempDir(), "gone")}
	if err := r.push(madeRootfs, nil); err == nil || len(r.Made) != 0 {
		t.Fatalf("push to a missing bundle: %v, stack %v", err, r.Made)
	}
	r.Bundle = t.TempDir()
	if err := r.push("spaceship", nil); err == nil || len(r.Made) != 0 {
		t.Fatalf("push of an unknown kind: %v, stack %v", err, r.Made)
	}
}
