package qemu

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
	got := fileMappings(maps)
	if len(got) != 2 {
		t.Fatalf("mappings %+v, want the two file mappings", got)
	}
	if got[1] != (mapping{start: 0x7f00aa000000, end: 0x7f00ab000000, dev: unix.Mkdev(0, 0x2a), ino: 77}) {
		t.Errorf("kernel mapping %+v", got[1])
	}
	if got[0].dev != unix.Mkdev(0xfd, 1) || got[0].ino != 1234 {
		t.Errorf("qemu mapping %+v", got[0])
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
	v := &VM{cmd: cmd}
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
	if err := v.PageOut(id); err != nil {
		t.Fatal(err)
	}
	if after := mappedRss(t, cmd.Process.Pid, path); after != 0 {
		t.Errorf("%d KiB of the file still resident, %d before", after, before)
	}
	if err := v.PageOut(); err != nil {
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
