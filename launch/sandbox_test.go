package launch

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/vmshim/vmshim/jail"
)

// TestSandboxPauseID checks that each sandbox's pause process waits as a
// jail id of its own, not nobody's, with no groups and no_new_privs, and
// that the id is given back when the sandbox is released, and by the
// delete action's release from the record after a crash.
func TestSandboxPauseID(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("claiming an id in " + idsDir + " and dropping to it needs root")
	}
	ctx, logs := testLogger(t)
	removeIfMade(t, runtimeRoot)
	removeIfMade(t, idsDir)
	ids := jail.IDRange{First: 2100100, Last: 2100199}
	var sandboxes []*sandboxVM
	var claims []string
	seen := map[string]bool{}
	for i := range 2 {
		bundle := t.TempDir()
		owner := fmt.Sprintf("vmshim-test/%s-%d-%d", t.Name(), os.Getpid(), i)
		s, err := launchSandbox(ctx, &Request{ID: fmt.Sprintf("sb%d", i), Bundle: bundle}, &specs.Spec{}, podNamespaces{}, ids, owner)
		if err != nil {
			t.Fatal(err)
		}
		sandboxes = append(sandboxes, s)
		t.Cleanup(func() { _ = s.Kill(); <-s.Done(); _ = s.Release(ctx) })
		id := strconv.FormatUint(uint64(s.rec.JailID), 10)
		claims = append(claims, filepath.Join(idsDir, id))
		if data, err := os.ReadFile(claims[i]); err != nil || string(data) != owner {
			t.Errorf("sandbox %d: claim on id %s: %q, %v; want %s's", i, id, data, err, owner)
		}
		// The process drops its ids once it runs: wait for that (or
		// its exit), then look.
		st := pauseStatus(t, s.Pid())
		for deadline := time.Now().Add(10 * time.Second); st["Uid"] == "0 0 0 0" && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
			st = pauseStatus(t, s.Pid())
		}
		all := strings.Join([]string{id, id, id, id}, " ")
		for k, want := range map[string]string{"Uid": all, "Gid": all, "Groups": "", "NoNewPrivs": "1", "CapEff": "0000000000000000"} {
			if st[k] != want {
				t.Errorf("sandbox %d: pause process %s %q, want %q", i, k, st[k], want)
			}
		}
		if id == "65534" || seen[id] {
			t.Errorf("sandbox %d: pause process runs as %s, which another process has", i, id)
		}
		seen[id] = true
	}
	// Released: the process is gone, and the id is free.
	s := sandboxes[0]
	if err := s.Kill(); err != nil {
		t.Fatal(err)
	}
	<-s.Done()
	if err := s.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(claims[0]); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("claim %s still there after release (%v)", claims[0], err)
	}
	// A shim that died: the delete action rebuilds the record from the
	// bundle, stops the pause process and gives its id back.
	s = sandboxes[1]
	rec, err := ReadRecord(s.rec.Bundle)
	if err != nil {
		t.Fatal(err)
	}
	if err := rec.Release(ctx); err != nil {
		t.Fatal(err)
	}
	<-s.Done()
	if _, err := os.Lstat(claims[1]); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("claim %s still there after the delete action's release (%v)", claims[1], err)
	}
	if err := syscall.Kill(s.Pid(), 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("pause process %d still there after the delete action: %v", s.Pid(), err)
	}
	if w := logs.Warnings(); len(w) != 0 {
		t.Errorf("release warned: %q", w)
	}
}

// pauseStatus reads /proc/PID/status into a map of trimmed fields.
func pauseStatus(t *testing.T, pid int) map[string]string {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
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
