package jail

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmshim/vmshim/thread"
)

func TestParseIDRange(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    IDRange
		wantErr string
	}{
		{in: "1879048192-1879113727", want: IDRange{1879048192, 1879113727}},
		{in: "70000-70000", want: IDRange{70000, 70000}},
		{in: "0-10", wantErr: "0 < FIRST"},
		{in: "10-5", wantErr: "0 < FIRST"},
		{in: "60000-70000", wantErr: "65534"},
		{in: "2147483000-2147483648", wantErr: "negative"},
		{in: "100", wantErr: "not a range"},
		{in: "a-b", wantErr: "not a range"},
		{in: "-1-5", wantErr: "not a range"},
	} {
		got, err := ParseIDRange(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ParseIDRange(%q) = %v, %v; want an error with %q", tc.in, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseIDRange(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

func TestClaimRelease(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ids")
	r := IDRange{First: 100000, Last: 100003}
	// Four owners at once get four different ids; a fifth gets none.
	var mu sync.Mutex
	got := map[uint32]string{}
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			owner := fmt.Sprintf("ns/vm%d", i)
			id, err := Claim(dir, r, owner)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if other, ok := got[id]; ok {
				t.Errorf("id %d given to %s and %s", id, other, owner)
			}
			got[id] = owner
		}()
	}
	wg.Wait()
	if _, err := Claim(dir, r, "ns/vm4"); err == nil || !strings.Contains(err.Error(), "no free id left") {
		t.Errorf("claim from a full range: %v, want no free id left", err)
	}
	for id, owner := range got {
		if id < r.First || id > r.Last {
			t.Errorf("id %d outside %v", id, r)
		}
		// Only the owner's release frees the id.
		if err := Release(dir, id, "ns/someone-else"); err != nil {
			t.Error(err)
		}
		if _, err := os.Stat(idFile(dir, id)); err != nil {
			t.Errorf("id %d freed by a release of another owner", id)
		}
		if err := Release(dir, id, owner); err != nil {
			t.Error(err)
		}
		if err := Release(dir, id, owner); err != nil {
			t.Errorf("second release: %v", err)
		}
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 0 {
		t.Errorf("claims left: %v", entries)
	}
	// The same owner gets the same id again on an empty range.
	a, _ := Claim(dir, r, "ns/stable")
	_ = Release(dir, a, "ns/stable")
	if b, _ := Claim(dir, r, "ns/stable"); a != b {
		t.Errorf("owner got %d, then %d", a, b)
	}
}

func TestValidate(t *testing.T) {
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ok := Jail{Root: "/run/x/jail", UID: 70000, GID: 70000,
		Binds:   []Bind{{Target: "/vm/kernel", File: f}, {Target: "/vm/share/0", Source: "/srv"}},
		Devices: []Device{{Path: "/dev/kvm", Major: 10, Minor: 232}}}
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid jail: %v", err)
	}
	for name, mutate := range map[string]func(j *Jail){
		"relative root":    func(j *Jail) { j.Root = "jail" },
		"root is /":        func(j *Jail) { j.Root = "/" },
		"unclean root":     func(j *Jail) { j.Root = "/run/../jail" },
		"root uid":         func(j *Jail) { j.UID = 0 },
		"root gid":         func(j *Jail) { j.GID = 0 },
		"bind outside /vm": func(j *Jail) { j.Binds[0].Target = "/etc/passwd" },
		"bind climbing":    func(j *Jail) { j.Binds[0].Target = "/vm/../etc" },
		"bind is /vm":      func(j *Jail) { j.Binds[0].Target = "/vm" },
		"bind twice":       func(j *Jail) { j.Binds[1].Target = j.Binds[0].Target },
		"relative source":  func(j *Jail) { j.Binds[1].Source = "srv" },
		"device elsewhere": func(j *Jail) { j.Devices[0].Path = "/vm/kvm" },
	} {
		j := ok
		j.Binds = append([]Bind(nil), ok.Binds...)
		j.Devices = append([]Device(nil), ok.Devices...)
		mutate(&j)
		if err := j.Validate(); err == nil {
			t.Errorf("%s: Validate accepted %+v", name, j)
		}
	}
}

// TestJailedProgram runs programs in a real jail and checks what they
// see and what they are.
func TestJailedProgram(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("a jail needs root")
	}
	share := t.TempDir()
	if err := os.WriteFile(filepath.Join(share, "hello"), []byte("shared\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(share, 0o755); err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(t.TempDir(), "kernel")
	if err := os.WriteFile(secret, []byte("kernel bytes\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	kernel, err := os.Open(secret)
	if err != nil {
		t.Fatal(err)
	}
	defer kernel.Close()
	root := filepath.Join(t.TempDir(), "jail")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	j := &Jail{Root: root, UID: 70001, GID: 70002, Groups: []uint32{70003},
		Binds: []Bind{
			{Target: "/vm/kernel", File: kernel, ReadOnly: true},
			{Target: "/vm/share/0", Source: share, ReadOnly: true},
		},
	}
	script := `ls -A /; echo; ls -A /dev; echo; id -u; id -g; id -G; cat /vm/share/0/hello; set -- /proc/[0-9]*; echo $#; ls /proc/sys 2>&1
touch /x 2>/dev/null && echo ROOT-WRITABLE; touch /vm/share/0/x 2>/dev/null && echo SHARE-WRITABLE
cat /vm/kernel 2>&1; ls /etc 2>&1 | head -1`
	cmd := exec.Command("/usr/bin/sh", "-c", script)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	j.Apply(cmd)
	if err := thread.Fork(cmd, j.Enter); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	parts := strings.Split(out.String(), "\n\n")
	if len(parts) != 3 {
		t.Fatalf("output: %q", out.String())
	}
	var want []string
	for _, d := range systemDirs {
		if _, err := os.Lstat(d); err == nil {
			want = append(want, strings.TrimPrefix(d, "/"))
		}
	}
	want = append(want, "dev", "proc", "vm")
	sort.Strings(want)
	if got := strings.Fields(parts[0]); !reflect.DeepEqual(got, want) {
		t.Errorf("jail root holds %v, want %v", got, want)
	}
	if got := strings.Fields(parts[1]); !reflect.DeepEqual(got, []string{"full", "null", "random", "urandom", "zero"}) {
		t.Errorf("jail /dev holds %v", got)
	}
	rest := strings.Split(strings.TrimSpace(parts[2]), "\n")
	wantRest := []string{"70001", "70002", "70002 70003", "shared",
		// Its /proc holds its own processes (the shell alone, as it
		// expands the glob) and no more.
		"1", "ls: cannot access '/proc/sys': No such file or directory",
		// The kernel file is root's, 0600: bound by its descriptor, the
		// jailed user still cannot read it.
		"cat: /vm/kernel: Permission denied", "ls: cannot access '/etc': No such file or directory"}
	if !reflect.DeepEqual(rest, wantRest) {
		t.Errorf("in the jail:\n%q\nwant\n%q", rest, wantRest)
	}
	// Nothing is left on the host: the jail's mounts lived in its own
	// namespace.
	if entries, _ := os.ReadDir(root); len(entries) != 0 {
		t.Errorf("jail root on the host holds %v", entries)
	}
}

// TestJailedProcessStatus checks the ids, capabilities and no_new_privs a
// jailed program has, and its mount namespace.
func TestJailedProcessStatus(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("a jail needs root")
	}
	root := filepath.Join(t.TempDir(), "jail")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	// The test's thread stays where it is: compare with it.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	own, _ := os.Readlink("/proc/thread-self/ns/mnt")
	j := &Jail{Root: root, UID: 70011, GID: 70011}
	cmd := exec.Command("/usr/bin/sleep", "30")
	j.Apply(cmd)
	if err := thread.Fork(cmd, j.Enter); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	status := func() map[string]string {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", cmd.Process.Pid))
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]string{}
		for _, l := range strings.Split(string(data), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok {
				m[k] = strings.Join(strings.Fields(v), " ")
			}
		}
		return m
	}
	// The child has exec'd once its name is sleep.
	deadline := time.Now().Add(5 * time.Second)
	st := status()
	for st["Name"] != "sleep" && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
		st = status()
	}
	for k, want := range map[string]string{
		"Uid": "70011 70011 70011 70011", "Gid": "70011 70011 70011 70011", "Groups": "",
		"CapEff": "0000000000000000", "CapPrm": "0000000000000000", "CapInh": "0000000000000000",
		"CapBnd": "0000000000000000", "CapAmb": "0000000000000000", "NoNewPrivs": "1",
	} {
		if st[k] != want {
			t.Errorf("%s: %q, want %q", k, st[k], want)
		}
	}
	theirs, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", cmd.Process.Pid))
	if theirs == "" || theirs == own {
		t.Errorf("jailed mount namespace %q, ours %q: want another", theirs, own)
	}
	if now, _ := os.Readlink("/proc/thread-self/ns/mnt"); now != own {
		t.Errorf("the test's thread moved to mount namespace %s", now)
	}
}

// TestReleaseByOwner checks that an owner that never learned its id (a
// crash between Claim and its record) still gives back what it holds,
// and only that.
func TestReleaseByOwner(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ids")
	if err := Release(dir, 0, "ns/vm0"); err != nil {
		t.Fatalf("release from a missing dir: %v", err)
	}
	r := IDRange{First: 200000, Last: 200009}
	mine, err := Claim(dir, r, "ns/vm0")
	if err != nil {
		t.Fatal(err)
	}
	theirs, err := Claim(dir, r, "ns/vm1")
	if err != nil {
		t.Fatal(err)
	}
	if err := Release(dir, 0, "ns/vm0"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(idFile(dir, mine)); !os.IsNotExist(err) {
		t.Errorf("claim %d still there (%v)", mine, err)
	}
	if _, err := os.Stat(idFile(dir, theirs)); err != nil {
		t.Errorf("another owner's claim went: %v", err)
	}
	if err := Release(dir, 0, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(idFile(dir, theirs)); err != nil {
		t.Errorf("a release with no owner freed a claim: %v", err)
	}
}

// TestJailMountinfo checks that a jailed program's mount namespace holds
// the jail's mounts and nothing else: its /proc/self/mountinfo names no
// mount of the host (a marker mounted on the host before the jail is
// built included), its root is the jail's tmpfs, and a bind's mount
// shows only the bound directory.
func TestJailMountinfo(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("a jail needs root")
	}
	// A mount of the host's whose name must not reach the jail, as
	// another pod's volume would be.
	marker := filepath.Join(t.TempDir(), "other-pod-volume")
	if err := os.Mkdir(marker, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("vmshim-test-other-pod", marker, "tmpfs", 0, "size=64k"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(marker, unix.MNT_DETACH) })
	// A volume on a shared mount, as the kubelet's are: the jail's bind
	// of it must not stay its peer.
	share := t.TempDir()
	if err := unix.Mount("vmshim-test-share", share, "tmpfs", 0, "size=64k,mode=0755"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(share, unix.MNT_DETACH) })
	if err := unix.Mount("", share, "", unix.MS_SHARED, ""); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(t.TempDir(), "jail")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, sysfs := range []bool{false, true} {
		j := &Jail{Root: root, UID: 70021, GID: 70021, Sysfs: sysfs,
			Binds: []Bind{{Target: "/vm/share/0", Source: share, ReadOnly: true}}}
		// It reads its mountinfo, then waits: its root is looked at
		// from the host while it runs.
		cmd := exec.Command("/usr/bin/sh", "-c", "cat /proc/self/mountinfo; echo; read x || true")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		j.Apply(cmd)
		if err := thread.Fork(cmd, j.Enter); err != nil {
			t.Fatal(err)
		}
		// The jailed shell is in the jail's root, which the host cannot
		// name: not the host directory Root, as a chroot would be.
		var st unix.Statfs_t
		rootLink := fmt.Sprintf("/proc/%d/root", cmd.Process.Pid)
		if err := unix.Statfs(rootLink, &st); err != nil || st.Type != unix.TMPFS_MAGIC {
			t.Errorf("sysfs %v: the program's root is no tmpfs: type %#x, %v", sysfs, st.Type, err)
		}
		if link, _ := os.Readlink(rootLink); link == root {
			t.Errorf("sysfs %v: the program's root is %s, the host's directory", sysfs, link)
		}
		stdin.Close()
		if err := cmd.Wait(); err != nil {
			t.Fatalf("sysfs %v: %v: %s", sysfs, err, out.String())
		}
		allowed := map[string]bool{"/": true, "/proc": true, "/vm/share/0": true}
		for _, d := range systemDirs {
			allowed[d] = true
		}
		if sysfs {
			allowed["/sys"] = true
		}
		seen := map[string]string{}
		for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
			f := strings.Fields(l)
			if len(f) < 10 {
				t.Fatalf("sysfs %v: mountinfo line %q", sysfs, l)
			}
			// Fields: id parent major:minor root mountpoint options ... - type source
			mountRoot, point := f[3], f[4]
			sep := slices.Index(f, "-")
			fsType, source := f[sep+1], f[sep+2]
			if !allowed[point] {
				t.Errorf("sysfs %v: the jail shows a mount at %s: %q", sysfs, point, l)
			}
			if tags := strings.Join(f[6:sep], " "); tags != "" {
				t.Errorf("sysfs %v: the jail's mount at %s propagates (%s): %q", sysfs, point, tags, l)
			}
			if strings.Contains(l, "vmshim-test-other-pod") {
				t.Errorf("sysfs %v: the jail names the host's marker mount: %q", sysfs, l)
			}
			seen[point] = fsType + " " + source + " " + mountRoot
		}
		if got := seen["/"]; got != "tmpfs vmshim-jail /" {
			t.Errorf("sysfs %v: the jail's root is %q, want its own tmpfs", sysfs, got)
		}
		if got := seen["/vm/share/0"]; got != "tmpfs vmshim-test-share /" {
			t.Errorf("sysfs %v: the share is %q, want a bind of %s", sysfs, got, share)
		}
		for _, p := range []string{"/proc", "/usr"} {
			if seen[p] == "" {
				t.Errorf("sysfs %v: no mount at %s in %q", sysfs, p, out.String())
			}
		}
		if _, ok := seen["/sys"]; ok != sysfs {
			t.Errorf("sysfs %v: /sys mounted: %v", sysfs, ok)
		}
		if entries, _ := os.ReadDir(root); len(entries) != 0 {
			t.Errorf("sysfs %v: jail root on the host holds %v", sysfs, entries)
		}
	}
}
