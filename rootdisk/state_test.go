package rootdisk

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"
)

// testStateInfo is what a small VM's save records.
func testStateInfo() StateInfo {
	return StateInfo{QEMU: "7.2.0", Machine: "q35", Firmware: "bios", VCPUs: 1, MemoryMiB: 256,
		MACs: []string{"02:00:00:00:00:01"}, Saved: time.Date(2026, 11, 29, 3, 0, 0, 0, time.UTC)}
}

// saveTestState writes a state with stream as QEMU's part on the volume
// in dir, whose disk is disk.
func saveTestState(t *testing.T, dir string, disk *os.File, stream []byte) StateInfo {
	t.Helper()
	s, err := CreateState(dir, "/vol")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.File.Write(stream); err != nil {
		t.Fatal(err)
	}
	info := testStateInfo()
	size, err := s.Commit(info)
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(stateHeaderSize + len(stream)); size != want {
		t.Errorf("Commit's size %d, want %d", size, want)
	}
	info.Disk, _ = stampOf(disk)
	info.Stream = int64(len(stream))
	return info
}

func testDisk(t *testing.T, dir string) *os.File {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(dir, DiskName), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if _, err := f.WriteString("qcow2 stand-in"); err != nil {
		t.Fatal(err)
	}
	return f
}

// TestStateRoundTrip: a state saved is found with what it was saved
// from and its stream, goes with the disk it left, and once taken is
// found no more.
func TestStateRoundTrip(t *testing.T) {
	dir := t.TempDir()
	disk := testDisk(t, dir)
	stream := bytes.Repeat([]byte("QEVM"), 5000)
	want := saveTestState(t, dir, disk, stream)
	if _, err := os.Stat(filepath.Join(dir, stateTemp)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the temporary state is left: %v", err)
	}
	s, err := OpenState(dir, "/vol")
	if err != nil || s == nil {
		t.Fatalf("OpenState: %v, %v", s, err)
	}
	defer s.Close()
	if !reflect.DeepEqual(s.Info, want) {
		t.Errorf("info %+v, want %+v", s.Info, want)
	}
	got, err := io.ReadAll(s.File)
	if err != nil || !bytes.Equal(got, stream) {
		t.Fatalf("stream of %d bytes (%v), want %d", len(got), err, len(stream))
	}
	if err := s.CheckDisk(disk); err != nil {
		t.Errorf("CheckDisk of the disk it left: %v", err)
	}
	if err := s.Take(); err != nil {
		t.Fatal(err)
	}
	if again, err := OpenState(dir, "/vol"); err != nil || again != nil {
		t.Errorf("OpenState after Take: %v, %v; want none", again, err)
	}
}

// TestStateDiskChanged: a disk written after the save does not go with
// the state.
func TestStateDiskChanged(t *testing.T) {
	dir := t.TempDir()
	disk := testDisk(t, dir)
	saveTestState(t, dir, disk, []byte("stream"))
	time.Sleep(10 * time.Millisecond)
	if _, err := disk.WriteAt([]byte("booted since"), 0); err != nil {
		t.Fatal(err)
	}
	s, err := OpenState(dir, "/vol")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	err = s.CheckDisk(disk)
	if err == nil || !strings.Contains(err.Error(), "changed after the save") || strings.Contains(err.Error(), "\n") {
		t.Errorf("CheckDisk of a changed disk: %v", err)
	}
}

// TestStateAbortAndCrash: an aborted save leaves nothing; one a crash
// cut short (the temporary file) is never found, and is removed.
func TestStateAbortAndCrash(t *testing.T) {
	dir := t.TempDir()
	s, err := CreateState(dir, "/vol")
	if err != nil {
		t.Fatal(err)
	}
	s.Abort()
	if names := dirNames(t, dir); len(names) != 0 {
		t.Errorf("after Abort the volume holds %q", names)
	}
	s, err = CreateState(dir, "/vol")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.File.Write([]byte("half a stream")); err != nil {
		t.Fatal(err)
	}
	s.File.Close() // the shim dies here
	if got, err := OpenState(dir, "/vol"); err != nil || got != nil {
		t.Errorf("OpenState of a save cut short: %v, %v; want none", got, err)
	}
	if names := dirNames(t, dir); len(names) != 0 {
		t.Errorf("the cut-off save is left: %q", names)
	}
}

// TestStateHostile: what another pod on the volume can put there is
// refused in one line, and a special file is never opened.
func TestStateHostile(t *testing.T) {
	for _, tc := range []struct {
		name  string
		plant func(t *testing.T, path string)
		want  string
	}{
		{"garbage", func(t *testing.T, p string) { write(t, p, []byte("not a state")) }, "cut short"},
		{"wrong magic", func(t *testing.T, p string) { write(t, p, bytes.Repeat([]byte{'x'}, stateHeaderSize+10)) }, "not a vmshim state"},
		{"huge header length", func(t *testing.T, p string) {
			b := append([]byte(stateMagic), 0xff, 0xff, 0xff, 0xff)
			write(t, p, append(b, make([]byte, stateHeaderSize)...))
		}, "header of"},
		{"no stream", func(t *testing.T, p string) {
			h, err := stateHeader(testStateInfo())
			if err != nil {
				t.Fatal(err)
			}
			write(t, p, h)
		}, "a stream of 0 bytes"},
		{"no vcpus", func(t *testing.T, p string) {
			info := testStateInfo()
			info.VCPUs = 0
			info.Stream = 1
			h, err := stateHeader(info)
			if err != nil {
				t.Fatal(err)
			}
			write(t, p, h)
		}, "0 vCPUs"},
		{"symlink", func(t *testing.T, p string) {
			if err := os.Symlink("/etc/shadow", p); err != nil {
				t.Fatal(err)
			}
		}, StateName},
		{"fifo", func(t *testing.T, p string) {
			if err := syscall.Mkfifo(p, 0o600); err != nil {
				t.Fatal(err)
			}
		}, StateName},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			tc.plant(t, filepath.Join(dir, StateName))
			s, err := OpenState(dir, "/vol")
			if err == nil {
				s.Close()
				t.Fatal("a planted state opened")
			}
			if !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("error %q: want one line naming %q", err, tc.want)
			}
		})
	}
}

func write(t *testing.T, p string, b []byte) {
	t.Helper()
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	return out
}

// TestStateCutShort: a state whose file holds less, or more, than its
// header says is refused in one line, and RemoveState takes it away.
func TestStateCutShort(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(f *os.File, size int64) error
	}{
		{"truncated", func(f *os.File, size int64) error { return f.Truncate(size - 100) }},
		{"to the header", func(f *os.File, size int64) error { return f.Truncate(stateHeaderSize) }},
		{"grown", func(f *os.File, size int64) error { _, err := f.WriteAt([]byte("more"), size); return err }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			disk := testDisk(t, dir)
			saveTestState(t, dir, disk, bytes.Repeat([]byte("QEVM"), 1000))
			path := filepath.Join(dir, StateName)
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			fi, _ := f.Stat()
			if err := tc.edit(f, fi.Size()); err != nil {
				t.Fatal(err)
			}
			f.Close()
			s, err := OpenState(dir, "/vol")
			if err == nil {
				s.Close()
				t.Fatal("a state of the wrong size opened")
			}
			if !strings.Contains(err.Error(), "cut short or changed") || strings.Contains(err.Error(), "\n") {
				t.Errorf("error %q: want one line saying it was cut short", err)
			}
			if err := RemoveState(dir, "/vol"); err != nil {
				t.Fatal(err)
			}
			if names := dirNames(t, dir); len(names) != 1 || names[0] != DiskName {
				t.Errorf("after RemoveState the volume holds %q, want the disk alone", names)
			}
			if err := RemoveState(dir, "/vol"); err != nil {
				t.Errorf("RemoveState with no state: %v", err)
			}
		})
	}
}

// TestCheckpointState: a state saved into a checkpoint directory goes
// with the volume's disk, opens from that directory, and leaves the
// volume as it was.
func TestCheckpointState(t *testing.T) {
	vol, into := t.TempDir(), t.TempDir()
	disk := testDisk(t, vol)
	s, err := CreateCheckpoint(into, vol, "/vol")
	if err != nil {
		t.Fatal(err)
	}
	stream := []byte("QEVM stream")
	if _, err := s.File.Write(stream); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Commit(testStateInfo()); err != nil {
		t.Fatal(err)
	}
	if names := dirNames(t, vol); len(names) != 1 || names[0] != DiskName {
		t.Errorf("the volume holds %q, want the disk alone", names)
	}
	got, err := OpenState(into, "/vol")
	if err != nil || got == nil {
		t.Fatalf("OpenState of the checkpoint: %v, %v", got, err)
	}
	defer got.Close()
	if err := got.CheckDisk(disk); err != nil {
		t.Errorf("CheckDisk of the volume's disk: %v", err)
	}
	if _, err := CreateCheckpoint(into, filepath.Join(vol, "missing"), "/vol"); err == nil {
		t.Error("a checkpoint of a volume that is not there")
	}
	s, err = CreateCheckpoint(into, t.TempDir(), "/vol")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Commit(testStateInfo()); err == nil || !strings.Contains(err.Error(), DiskName) {
		t.Errorf("Commit of a checkpoint whose volume has no disk: %v", err)
	}
}
