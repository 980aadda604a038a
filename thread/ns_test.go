package thread

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// forkOutput runs argv forked after steps and returns its trimmed output.
func forkOutput(t *testing.T, argv []string, steps ...Step) string {
	t.Helper()
	var out bytes.Buffer
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout = &out
	if err := Fork(cmd, steps...); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(out.String())
}

// nsLinks reads the calling thread's links of the given namespace files.
func nsLinks(t *testing.T, names ...string) []string {
	t.Helper()
	var links []string
	for _, n := range names {
		l, err := os.Readlink("/proc/thread-self/ns/" + n)
		if err != nil {
			t.Fatal(err)
		}
		links = append(links, l)
	}
	return links
}

func TestNewUTS(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("a new uts namespace needs root")
	}
	ours, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	if got := forkOutput(t, []string{"/bin/hostname"}, NewUTS("pod-a.example")); got != "pod-a.example" {
		t.Errorf("child of a thread in a new uts namespace named pod-a.example says %q", got)
	}
	if got := forkOutput(t, []string{"/bin/hostname"}, NewUTS("")); got != ours {
		t.Errorf("child of a thread in a new unnamed uts namespace says %q, want the name it had, %q", got, ours)
	}
	if got, err := os.Hostname(); err != nil || got != ours {
		t.Errorf("host name after the forks: %q, %v; want %q", got, err, ours)
	}
	own, err := os.Readlink("/proc/self/ns/uts")
	if err != nil {
		t.Fatal(err)
	}
	if got := forkOutput(t, []string{"/bin/readlink", "/proc/self/ns/uts"}, NewUTS("pod-a")); got == own {
		t.Errorf("child of a thread in a new uts namespace is in ours, %s", got)
	}
	// A name the kernel refuses moves the thread all the same: the step
	// must hand back its way back with the error.
	cmd := exec.Command("/bin/true")
	if err := Fork(cmd, NewUTS(strings.Repeat("a", 65))); err == nil || !strings.Contains(err.Error(), "set host name") {
		t.Errorf("Fork with a 65-byte host name: %v, want an error saying set host name", err)
	}
	if cmd.Process != nil {
		_ = cmd.Wait()
		t.Error("command started")
	}
}

func TestJoinNamespace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("new namespaces need root")
	}
	holder := exec.Command("/bin/sleep", "60")
	holder.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWIPC | unix.CLONE_NEWUTS | unix.CLONE_NEWPID}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = holder.Process.Kill(); _ = holder.Wait() })
	ns := func(kind string) string { return "/proc/" + strconv.Itoa(holder.Process.Pid) + "/ns/" + kind }
	want := func(kind string) string {
		l, err := os.Readlink(ns(kind))
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	before := nsLinks(t, "ipc", "uts", "pid", "pid_for_children")
	steps := []Step{
		JoinNamespace(ns("ipc"), unix.CLONE_NEWIPC),
		JoinNamespace(ns("uts"), unix.CLONE_NEWUTS),
		JoinNamespace(ns("pid"), unix.CLONE_NEWPID),
	}
	got := strings.Fields(forkOutput(t, []string{"/bin/sh", "-c", "readlink /proc/self/ns/ipc /proc/self/ns/uts /proc/self/ns/pid; echo $$"}, steps...))
	if len(got) != 4 {
		t.Fatalf("child printed %q", got)
	}
	for i, kind := range []string{"ipc", "uts", "pid"} {
		if got[i] != want(kind) {
			t.Errorf("child's %s namespace %s, want the holder's %s", kind, got[i], want(kind))
		}
	}
	// The holder is PID 1 of its namespace; the child comes after it.
	if got[3] == "1" {
		t.Errorf("child is PID %s in the holder's pid namespace", got[3])
	}
	if after := nsLinks(t, "ipc", "uts", "pid", "pid_for_children"); strings.Join(after, " ") != strings.Join(before, " ") {
		t.Errorf("calling thread moved from %q to %q", before, after)
	}
}

func TestJoinNamespaceErrors(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("joining namespaces needs root")
	}
	notNS := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notNS, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, path string
		nstype     int
		want       string
	}{
		{name: "missing", path: filepath.Join(t.TempDir(), "missing"), nstype: unix.CLONE_NEWIPC, want: "open ipc namespace: open "},
		{name: "not a namespace", path: notNS, nstype: unix.CLONE_NEWUTS, want: "it is no uts namespace"},
		{name: "another type", path: "/proc/self/ns/net", nstype: unix.CLONE_NEWPID, want: "it is no pid namespace"},
		{name: "unknown type", path: "/proc/self/ns/net", nstype: unix.CLONE_NEWNET, want: "is not ipc, uts or pid"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command("/bin/true")
			err := Fork(cmd, JoinNamespace(tc.path, tc.nstype))
			if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("Fork: %v, want one line saying %q", err, tc.want)
			}
			if cmd.Process != nil {
				_ = cmd.Wait()
				t.Error("command started")
			}
		})
	}
}
