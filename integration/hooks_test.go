package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// hookScript appends one line per call to the log named by $2: the phase
// ($1), the inode of its own network namespace, that of the VM's ($3, or
// "gone"), its working directory, and the state JSON from stdin.
const hookScript = `#!/bin/sh
self=$(stat -L -c %i /proc/self/ns/net)
vm=$(stat -L -c %i "$3" 2>/dev/null || echo gone)
state=$(cat)
echo "$1 $self $vm $(pwd) $state" >>"$2"
[ "$1" != fail ] || { echo boom >&2; exit 3; }
`

// hookCall is one line of the hook log.
type hookCall struct {
	phase, selfNS, vmNS, cwd string
	state                    specs.State
}

// withHooks gives the spec one hook per phase, each running script with
// the phase name; createRuntime runs "fail" instead when failCreate.
func withHooks(script, logPath, netns string, failCreate bool) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *specs.Spec) error {
		hook := func(phase string) []specs.Hook {
			return []specs.Hook{{Path: script, Args: []string{"hook", phase, logPath, netns}, Env: []string{"PATH=/usr/bin:/bin"}}}
		}
		create := "createRuntime"
		if failCreate {
			create = "fail"
		}
		s.Hooks = &specs.Hooks{
			CreateRuntime: hook(create), CreateContainer: hook("createContainer"),
			StartContainer: hook("startContainer"), Poststart: hook("poststart"), Poststop: hook("poststop"),
		}
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		s.Annotations["test.vmshim.io/marker"] = "kept"
		return nil
	}
}

func readHookLog(t *testing.T, path string) []hookCall {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("hook log: %v", err)
	}
	var calls []hookCall
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		f := strings.SplitN(line, " ", 5)
		if len(f) != 5 {
			t.Fatalf("hook log line %q", line)
		}
		c := hookCall{phase: f[0], selfNS: f[1], vmNS: f[2], cwd: f[3]}
		if err := json.Unmarshal([]byte(f[4]), &c.state); err != nil {
			t.Fatalf("state JSON of %s: %v: %s", f[0], err, f[4])
		}
		calls = append(calls, c)
	}
	return calls
}

// TestHooks runs a VM whose spec has a hook in every phase and checks the
// order of the calls and the state each one read on stdin, the namespace
// each ran in, and that a failing createRuntime hook fails the create
// with a one-line error, still runs poststop, and leaves nothing behind.
func TestHooks(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "hook.sh")
	if err := os.WriteFile(script, []byte(hookScript), 0o755); err != nil {
		t.Fatal(err)
	}
	selfNS := func() string {
		fi, err := os.Stat("/run/netns/" + env.daemon.netns)
		if err != nil {
			t.Fatal(err)
		}
		return fmt.Sprint(fi.Sys().(*syscall.Stat_t).Ino)
	}()

	t.Run("lifecycle", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
		defer cancel()
		logPath := filepath.Join(dir, "lifecycle.log")
		id := uniqueID(t)
		netns := vmNetns(testNamespace, id)
		v, err := createVM(ctx, t, id, imageKernelOff, nil, withHooks(script, logPath, netns, false))
		if err != nil {
			t.Fatalf("create: %v\ncontainerd log:\n%s", err, env.daemon.logTail())
		}
		v.start(ctx, t)
		if code := v.waitExit(ctx, t); code != 0 {
			t.Errorf("exit %d, want 0", code)
		}
		pid := int(v.task.Pid())
		v.remove(t)

		calls := readHookLog(t, logPath)
		want := []struct {
			phase  string
			status specs.ContainerState
			pid    int
			inVM   bool
		}{
			{"createRuntime", specs.StateCreating, 0, false},
			{"createContainer", specs.StateCreating, 0, true},
			{"startContainer", specs.StateCreated, pid, true},
			{"poststart", specs.StateRunning, pid, false},
			{"poststop", specs.StateStopped, 0, false},
		}
		if len(calls) != len(want) {
			t.Fatalf("hooks ran %d times, want %d: %+v", len(calls), len(want), calls)
		}
		bundle := filepath.Join(env.daemon.dir, "state", "io.containerd.runtime.v2.task", testNamespace, id)
		for i, w := range want {
			c := calls[i]
			st := c.state
			if c.phase != w.phase || st.Status != w.status || st.Pid != w.pid || st.ID != id || st.Bundle != bundle ||
				st.Version != specs.Version || c.cwd != bundle {
				t.Errorf("hook %d: %s status %s pid %d id %s bundle %s version %s cwd %s; want %s status %s pid %d id %s bundle %s",
					i, c.phase, st.Status, st.Pid, st.ID, st.Bundle, st.Version, c.cwd, w.phase, w.status, w.pid, id, bundle)
			}
			if st.Annotations["nerdctl/network-namespace"] != netns || st.Annotations["test.vmshim.io/marker"] != "kept" {
				t.Errorf("%s: annotations %v, want the spec's and nerdctl/network-namespace=%s", c.phase, st.Annotations, netns)
			}
			if c.vmNS == "gone" && c.phase != "poststop" {
				t.Errorf("%s: the VM's netns %s does not exist", c.phase, netns)
			}
			switch {
			case w.inVM && c.selfNS != c.vmNS:
				t.Errorf("%s ran in netns %s, want the VM's (%s)", c.phase, c.selfNS, c.vmNS)
			case !w.inVM && c.selfNS != selfNS:
				t.Errorf("%s ran in netns %s, want the runtime's (%s)", c.phase, c.selfNS, selfNS)
			}
		}
		assertNothingLeft(ctx, t, id)
	})

	t.Run("shim killed", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
		defer cancel()
		logPath := filepath.Join(dir, "killed.log")
		id := uniqueID(t)
		v, err := createVM(ctx, t, id, imageKernelWait, nil, withHooks(script, logPath, vmNetns(testNamespace, id), false))
		if err != nil {
			t.Fatalf("create: %v", err)
		}
		v.start(ctx, t)
		v.console.waitFor(ctx, t, markerBooted)
		killShim(ctx, t, v)
		var phases []string
		for _, c := range readHookLog(t, logPath) {
			phases = append(phases, c.phase)
		}
		// The delete action runs poststop from the record in the bundle.
		if got := strings.Join(phases, ","); got != "createRuntime,createContainer,startContainer,poststart,poststop" {
			t.Errorf("hooks ran %s, want every phase once, poststop by the delete action", got)
		}
	})

	t.Run("createRuntime fails", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
		defer cancel()
		logPath := filepath.Join(dir, "fail.log")
		id := uniqueID(t)
		v, err := createVM(ctx, t, id, imageKernelOff, nil, withHooks(script, logPath, vmNetns(testNamespace, id), true))
		if err == nil {
			t.Fatal("create succeeded with a failing createRuntime hook")
		}
		msg := err.Error()
		if !strings.Contains(msg, "createRuntime hook #0 ("+script+"): exit status 3: boom") || strings.Contains(msg, "\n") {
			t.Errorf("error %q does not name the hook, its status and its stderr on one line", msg)
		}
		v.remove(t)
		var phases []string
		for _, c := range readHookLog(t, logPath) {
			phases = append(phases, c.phase)
		}
		if got := strings.Join(phases, ","); got != "fail,poststop" {
			t.Errorf("hooks ran %s, want fail,poststop", got)
		}
		assertNothingLeft(ctx, t, id)
	})
}
