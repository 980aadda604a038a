package bootslot

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/vmshim/vmshim/regfile/regfiletest"
)

// holderEnv, set to "dir n", makes the test binary a holder: it takes all
// n slots in dir, prints "held" and sleeps until killed.
const holderEnv = "BOOTSLOT_TEST_HOLDER"

// TestMain runs the tests, or the holder TestKilledHolder starts.
func TestMain(m *testing.M) {
	if args := strings.Fields(os.Getenv(holderEnv)); len(args) == 2 {
		os.Exit(hold(args[0], args[1]))
	}
	// Start the runtime's poller now, so its fds are not taken for leaks.
	r, w, err := os.Pipe()
	if err == nil {
		r.Close()
		w.Close()
	}
	os.Exit(m.Run())
}

// hold takes all n slots in dir, says so and sleeps.
func hold(dir, n string) int {
	k, err := strconv.Atoi(n)
	if err != nil {
		fmt.Println(err)
		return 1
	}
	s, err := New(dir, k)
	if err != nil {
		fmt.Println(err)
		return 1
	}
	for range k {
		if _, ok, err := s.TryAcquire(); !ok || err != nil {
			fmt.Println("not taken:", err)
			return 1
		}
	}
	fmt.Println("held")
	time.Sleep(time.Hour)
	return 0
}

// newSlots opens n slots in a new directory, closed when t ends.
func newSlots(t testing.TB, n int) *Slots {
	t.Helper()
	return openSlots(t, filepath.Join(t.TempDir(), "boot-slots"), n)
}

// openSlots opens n slots in dir, closed when t ends.
func openSlots(t testing.TB, dir string, n int) *Slots {
	t.Helper()
	s, err := New(dir, n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// take takes a free slot of s, or fails t.
func take(t testing.TB, s *Slots) *Slot {
	t.Helper()
	slot, ok, err := s.TryAcquire()
	if err != nil || !ok {
		t.Fatalf("TryAcquire: %v, %v; want a slot", ok, err)
	}
	return slot
}

// full fails t unless all of s's slots are held.
func full(t testing.TB, s *Slots) {
	t.Helper()
	slot, ok, err := s.TryAcquire()
	if ok {
		slot.Release()
	}
	if err != nil || ok {
		t.Fatalf("TryAcquire on a full node: %v, %v", ok, err)
	}
}

// openFDs counts the process's open file descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(entries)
}

func TestTryAcquire(t *testing.T) {
	for _, n := range []int{1, 3, 16} {
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			s := newSlots(t, n)
			fds := openFDs(t)
			held := map[int]*Slot{}
			for range n {
				slot := take(t, s)
				if i := slot.Index(); i < 0 || i >= n || held[i] != nil {
					t.Fatalf("slot %d taken, held %v", i, held)
				}
				held[slot.Index()] = slot
			}
			for range 3 {
				full(t, s)
			}
			if got := openFDs(t); got != fds+n {
				t.Fatalf("%d fds open holding %d slots, want %d", got, n, fds+n)
			}
			last := held[n-1]
			last.Release()
			last.Release()
			again := take(t, s)
			if again.Index() != n-1 {
				t.Fatalf("took slot %d, want the released %d", again.Index(), n-1)
			}
			full(t, s)
			last.Release() // again, after the slot was taken anew
			full(t, s)
			held[n-1] = again
			for _, slot := range held {
				slot.Release()
			}
			if got := openFDs(t); got != fds {
				t.Fatalf("%d fds open after release, want %d", got, fds)
			}
		})
	}
}

// TestReleaseConcurrent releases one slot from several goroutines.
func TestReleaseConcurrent(t *testing.T) {
	s := newSlots(t, 1)
	slot := take(t, s)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(slot.Release)
	}
	wg.Wait()
	take(t, s).Release()
}

// TestKilledHolder shows the kernel gives back the slots of a process
// killed while holding them.
func TestKilledHolder(t *testing.T) {
	const n = 3
	dir := filepath.Join(t.TempDir(), "boot-slots")
	s := openSlots(t, dir, n)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), holderEnv+"="+dir+" "+strconv.Itoa(n))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if line != "held\n" {
		t.Fatalf("holder says %q, %v", line, err)
	}
	full(t, s)
	if err := cmd.Process.Signal(unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	for range n {
		take(t, s)
	}
	full(t, s)
}

func TestAcquireWaits(t *testing.T) {
	s := newSlots(t, 2)
	a, b := take(t, s), take(t, s)
	defer a.Release()
	got := make(chan *Slot)
	go func() {
		slot, err := s.Acquire(context.Background())
		if err != nil {
			t.Error(err)
		}
		got <- slot
	}()
	select {
	case slot := <-got:
		t.Fatalf("took slot %v while both were held", slot)
	case <-time.After(3 * pollInterval / 2):
	}
	b.Release()
	select {
	case slot := <-got:
		if slot == nil {
			return
		}
		defer slot.Release()
		if slot.Index() != b.Index() {
			t.Fatalf("took slot %d, want the released %d", slot.Index(), b.Index())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Acquire still waits after a release")
	}
}

func TestAcquireContextEnds(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
		full bool
		want error
	}{
		{"cancelled", func() (context.Context, context.CancelFunc) { return cancelled, func() {} }, true, context.Canceled},
		{"cancelled with a free slot", func() (context.Context, context.CancelFunc) { return cancelled, func() {} }, false, context.Canceled},
		{"cancelled while waiting", func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(250*time.Millisecond, cancel)
			return ctx, cancel
		}, true, context.Canceled},
		{"deadline", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 250*time.Millisecond)
		}, true, context.DeadlineExceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSlots(t, 1)
			if tc.full {
				defer take(t, s).Release()
			}
			ctx, cancel := tc.ctx()
			defer cancel()
			slot, err := s.Acquire(ctx)
			if slot != nil {
				slot.Release()
				t.Fatalf("took slot %d", slot.Index())
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("error %v, want %v", err, tc.want)
			}
			if !strings.Contains(err.Error(), "boot slot") || strings.Contains(err.Error(), "\n") {
				t.Fatalf("error %q does not say in one line what it waited for", err)
			}
			if ctx.Err() == nil {
				t.Fatal("returned before its context ended")
			}
		})
	}
}

// TestConcurrent has goroutines, half of them with Slots of their own as
// separate shims would, take, hold and release slots: never more than n
// are held at once.
func TestConcurrent(t *testing.T) {
	const n, workers, rounds = 3, 20, 3
	dir := filepath.Join(t.TempDir(), "boot-slots")
	shared := openSlots(t, dir, n)
	var held, most atomic.Int32
	var wg sync.WaitGroup
	for w := range workers {
		s := shared
		if w%2 == 1 {
			s = openSlots(t, dir, n)
		}
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			for range rounds {
				slot, err := s.Acquire(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				h := held.Add(1)
				for m := most.Load(); h > m && !most.CompareAndSwap(m, h); m = most.Load() {
				}
				time.Sleep(5 * time.Millisecond)
				held.Add(-1)
				slot.Release()
			}
		})
	}
	wg.Wait()
	if m := most.Load(); m > n || m < 1 {
		t.Fatalf("%d slots held at once, want 1 to %d", m, n)
	}
	t.Logf("at most %d held at once", most.Load())
}

// TestShrunk shows only slots 0 to n-1 count: files of a configuration
// with more slots, held or not, are ignored.
func TestShrunk(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "boot-slots")
	big := openSlots(t, dir, 5)
	var high []*Slot
	for i := 2; i < 5; i++ {
		slot, err := big.try(i)
		if err != nil || slot == nil {
			t.Fatalf("slot %d: %v, %v", i, slot, err)
		}
		high = append(high, slot)
	}
	defer func() {
		for _, slot := range high {
			slot.Release()
		}
	}()
	if err := os.WriteFile(filepath.Join(dir, "junk"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	small := openSlots(t, dir, 2)
	for range 2 {
		if i := take(t, small).Index(); i > 1 {
			t.Fatalf("took slot %d of 2", i)
		}
	}
	full(t, small)
}

// plants are what a slot's name or the directory's might hold instead.
var plants = []struct {
	kind  string
	plant func(t *testing.T, path string)
}{
	{"symlink", func(t *testing.T, path string) {
		target := filepath.Join(t.TempDir(), "target")
		if err := os.WriteFile(target, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		mustDo(t, os.Symlink(target, path))
	}},
	{"dangling symlink", func(t *testing.T, path string) {
		mustDo(t, os.Symlink(filepath.Join(t.TempDir(), "nothing"), path))
	}},
	{"fifo", func(t *testing.T, path string) { mustDo(t, unix.Mkfifo(path, 0o600)) }},
	{"directory", func(t *testing.T, path string) { mustDo(t, os.Mkdir(path, 0o700)) }},
	{"regular file", func(t *testing.T, path string) { mustDo(t, os.WriteFile(path, nil, 0o600)) }},
	{"character device", func(t *testing.T, path string) {
		if os.Geteuid() != 0 {
			t.Skip("making a device node needs root")
		}
		mustDo(t, unix.Mknod(path, unix.S_IFCHR|0o600, int(unix.Mkdev(1, 3))))
	}},
}

// mustDo fails t on err.
func mustDo(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestPlantedSlot shows a slot name holding anything but a regular file is
// refused, in one line naming it, and is never opened or followed.
func TestPlantedSlot(t *testing.T) {
	for _, p := range plants {
		if p.kind == "regular file" {
			continue
		}
		t.Run(p.kind, func(t *testing.T) {
			s := newSlots(t, 1)
			path := filepath.Join(s.path, "0")
			p.plant(t, path)
			target, _ := os.Readlink(path)
			opens := regfiletest.WatchOpens(t, s.path)
			slot, ok, err := s.TryAcquire()
			if ok || err == nil {
				slot.Release()
				t.Fatalf("TryAcquire: %v, %v; want an error", ok, err)
			}
			if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), path) ||
				!strings.Contains(err.Error(), "not a regular file") || strings.Contains(err.Error(), "\n") {
				t.Fatalf("error %q is not one line saying %s is not a regular file", err, path)
			}
			t.Log(err)
			if got := opens(); len(got) != 0 {
				t.Fatalf("opened %v", got)
			}
			if target != "" {
				if _, err := os.Lstat(target); p.kind == "dangling symlink" && !errors.Is(err, os.ErrNotExist) {
					t.Fatalf("the symlink's target was made: %v", err)
				}
			}
			if _, err := s.Acquire(context.Background()); !errors.Is(err, errdefs.ErrFailedPrecondition) {
				t.Fatalf("Acquire: %v, want the error at once", err)
			}
		})
	}
}

// TestNewRefuses shows New refuses bad numbers of slots and a directory
// path holding anything but a directory of this user that nobody else
// can write, in one line naming it.
func TestNewRefuses(t *testing.T) {
	type tc struct {
		name  string
		path  func(t *testing.T) string
		n     int
		class error
		want  string
	}
	good := func(t *testing.T) string { return filepath.Join(t.TempDir(), "boot-slots") }
	tcs := []tc{
		{"no slots", good, 0, errdefs.ErrInvalidArgument, "0 slots"},
		{"negative", good, -1, errdefs.ErrInvalidArgument, "-1 slots"},
		{"too many", good, MaxSlots + 1, errdefs.ErrInvalidArgument, "1025 slots"},
		{"relative", func(*testing.T) string { return "boot-slots" }, 4, errdefs.ErrInvalidArgument, "not an absolute path"},
		{"world-writable", func(t *testing.T) string { return modeDir(t, 0o777) }, 4, errdefs.ErrFailedPrecondition, "group or others can write"},
		{"group-writable", func(t *testing.T) string { return modeDir(t, 0o770) }, 4, errdefs.ErrFailedPrecondition, "group or others can write"},
		{"sticky world-writable", func(t *testing.T) string { return modeDir(t, 0o1777) }, 4, errdefs.ErrFailedPrecondition, "group or others can write"},
		{"symlink in the path", func(t *testing.T) string {
			real := t.TempDir()
			link := filepath.Join(t.TempDir(), "link")
			mustDo(t, os.Symlink(real, link))
			return filepath.Join(link, "boot-slots")
		}, 4, errdefs.ErrFailedPrecondition, "is not a directory (symlink)"},
		{"someone else's", func(t *testing.T) string {
			if os.Geteuid() != 0 {
				t.Skip("giving a directory away needs root")
			}
			dir := modeDir(t, 0o700)
			mustDo(t, os.Chown(dir, 65534, 65534))
			return dir
		}, 4, errdefs.ErrFailedPrecondition, "owned by uid 65534"},
	}
	for _, p := range plants {
		if p.kind == "directory" {
			continue
		}
		tcs = append(tcs, tc{p.kind, func(t *testing.T) string {
			path := filepath.Join(t.TempDir(), "boot-slots")
			p.plant(t, path)
			return path
		}, 4, errdefs.ErrFailedPrecondition, "is not a directory (" + strings.TrimPrefix(p.kind, "dangling ") + ")"})
	}
	for _, tc := range tcs {
		t.Run(tc.name, func(t *testing.T) {
			path := tc.path(t)
			s, err := New(path, tc.n)
			if err == nil {
				s.Close()
				t.Fatal("accepted")
			}
			if !errors.Is(err, tc.class) || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("error %q, want one line saying %q, classed %v", err, tc.want, tc.class)
			}
			t.Log(err)
			// A symlink on the way is named, rather than path.
			if tc.n >= 1 && tc.n <= MaxSlots && !strings.Contains(err.Error(), filepath.Dir(path)) && !strings.Contains(err.Error(), path) {
				t.Fatalf("error %q does not name %s", err, path)
			}
		})
	}
}

// modeDir makes a directory and sets its mode.
func modeDir(t *testing.T, mode uint32) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "boot-slots")
	mustDo(t, os.Mkdir(dir, 0o700))
	mustDo(t, unix.Chmod(dir, mode))
	return dir
}

// TestNewMakesDir shows New makes the directory and missing parents, mode
// 0700, and takes a good one as it is.
func TestNewMakesDir(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "run", "vmshim", "boot-slots")
	s := openSlots(t, dir+"/", 2)
	if s.path != dir {
		t.Fatalf("path %q, want %q", s.path, dir)
	}
	for _, p := range []string{filepath.Join(base, "run"), filepath.Join(base, "run", "vmshim"), dir} {
		fi, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		if !fi.IsDir() || fi.Mode().Perm()&^0o700 != 0 {
			t.Fatalf("%s: mode %v, want a directory 0700 or less", p, fi.Mode())
		}
	}
	take(t, s)
	fi, err := os.Lstat(filepath.Join(dir, "0"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	if fi == nil {
		fi, err = os.Lstat(filepath.Join(dir, "1"))
		mustDo(t, err)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&^0o600 != 0 {
		t.Fatalf("slot file mode %v, want a regular file 0600 or less", fi.Mode())
	}
	openSlots(t, dir, 2)
	openSlots(t, modeDir(t, 0o755), 2)
}

// BenchmarkTryAcquire takes and releases a slot on an idle node: what a
// pod's start pays for pacing when nothing else boots.
func BenchmarkTryAcquire(b *testing.B) {
	s := newSlots(b, 4)
	for b.Loop() {
		take(b, s).Release()
	}
}

// BenchmarkTryAcquireBusy takes and releases a slot while 6 of 8 are
// held, trying the slots from 0 or from a random slot. From 0, the held
// slots are the low ones, as they are when every shim starts at 0.
func BenchmarkTryAcquireBusy(b *testing.B) {
	const n = 8
	for _, tc := range []struct {
		name  string
		first func(int) int
		held  []int
	}{
		{"from 0", func(int) int { return 0 }, []int{0, 1, 2, 3, 4, 5}},
		{"from random", nil, []int{0, 1, 3, 4, 6, 7}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			dir := filepath.Join(b.TempDir(), "boot-slots")
			other := openSlots(b, dir, n)
			for _, i := range tc.held {
				slot, err := other.try(i)
				if err != nil || slot == nil {
					b.Fatalf("slot %d: %v", i, err)
				}
				defer slot.Release()
			}
			s := openSlots(b, dir, n)
			if tc.first != nil {
				s.first = tc.first
			}
			for b.Loop() {
				take(b, s).Release()
			}
		})
	}
}
