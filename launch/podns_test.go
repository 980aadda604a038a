package launch

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/vmshim/vmshim/jail"
	"github.com/vmshim/vmshim/thread"
)

// linuxSpec is a sandbox spec with the given host name and namespaces.
func linuxSpec(hostname string, ns ...specs.LinuxNamespace) *specs.Spec {
	return &specs.Spec{Hostname: hostname, Linux: &specs.Linux{Namespaces: ns}}
}

// TestSandboxNamespaces checks how a sandbox spec's namespaces become the
// pause process's: new, joined or the host's, as the CRI's specs ask.
func TestSandboxNamespaces(t *testing.T) {
	const netns = "/run/netns/cni-1"
	net := specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: netns}
	ipc := specs.LinuxNamespace{Type: specs.IPCNamespace}
	uts := specs.LinuxNamespace{Type: specs.UTSNamespace}
	pid := specs.LinuxNamespace{Type: specs.PIDNamespace}
	mnt := specs.LinuxNamespace{Type: specs.MountNamespace}
	user := specs.LinuxNamespace{Type: specs.UserNamespace, Path: "/run/userns/pod"}
	cg := specs.LinuxNamespace{Type: specs.CgroupNamespace}
	at := func(n specs.LinuxNamespace, path string) specs.LinuxNamespace { n.Path = path; return n }
	for _, tc := range []struct {
		name string
		spec *specs.Spec
		want podNamespaces
		err  string // a refusal says this
	}{
		{name: "no linux section", spec: &specs.Spec{Hostname: "pod"}},
		{name: "nothing listed: the host's", spec: linuxSpec("")},
		{
			// The CRI's default pod: its own ipc, uts and pid.
			name: "cri pod",
			spec: linuxSpec("web-0", net, ipc, uts, pid, mnt),
			want: podNamespaces{netns: netns, clone: unix.CLONE_NEWIPC | unix.CLONE_NEWPID, newUTS: true, hostname: "web-0"},
		},
		{
			name: "cri pod with a user namespace the cri pinned",
			spec: linuxSpec("web-0", net, ipc, uts, pid, mnt, user, cg),
			want: podNamespaces{netns: netns, clone: unix.CLONE_NEWIPC | unix.CLONE_NEWPID, newUTS: true, hostname: "web-0"},
		},
		{
			name: "hostPID",
			spec: linuxSpec("web-0", net, ipc, uts, mnt),
			want: podNamespaces{netns: netns, clone: unix.CLONE_NEWIPC, newUTS: true, hostname: "web-0"},
		},
		{
			name: "hostIPC",
			spec: linuxSpec("web-0", net, uts, pid, mnt),
			want: podNamespaces{netns: netns, clone: unix.CLONE_NEWPID, newUTS: true, hostname: "web-0"},
		},
		{
			// The kubelet gives a hostNetwork pod no host name; one that
			// came anyway is not set on the host.
			name: "hostNetwork",
			spec: linuxSpec("node-1", ipc, pid, mnt),
			want: podNamespaces{clone: unix.CLONE_NEWIPC | unix.CLONE_NEWPID},
		},
		{name: "hostIPC, hostPID and hostNetwork", spec: linuxSpec("", mnt)},
		{
			name: "new uts without a host name",
			spec: linuxSpec("", uts),
			want: podNamespaces{newUTS: true},
		},
		{
			name: "joined by path",
			spec: linuxSpec("ignored", net, at(pid, "/proc/7/ns/pid"), at(uts, "/proc/7/ns/uts"), at(ipc, "/proc/7/ns/ipc")),
			want: podNamespaces{netns: netns, join: []nsJoin{
				{unix.CLONE_NEWIPC, "/proc/7/ns/ipc"}, {unix.CLONE_NEWUTS, "/proc/7/ns/uts"}, {unix.CLONE_NEWPID, "/proc/7/ns/pid"},
			}},
		},
		{
			name: "some new, some joined",
			spec: linuxSpec("db", net, ipc, uts, at(pid, "/proc/7/ns/pid")),
			want: podNamespaces{netns: netns, clone: unix.CLONE_NEWIPC, newUTS: true, hostname: "db", join: []nsJoin{{unix.CLONE_NEWPID, "/proc/7/ns/pid"}}},
		},
		{name: "listed twice", spec: linuxSpec("", ipc, uts, ipc), err: `lists namespace "ipc" twice`},
		{name: "network listed twice", spec: linuxSpec("", net, at(net, "/run/netns/other")), err: `lists namespace "network" twice`},
		{name: "relative path", spec: linuxSpec("", at(uts, "proc/7/ns/uts")), err: `"uts" namespace path "proc/7/ns/uts" is not absolute`},
		{name: "bad host name", spec: linuxSpec("web\n0", net, uts), err: `pod hostname "web\n0" holds the control character "\n"`},
		{name: "host name too long", spec: linuxSpec(strings.Repeat("a", 65), uts), err: "is 65 bytes, not 1 to 64"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := sandboxNamespaces(tc.spec)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || strings.Contains(err.Error(), "\n") || !errdefs.IsInvalidArgument(err) {
					t.Errorf("sandboxNamespaces: %v, want one invalid-argument line saying %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("sandboxNamespaces = %+v, want %+v", got, tc.want)
			}
			if n := len(got.steps()); n != len(tc.want.join)+b2i(tc.want.netns != "")+b2i(tc.want.newUTS) {
				t.Errorf("%d steps for %+v", n, got)
			}
		})
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func TestCheckHostname(t *testing.T) {
	for _, ok := range []string{
		"a", "web-0", "WEB-0", "pod.ns.svc.cluster.local", "0", "a-b-c", "x1.y2",
		strings.Repeat("a", 64), "host,id=evil", "a_b", "a b", "é", "-a",
	} {
		if err := checkHostname(ok); err != nil {
			t.Errorf("checkHostname(%q): %v", ok, err)
		}
	}
	for bad, want := range map[string]string{
		"":                        "is 0 bytes",
		strings.Repeat("a", 65):   "is 65 bytes, not 1 to 64",
		"a\nb":                    `holds the control character "\n"`,
		"a\x00b":                  `holds the control character "\x00"`,
		"a\x7fb":                  `holds the control character "\x7f"`,
		strings.Repeat("x", 1000): "is 1000 bytes, not 1 to 64",
	} {
		err := checkHostname(bad)
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") || !errdefs.IsInvalidArgument(err) {
			t.Errorf("checkHostname(%.20q): %v, want one invalid-argument line saying %q", bad, err, want)
		}
	}
}

// TestSandboxPodNamespaces starts the pause processes of two sandboxes as
// the CRI asks: the first in new ipc, uts (named after the pod) and pid
// namespaces, the second joining the first's by path. Neither moves the
// test process, and a path that cannot be opened is refused in one line
// with nothing left behind.
func TestSandboxPodNamespaces(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("new namespaces and dropping to a jail id need root")
	}
	ctx, _ := testLogger(t)
	removeIfMade(t, runtimeRoot)
	removeIfMade(t, idsDir)
	ids := jail.IDRange{First: 2100200, Last: 2100299}
	before := threadNamespaces(t)
	owner := func(i int) string { return fmt.Sprintf("vmshim-test/%s-%d-%d", t.Name(), os.Getpid(), i) }
	start := func(i int, spec *specs.Spec) (*sandboxVM, error) {
		ns, err := sandboxNamespaces(spec)
		if err != nil {
			return nil, err
		}
		s, err := launchSandbox(ctx, &Request{ID: fmt.Sprintf("sb%d", i), Bundle: t.TempDir()}, spec, ns, ids, owner(i))
		if err == nil {
			t.Cleanup(func() { _ = s.Kill(); <-s.Done(); _ = s.Release(ctx) })
		}
		return s, err
	}
	pod, err := start(0, linuxSpec("web-0", specs.LinuxNamespace{Type: specs.IPCNamespace},
		specs.LinuxNamespace{Type: specs.UTSNamespace}, specs.LinuxNamespace{Type: specs.PIDNamespace}))
	if err != nil {
		t.Fatal(err)
	}
	pid := pod.Pid()
	for _, kind := range []string{"ipc", "uts", "pid"} {
		if got := nsLink(t, pid, kind); got == before[kind] {
			t.Errorf("pause process's %s namespace is the test's, %s", kind, got)
		}
	}
	if got := nsLink(t, pid, "net"); got != before["net"] {
		t.Errorf("pause process of a sandbox with no netns is in %s, not the host's %s", got, before["net"])
	}
	if got := pauseStatus(t, pid)["NSpid"]; !strings.HasSuffix(got, " 1") {
		t.Errorf("pause process's NSpid %q, want PID 1 of its own pid namespace", got)
	}
	if got := utsHostname(t, pid); got != "web-0" {
		t.Errorf("pause process's uts namespace is named %q, want web-0", got)
	}
	// It still drops its privileges.
	waitForPauseDrop(t, pid)

	proc := func(kind string) specs.LinuxNamespace {
		return specs.LinuxNamespace{Type: specs.LinuxNamespaceType(kind), Path: fmt.Sprintf("/proc/%d/ns/%s", pid, kind)}
	}
	joined, err := start(1, linuxSpec("other", proc("ipc"), proc("uts"), proc("pid")))
	if err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{"ipc", "uts", "pid"} {
		if got, want := nsLink(t, joined.Pid(), kind), nsLink(t, pid, kind); got != want {
			t.Errorf("joining pause process's %s namespace %s, want the first's %s", kind, got, want)
		}
	}
	if got := pauseStatus(t, joined.Pid())["NSpid"]; strings.HasSuffix(got, " 1") || len(strings.Fields(got)) != 2 {
		t.Errorf("joining pause process's NSpid %q, want a pid after 1 in the first's namespace", got)
	}
	if got := utsHostname(t, joined.Pid()); got != "web-0" {
		t.Errorf("joined uts namespace renamed to %q, want web-0 still", got)
	}

	missing := filepath.Join(t.TempDir(), "missing")
	_, err = start(2, linuxSpec("", specs.LinuxNamespace{Type: specs.UTSNamespace, Path: missing}))
	if err == nil || !strings.Contains(err.Error(), "open uts namespace: open "+missing) || strings.Contains(err.Error(), "\n") {
		t.Errorf("sandbox joining %s: %v, want one line saying it cannot be opened", missing, err)
	}
	// The node's other shims claim ids in the same directory: look for
	// this sandbox's owner only.
	claims, _ := os.ReadDir(idsDir)
	for _, c := range claims {
		if data, _ := os.ReadFile(filepath.Join(idsDir, c.Name())); string(data) == owner(2) {
			t.Errorf("refused sandbox left its claim on jail id %s", c.Name())
		}
	}
	if after := threadNamespaces(t); !reflect.DeepEqual(after, before) {
		t.Errorf("test process's namespaces moved from %v to %v", before, after)
	}

	// SIGTERM, as Powerdown sends it, ends PID 1 of the pod's pid
	// namespace, and with it the process that joined that namespace.
	if err := pod.Powerdown(ctx); err != nil {
		t.Fatal(err)
	}
	for _, s := range []*sandboxVM{pod, joined} {
		select {
		case <-s.Done():
		case <-time.After(10 * time.Second):
			t.Fatalf("pause process %d still runs 10s after SIGTERM to the first", s.Pid())
		}
	}
	if code, _ := pod.ExitStatus(); code != 0 {
		t.Errorf("pause process ended with %d after SIGTERM, want 0", code)
	}
}

// nsLink is readlink of /proc/PID/ns/KIND.
func nsLink(t *testing.T, pid int, kind string) string {
	t.Helper()
	l, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", pid, kind))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// threadNamespaces maps each namespace kind a pause process is given to
// the one every thread of the test process is in; it fails the test if
// the threads differ.
func threadNamespaces(t *testing.T) map[string]string {
	t.Helper()
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, kind := range []string{"net", "ipc", "uts", "pid", "pid_for_children"} {
		for _, task := range tasks {
			l, err := os.Readlink("/proc/self/task/" + task.Name() + "/ns/" + kind)
			if errors.Is(err, os.ErrNotExist) {
				continue // the thread ended
			}
			if err != nil {
				t.Fatal(err)
			}
			if m[kind] != "" && m[kind] != l {
				t.Errorf("thread %s of the test is in %s, another in %s", task.Name(), l, m[kind])
			}
			m[kind] = l
		}
	}
	return m
}

// utsHostname reads the host name of process pid's uts namespace from a
// thread that joins it.
func utsHostname(t *testing.T, pid int) string {
	t.Helper()
	var u unix.Utsname
	if err := thread.Run(func() error { return unix.Uname(&u) },
		thread.JoinNamespace(fmt.Sprintf("/proc/%d/ns/uts", pid), unix.CLONE_NEWUTS)); err != nil {
		t.Fatal(err)
	}
	return unix.ByteSliceToString(u.Nodename[:])
}

// waitForPauseDrop waits until pause process pid runs as a jail id.
func waitForPauseDrop(t *testing.T, pid int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); pauseStatus(t, pid)["Uid"] == "0 0 0 0"; {
		if time.Now().After(deadline) {
			t.Fatalf("pause process %d still runs as root", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := syscall.Kill(pid, 0); err != nil {
		t.Fatalf("pause process %d: %v", pid, err)
	}
}
