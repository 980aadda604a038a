package oom

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// memoryEvents is memory.events content as cgroup v2 writes it.
func memoryEvents(max, kills int) string {
	return fmt.Sprintf("low 0\nhigh 0\nmax %d\noom %d\noom_kill %d\noom_group_kill 0\n", max, kills, kills)
}

// fakeV2 makes a directory that looks like a v2 memory cgroup, with the
// given memory.events content, and returns it.
func fakeV2(t *testing.T, content string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "pod.scope")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, eventsFile), content)
	return dir
}

// writeFile rewrites path in place, as the kernel changes a cgroup file.
func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestV2KillRaisesEvent(t *testing.T) {
	leakCheck(t)
	dir := fakeV2(t, memoryEvents(0, 0))
	w, _ := startWatch(t, dir)
	wantKilled(t, w, 0)
	writeFile(t, filepath.Join(dir, eventsFile), memoryEvents(1, 1))
	waitEvent(t, w)
	wantKilled(t, w, 1)
	writeFile(t, filepath.Join(dir, eventsFile), memoryEvents(2, 3))
	waitEvent(t, w)
	wantKilled(t, w, 3)
}

func TestV2UnchangedCounterNoEvent(t *testing.T) {
	leakCheck(t)
	dir := fakeV2(t, memoryEvents(0, 2))
	w, r := startWatch(t, dir)
	writeFile(t, filepath.Join(dir, eventsFile), memoryEvents(7, 2))
	r.waitFor(t, "max 7")
	noEvent(t, w)
	wantKilled(t, w, 2)
	// A lower count, as from a torn read, is no kill either.
	writeFile(t, filepath.Join(dir, eventsFile), memoryEvents(8, 1))
	r.waitFor(t, "max 8")
	noEvent(t, w)
	writeFile(t, filepath.Join(dir, eventsFile), memoryEvents(9, 3))
	waitEvent(t, w)
	wantKilled(t, w, 3)
}

func TestV2StartsFromCurrentCount(t *testing.T) {
	leakCheck(t)
	dir := fakeV2(t, memoryEvents(4, 4))
	w, r := startWatch(t, dir)
	wantKilled(t, w, 4)
	writeFile(t, filepath.Join(dir, eventsFile), memoryEvents(5, 4))
	r.waitFor(t, "max 5")
	noEvent(t, w)
}

func TestV2SlowReaderCoalesces(t *testing.T) {
	leakCheck(t)
	dir := fakeV2(t, memoryEvents(0, 0))
	w, r := startWatch(t, dir)
	for i := 1; i <= 5; i++ {
		writeFile(t, filepath.Join(dir, eventsFile), memoryEvents(100+i, i))
		r.waitFor(t, fmt.Sprintf("max %d", 100+i))
	}
	waitEvent(t, w)
	noEvent(t, w)
	wantKilled(t, w, 5)
}

func TestV2FileRemovedEnds(t *testing.T) {
	leakCheck(t)
	dir := fakeV2(t, memoryEvents(0, 0))
	w, _ := startWatch(t, dir)
	if err := os.Remove(filepath.Join(dir, eventsFile)); err != nil {
		t.Fatal(err)
	}
	waitEnd(t, w)
	if err := w.Err(); err != nil {
		t.Fatalf("err after removal: %v", err)
	}
}

func TestV2DirRemovedEnds(t *testing.T) {
	leakCheck(t)
	dir := fakeV2(t, memoryEvents(0, 1))
	// Keep memory.events alive elsewhere, so only the directory's removal
	// shows, as on cgroupfs, which raises nothing on the cgroup's files.
	if err := os.Link(filepath.Join(dir, eventsFile), filepath.Join(filepath.Dir(dir), "kept")); err != nil {
		t.Fatal(err)
	}
	w, _ := startWatch(t, dir)
	sibling := filepath.Join(filepath.Dir(dir), "sibling.scope")
	if err := os.Mkdir(sibling, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(sibling); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, eventsFile), memoryEvents(0, 2))
	waitEvent(t, w)
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	waitEnd(t, w)
	if err := w.Err(); err != nil {
		t.Fatalf("err after removal: %v", err)
	}
	got, err := w.Killed()
	if err == nil || got != 2 {
		t.Fatalf("killed after the end = %d, %v; want 2 and an error", got, err)
	}
}

func TestV2BadContent(t *testing.T) {
	leakCheck(t)
	dir := fakeV2(t, memoryEvents(0, 1))
	w, r := startWatch(t, dir)
	path := filepath.Join(dir, eventsFile)
	for i, bad := range []string{
		"oom_kill x\n",
		"oom_kill 9\noom_kill 9\n",
		"oom_kill 99999999999999999999999\n",
		"oom_kill 9 9\n",
		"oom_kill\x00 9\n",
		"max 0\n",
		strings.Repeat("x", maxFileSize) + "\noom_kill 9\n",
	} {
		marker := fmt.Sprintf("marker%d 0\n", i)
		writeFile(t, path, marker+bad)
		r.waitFor(t, marker)
		got, err := w.Killed()
		if err == nil || got != 1 {
			t.Fatalf("killed with %q = %d, %v; want 1 and an error", excerpt([]byte(bad)), got, err)
		}
		if strings.Contains(err.Error(), "\n") {
			t.Fatalf("error spans lines: %q", err)
		}
	}
	noEvent(t, w)
	writeFile(t, path, memoryEvents(0, 2))
	waitEvent(t, w)
	wantKilled(t, w, 2)
}

func TestWatchErrors(t *testing.T) {
	leakCheck(t)
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name  string
		files map[string]string
		ctx   context.Context
	}{
		{name: "no directory"},
		{name: "not a memory cgroup", files: map[string]string{"cgroup.procs": ""}},
		{name: "v2 without oom_kill", files: map[string]string{eventsFile: "low 0\nmax 0\n"}},
		{name: "v2 bad oom_kill", files: map[string]string{eventsFile: "oom_kill -1\n"}},
		{name: "v1 bad oom_kill", files: map[string]string{oomControlFile: "oom_kill 1x\n", eventControlFile: ""}},
		{name: "v1 without event_control", files: map[string]string{oomControlFile: "oom_kill 0\n"}},
		{name: "context done", files: map[string]string{eventsFile: memoryEvents(0, 0)}, ctx: canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "cg")
			if tc.files != nil {
				if err := os.Mkdir(dir, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			for name, content := range tc.files {
				writeFile(t, filepath.Join(dir, name), content)
			}
			ctx := tc.ctx
			if ctx == nil {
				ctx = context.Background()
			}
			w, err := Watch(ctx, dir)
			if err == nil {
				w.Close()
				t.Fatal("watch succeeded")
			}
			if !strings.Contains(err.Error(), dir) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("error %q: want one line naming %s", err, dir)
			}
		})
	}
}

func TestContextEndsWatch(t *testing.T) {
	leakCheck(t)
	dir := fakeV2(t, memoryEvents(0, 0))
	ctx, cancel := context.WithCancel(context.Background())
	w, err := Watch(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	waitEnd(t, w)
	if err := w.Err(); err != nil {
		t.Fatalf("err after cancel: %v", err)
	}
	if err := w.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
}

func TestCloseConcurrent(t *testing.T) {
	leakCheck(t)
	dir := fakeV2(t, memoryEvents(0, 0))
	w, err := Watch(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, eventsFile)
	var wg sync.WaitGroup
	wg.Go(func() {
		for range w.Events() {
		}
	})
	for i := range 4 {
		wg.Go(func() {
			if err := os.WriteFile(path, []byte(memoryEvents(i, i)), 0o644); err != nil {
				t.Error(err)
			}
			w.Killed()
			if err := w.Close(); err != nil {
				t.Errorf("close: %v", err)
			}
			w.Killed()
		})
	}
	wg.Wait()
	if err := w.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if _, err := w.Killed(); err == nil {
		t.Fatal("killed after close: no error")
	}
}
