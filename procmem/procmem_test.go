package procmem

import (
	"bufio"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestFileMappings(t *testing.T) {
	maps := []byte(`55d0c0a00000-55d0c0b00000 r--p 00000000 fd:01 1234 /usr/bin/qemu-system-x86_64
7f00aa000000-7f00ab000000 r--p 00000000 00:2a 77 /run/vmshim/x/root/vm/kernel
7f00ab000000-7f00ab100000 rw-p 00000000 00:00 0 
7f00ac000000-7f00ac100000 rw-p 00000000 00:00 0 [heap]
garbage
7f00ad000000-7f00ac000000 r--p 00000000 fd:01 99 /backwards
7f00ad000000-7f00ad001000 r--p 00000000 zz:01 98 /bad-dev
`)
	got := FileMappings(maps)
	if len(got) != 2 {
		t.Fatalf("mappings %+v, want the two file mappings", got)
	}
	if got[1] != (Mapping{Start: 0x7f00aa000000, End: 0x7f00ab000000, Perms: "r--p", File: FileID{unix.Mkdev(0, 0x2a), 77}}) {
		t.Errorf("kernel mapping %+v", got[1])
	}
	if got[0].File != (FileID{unix.Mkdev(0xfd, 1), 1234}) || got[0].Writable() {
		t.Errorf("qemu mapping %+v", got[0])
	}
}

func TestFileMappingsSmaps(t *testing.T) {
	smaps := []byte(`00400000-00dc8000 r-xp 00000000 fe:00 10682678                           /usr/bin/containerd-shim-vm-v2
Size:              10016 kB
Rss:                9184 kB
Anonymous:             0 kB
VmFlags: rd ex mr mw me 
00dc8000-018b9000 r--p 009c8000 fe:00 10682678                           /usr/bin/containerd-shim-vm-v2
Size:              11204 kB
Anonymous:             8 kB
018b9000-0194d000 rw-p 014b9000 fe:00 10682678                           /usr/bin/containerd-shim-vm-v2
Anonymous:           464 kB
99136400000-99136c00000 rw-p 00000000 00:00 0 
Anonymous:          2896 kB
7f2d90a07000-7f2d90a8b000 r--p 00000000 fe:00 5 /lib/x
Anonymous:          lots kB
`)
	got := FileMappings(smaps)
	want := []struct {
		perms string
		anon  uint64
	}{{"r-xp", 0}, {"r--p", 8}, {"rw-p", 464}, {"r--p", ^uint64(0)}}
	if len(got) != len(want) {
		t.Fatalf("mappings %+v, want %d", got, len(want))
	}
	for i, w := range want {
		if got[i].Perms != w.perms || got[i].AnonymousKiB != w.anon {
			t.Errorf("mapping %d: %+v, want perms %s and %d KiB anonymous", i, got[i], w.perms, w.anon)
		}
	}
	if !got[2].Writable() {
		t.Errorf("%+v is writable", got[2])
	}
}

// PageOut takes a mapped file's pages out of a process's resident
// memory, and leaves its other mappings alone.
func TestPageOutFiles(t *testing.T) {
	dir, err := os.MkdirTemp("/var/tmp", "pageout")
	if err != nil {
		t.Skip(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := dir + "/kernel"
	if err := os.WriteFile(path, make([]byte, 4<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	// A process that maps the file, reads all of it and waits.
	cmd := exec.Command("python3", "-c", `import mmap, sys
f = open(sys.argv[1], "rb")
m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
sum(m[i] for i in range(0, len(m), 4096))
print("mapped", flush=True)
sys.stdin.read()`, path)
	stdin, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Skipf("python3: %v", err)
	}
	t.Cleanup(func() { stdin.Close(); cmd.Wait() })
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "mapped\n" {
		t.Fatalf("child: %q, %v", line, err)
	}
	before := mappedRss(t, cmd.Process.Pid, path)
	if before < 4<<10 {
		t.Fatalf("the file is not resident in the child: %d KiB", before)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	id, err := FileIDOf(f)
	if err != nil {
		t.Fatal(err)
	}
	if err := PageOut(cmd.Process.Pid, id); err != nil {
		t.Fatal(err)
	}
	if after := mappedRss(t, cmd.Process.Pid, path); after != 0 {
		t.Errorf("%d KiB of the file still resident, %d before", after, before)
	}
	if err := PageOut(cmd.Process.Pid); err != nil {
		t.Errorf("no files: %v", err)
	}
}

// mappedRss is the resident KiB of pid's mappings of path.
func mappedRss(t *testing.T, pid int, path string) int {
	t.Helper()
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/smaps")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	in, total := false, 0
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		switch {
		case len(fields) >= 6 && strings.Contains(fields[0], "-") && !strings.HasSuffix(fields[0], ":"):
			in = fields[5] == path
		case len(fields) >= 5 && strings.Contains(fields[0], "-") && !strings.HasSuffix(fields[0], ":"):
			in = false
		case in && len(fields) >= 2 && fields[0] == "Rss:":
			n, _ := strconv.Atoi(fields[1])
			total += n
		}
	}
	return total
}

// ReleaseOwn unmaps this program's code and constant data, which it then
// maps again, page by page, as it runs, and leaves its data alone.
func TestReleaseOwn(t *testing.T) {
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	data := []int{1, 2, 3}
	before := mappedRss(t, os.Getpid(), exe)
	n, err := ReleaseOwn()
	if err != nil {
		t.Fatal(err)
	}
	after := mappedRss(t, os.Getpid(), exe)
	// The collection and this test's own code map some of it again at
	// once, the more of it the smaller the program.
	if after >= before {
		t.Errorf("%d KiB of the program resident before, %d after", before, after)
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(exe)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	id, err := FileIDOf(f)
	if err != nil {
		t.Fatal(err)
	}
	var readOnly uint64
	for _, m := range FileMappings(maps) {
		if m.File == id && !m.Writable() {
			readOnly += m.End - m.Start
		}
	}
	if n == 0 || n != readOnly {
		t.Errorf("released %d bytes of mappings, want the program's read-only ones, %d", n, readOnly)
	}
	if data[0]+data[1]+data[2] != 6 {
		t.Errorf("data changed: %v", data)
	}
	// The program still runs, and maps what it runs again.
	if _, err := ReleaseOwn(); err != nil {
		t.Errorf("again: %v", err)
	}
}
