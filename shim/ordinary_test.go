package shim

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/vmshim/vmshim/runcshim"
	"github.com/vmshim/vmshim/runcshim/runcshimtest"
)

func TestMain(m *testing.M) { runcshimtest.Main(m) }

// TestServiceOrdinary checks that a container Classify finds ordinary is
// created by the pod's runc shim, started the way containerd starts a
// shim, that its calls are forwarded there and its events left to it,
// that a VM beside it is the service's own, and that the runc shim is
// asked to end with the service.
func TestServiceOrdinary(t *testing.T) {
	fake, addr := runcshimtest.Serve(t)
	bin, _ := runcshimtest.Setup(t, "ok", addr)
	s, l, p, _ := newService(t)
	s.ordinary = newOrdinaryTasks(runcshim.Config{SocketDir: t.TempDir()})
	l.mu.Lock()
	l.ordinary, l.runcShim = map[string]bool{"side": true, "dbg": true}, bin
	l.mu.Unlock()
	base, _ := testLogger(t)
	ctx := namespaces.WithNamespace(base, "test")

	bundle := t.TempDir()
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	resp, err := s.Create(ctx, &taskAPI.CreateTaskRequest{ID: "side", Bundle: bundle})
	if err != nil || resp.Pid != 99 {
		t.Fatalf("create: %v, %v", resp, err)
	}
	if rec, err := runcshim.ReadRecord(bundle); err != nil || rec == nil || rec.ID != "side" || rec.Address != addr {
		t.Fatalf("runc record %+v, %v", rec, err)
	}
	if st, err := s.State(ctx, &taskAPI.StateRequest{ID: "side"}); err != nil || st.Pid != 99 {
		t.Fatalf("state: %v, %v", st, err)
	}
	if evs := p.all(); len(evs) != 0 {
		t.Errorf("the VM shim published %d events for an ordinary container; the runc shim publishes them", len(evs))
	}

	// A VM beside it is the service's.
	vmReq := &taskAPI.CreateTaskRequest{ID: "vm1", Bundle: t.TempDir()}
	create(t, s, p, vmReq)
	if !slices.Contains(fake.Calls(), "create side") || slices.Contains(fake.Calls(), "create vm1") {
		t.Errorf("runc shim calls %q: want the ordinary container's create only", fake.Calls())
	}

	// An ephemeral container may not join the VM's PID namespace.
	vmPid := l.vm(t, "vm1").pid
	dbg := t.TempDir()
	spec, _ := json.Marshal(&specs.Spec{Linux: &specs.Linux{Namespaces: []specs.LinuxNamespace{
		{Type: specs.PIDNamespace, Path: fmt.Sprintf("/proc/%d/ns/pid", vmPid)},
	}}})
	if err := os.WriteFile(filepath.Join(dbg, "config.json"), spec, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = s.Create(ctx, &taskAPI.CreateTaskRequest{ID: "dbg", Bundle: dbg})
	if err == nil || !strings.Contains(err.Error(), "container vm1 runs a VM, whose processes are the guest's and cannot be shared") || strings.Contains(err.Error(), "\n") {
		t.Errorf("debug container targeting the VM: %v", err)
	}
	if slices.Contains(fake.Calls(), "create dbg") {
		t.Error("the refused debug container reached the runc shim")
	}

	if _, err := s.Delete(ctx, &taskAPI.DeleteRequest{ID: "side"}); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if rec, err := runcshim.ReadRecord(bundle); rec != nil || err != nil {
		t.Errorf("runc record left after delete: %v, %v", rec, err)
	}
	if _, err := s.State(ctx, &taskAPI.StateRequest{ID: "side"}); err == nil {
		t.Error("state of a deleted ordinary container succeeded")
	}
	if _, err := s.Delete(ctx, &taskAPI.DeleteRequest{ID: "vm1"}); err != nil {
		t.Fatalf("delete vm1: %v", err)
	}
	if _, err := s.Shutdown(ctx, &taskAPI.ShutdownRequest{}); err != nil {
		t.Fatal(err)
	}
	if calls := fake.Calls(); calls[len(calls)-1] != "shutdown" {
		t.Errorf("runc shim calls %q: want it asked to end last", calls)
	}
}
