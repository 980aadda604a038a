package cgroup

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/cgroups/v3"
	sddbus "github.com/coreos/go-systemd/v22/dbus"
)

// v1ScopeUnits plays systemd on a real cgroup v1 machine: a started
// scope is a directory of the named systemd hierarchy with the pid in it.
type v1ScopeUnits struct {
	mu    sync.Mutex
	calls []string
}

func (u *v1ScopeUnits) startScope(_ context.Context, slice, unit string, pid int, _ []sddbus.Property) error {
	u.mu.Lock()
	u.calls = append(u.calls, fmt.Sprintf("start %s %s %d", slice, unit, pid))
	u.mu.Unlock()
	dir := filepath.Join(cgroupRoot, "systemd", slice, unit)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0)
}

func (u *v1ScopeUnits) setProperties(context.Context, string, []sddbus.Property) error { return nil }

// stopUnit ends the scope's processes, as systemd does.
func (u *v1ScopeUnits) stopUnit(_ context.Context, unit string) error {
	u.mu.Lock()
	u.calls = append(u.calls, "stop "+unit)
	slice := strings.SplitN(u.calls[0], " ", 3)[1]
	u.mu.Unlock()
	data, _ := os.ReadFile(filepath.Join(cgroupRoot, "systemd", slice, unit, "cgroup.procs"))
	for _, f := range strings.Fields(string(data)) {
		if pid, err := strconv.Atoi(f); err == nil {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	return nil
}

// TestScopeStartsIntoScope checks that under the systemd driver the task's
// process runs in the scope from its first instruction: the scope is made
// around a placeholder, which is gone once the process has started.
func TestScopeStartsIntoScope(t *testing.T) {
	skipCgroupUnlessRoot(t, "creates cgroups")
	if m := cgroups.Mode(); m != cgroups.Legacy && m != cgroups.Hybrid {
		t.Skip("not a cgroup v1 host")
	}
	if _, err := os.Stat(filepath.Join(cgroupRoot, "systemd")); err != nil {
		t.Skip("no named systemd hierarchy")
	}
	slice := fmt.Sprintf("vmshimt%08x.slice", rand.Uint32())
	t.Cleanup(func() {
		entries, _ := os.ReadDir(cgroupRoot)
		for _, e := range entries {
			_ = os.Remove(filepath.Join(cgroupRoot, e.Name(), slice, "p-x.scope"))
			_ = os.Remove(filepath.Join(cgroupRoot, e.Name(), slice))
		}
	})
	units := &v1ScopeUnits{}
	var hold *exec.Cmd
	h := NewHost(nil)
	h.systemd = func() bool { return true }
	h.units = units
	h.hold = func() (*exec.Cmd, error) {
		hold = exec.Command("sleep", "300")
		return hold, hold.Start()
	}
	cg, err := h.Create(context.Background(), slice+":p:x", testCgroupResources(64<<20, 50000))
	if err != nil {
		t.Fatal(err)
	}
	first := filepath.Join(t.TempDir(), "cgroup")
	cmd := exec.Command("sh", "-c", `cat /proc/self/cgroup >"$0"; exec sleep 30`, first)
	if err := cg.Start(cmd); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if err := cg.Delete(); err != nil {
			t.Errorf("delete: %v", err)
		}
		for deadline := time.Now().Add(waitTimeout); hold.Process.Signal(syscall.Signal(0)) == nil; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Error("the placeholder outlived the scope")
				return
			}
		}
	})
	if got, want := cg.MemoryDir(), filepath.Join(cgroupRoot, "memory", slice, "p-x.scope"); got != want {
		t.Errorf("memory dir %q, want %q", got, want)
	}
	// The placeholder keeps the scope until Delete stops it.
	if hold == nil || hold.Process.Signal(syscall.Signal(0)) != nil {
		t.Fatal("the placeholder process is gone after Start")
	}
	calls := units.calls
	if want := fmt.Sprintf("start %s p-x.scope %d", slice, hold.Process.Pid); len(calls) != 1 || calls[0] != want {
		t.Fatalf("systemd calls %q, want %q", calls, want)
	}
	// cat has written the process's first cgroups once sleep runs.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", cmd.Process.Pid))
		if strings.HasPrefix(string(cmdline), "sleep") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the process did not exec sleep within 10s")
		}
	}
	out, err := os.ReadFile(first)
	if want := ":memory:/" + slice + "/p-x.scope\n"; err != nil || !strings.Contains(string(out), want) {
		t.Errorf("the process's first cgroups lack %q (%v):\n%s", want, err, out)
	}
}

func TestOOMPolicy(t *testing.T) {
	for _, tc := range []struct {
		version string
		want    bool // OOMPolicy=continue asked
	}{
		{`"252.30-1~deb12u2"`, false}, // Debian 12: scopes have no OOM policy
		{`"253"`, true},
		{`"255.4-1ubuntu8.11"`, true},
		{"257.9", true},
		{`"249.11-0ubuntu3.12"`, false},
		{"", false},
		{`"v256"`, false}, // unreadable: ask for nothing an old systemd would refuse
		{`"99999999999999999999"`, false},
	} {
		props := oomPolicy(tc.version)
		got := len(props) == 1 && props[0].Name == "OOMPolicy" && props[0].Value.Value() == "continue"
		if got != tc.want || (!tc.want && len(props) != 0) {
			t.Errorf("oomPolicy(%s) = %v, want OOMPolicy=continue: %v", tc.version, props, tc.want)
		}
	}
}
