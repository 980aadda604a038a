package diskcache

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// inode returns the inode number of f.
func inode(t *testing.T, f *os.File) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// TestConcurrentGet shows goroutines with their own Cache on one Dir make
// one download between them and all get the same file.
func TestConcurrentGet(t *testing.T) {
	body := pattern(1 << 20)
	f := &fake{body: body, delay: 10 * time.Millisecond}
	srv := newFake(t, f)
	dir := testCache(t).Dir
	const n = 8
	var wg sync.WaitGroup
	inodes := make([]uint64, n)
	var waited lines
	for i := range n {
		wg.Go(func() {
			c := &Cache{Dir: dir, MaxSize: 10 << 20}
			d, err := c.Get(context.Background(), mustURL(t, srv.URL+"/d"), sum(body), waited.add)
			if err != nil {
				t.Error(err)
				return
			}
			defer d.Close()
			inodes[i] = inode(t, d.File)
		})
	}
	wg.Wait()
	if got := f.full.Load(); got != 1 || f.requests.Load() != 1 {
		t.Fatalf("%d whole bodies in %d requests, want 1", got, f.requests.Load())
	}
	for i := range inodes {
		if inodes[i] != inodes[0] {
			t.Fatalf("inodes differ: %v", inodes)
		}
	}
	if !waited.has("waiting for another shim") {
		t.Errorf("nobody waited:\n%s", &waited)
	}
}

// TestConcurrentProcesses shows the same across processes: copies of the
// test binary Get the same disk at once, and the server sends it once.
func TestConcurrentProcesses(t *testing.T) {
	body := pattern(1 << 20)
	f := &fake{body: body, delay: 10 * time.Millisecond}
	srv := newFake(t, f)
	dir := testCache(t).Dir
	var cmds []*exec.Cmd
	var outs []*strings.Builder
	for range 3 {
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), "DISKCACHE_HELPER="+dir+" "+srv.URL+"/d "+sum(body))
		out := &strings.Builder{}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds, outs = append(cmds, cmd), append(outs, out)
	}
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("helper %d: %v\n%s", i, err, outs[i])
		}
		t.Logf("helper %d:\n%s", i, outs[i])
	}
	if got := f.full.Load(); got != 1 || f.requests.Load() != 1 {
		t.Fatalf("%d whole bodies in %d requests, want 1", got, f.requests.Load())
	}
}

// TestMain runs the child of TestConcurrentProcesses when
// DISKCACHE_HELPER is "dir url digest", and the tests otherwise.
func TestMain(m *testing.M) {
	if args := strings.Fields(os.Getenv("DISKCACHE_HELPER")); len(args) == 3 {
		os.Exit(helperGet(args[0], args[1], args[2]))
	}
	os.Exit(m.Run())
}

// helperGet Gets a disk into dir, printing the progress lines.
func helperGet(dir, rawURL, digest string) int {
	u, err := ParseURL(rawURL)
	if err == nil {
		var d *Disk
		c := &Cache{Dir: dir}
		if d, err = c.Get(context.Background(), u, digest, func(s string) { fmt.Println(s) }); err == nil {
			d.Close()
		}
	}
	if err != nil {
		fmt.Println(err)
		return 1
	}
	return 0
}

// TestLockReplaced shows a waiter whose lock file is unlinked by the holder
// (as Evict does) locks the new lock file instead, so two lockers never both
// think they hold the lock.
func TestLockReplaced(t *testing.T) {
	r, err := openRoot(testCache(t).Dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.close()
	h := sum(nil)
	first, err := lockDigest(context.Background(), r, h, nil)
	if err != nil {
		t.Fatal(err)
	}
	waiting := make(chan struct{})
	second := make(chan *digestLock)
	go func() {
		l, err := lockDigest(context.Background(), r, h, func() { close(waiting) })
		if err != nil {
			t.Error(err)
		}
		second <- l
	}()
	<-waiting
	if err := first.remove(); err != nil {
		t.Fatal(err)
	}
	l := <-second
	if l == nil {
		t.FailNow()
	}
	defer l.unlock()
	if ok, err := l.current(); !ok || err != nil {
		t.Fatalf("second lock is not on the current file: %v %v", ok, err)
	}
	if third, err := tryLockDigest(r, h); third != nil || err != nil {
		t.Fatalf("third locker got %v, %v while the second holds it", third, err)
	}
}
