package runcshim

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bootapi "github.com/containerd/containerd/api/runtime/bootstrap/v1"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/vmshim/vmshim/runcshim/runcshimtest"
)

// testBundle writes a bundle whose spec has the cgroups path given.
func testBundle(t *testing.T, cgroupsPath string) string {
	t.Helper()
	dir := t.TempDir()
	b, err := json.Marshal(&specs.Spec{Linux: &specs.Linux{CgroupsPath: cgroupsPath}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestMain(m *testing.M) { runcshimtest.Main(m) }

// fakeConfig is a Config whose runc shim is the test binary playing mode.
func fakeConfig(t *testing.T, mode, addr string) (Config, string) {
	t.Helper()
	self, params := runcshimtest.Setup(t, mode, addr)
	return Config{
		Binary: self, Runc: "/usr/sbin/runc", Address: "/run/c.sock", TTRPCAddress: "/run/c.sock.ttrpc",
		Containerd: "/usr/bin/containerd", SocketDir: filepath.Join(t.TempDir(), "sockets"),
	}, params
}

// TestStartCreate starts the runc shim as containerd would, checks what
// it was told, and has it create a container with the runc options the
// spec's cgroups path calls for.
func TestStartCreate(t *testing.T) {
	for _, tc := range []struct {
		name, cgroups string
		systemd       bool
	}{
		{"cgroupfs", "/kubepods/pod1/c1", false},
		{"systemd", "kubepods-pod1.slice:cri-containerd:c1", true},
		{"none", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake, addr := runcshimtest.Serve(t)
			cfg, paramsFile := fakeConfig(t, "ok", addr)
			bundle := testBundle(t, tc.cgroups)
			ctx := context.Background()
			s, err := Start(ctx, cfg, "k8s.io", "c1", bundle)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if s.Address() != addr {
				t.Errorf("address %q, want %q", s.Address(), addr)
			}
			raw, err := os.ReadFile(paramsFile)
			if err != nil {
				t.Fatal(err)
			}
			var p bootapi.BootstrapParams
			if err := proto.Unmarshal(raw, &p); err != nil {
				t.Fatal(err)
			}
			if p.GetInstanceID() != "c1" || p.GetNamespace() != "k8s.io" || p.GetSocketDir() != cfg.SocketDir ||
				p.GetContainerdTtrpcAddress() != cfg.TTRPCAddress || p.GetContainerdGrpcAddress() != cfg.Address {
				t.Errorf("bootstrap params %v", &p)
			}
			var o options.Options
			if found, err := p.FindExtension(&o); err != nil || !found || o.SystemdCgroup != tc.systemd || o.BinaryName != cfg.Runc {
				t.Errorf("runc options in the params: %v (found %v, %v), want systemd %v", &o, found, err, tc.systemd)
			}
			args, _ := os.ReadFile(paramsFile + ".args")
			for _, want := range []string{`"-namespace","k8s.io"`, `"-id","c1"`, `"-address","/run/c.sock"`, `"start"`} {
				if !strings.Contains(string(args), want) {
					t.Errorf("args %s lack %s", args, want)
				}
			}
			cr, err := cfg.CreateRequest(&taskAPI.CreateTaskRequest{ID: "c1", Bundle: bundle})
			if err != nil {
				t.Fatal(err)
			}
			if resp, err := s.Task().Create(ctx, cr); err != nil || resp.Pid != 99 {
				t.Fatalf("create: %v, %v", resp, err)
			}
			if fake.Options() == nil || fake.Options().SystemdCgroup != tc.systemd {
				t.Errorf("create's runc options %v, want systemd %v", fake.Options(), tc.systemd)
			}
		})
	}
}

// TestStartFails checks that a runc shim that fails or answers nonsense
// gives a one-line error that says so.
func TestStartFails(t *testing.T) {
	for mode, want := range map[string]string{"fail": "runtime exploded", "garbage": "unreadable answer"} {
		t.Run(mode, func(t *testing.T) {
			cfg, _ := fakeConfig(t, mode, "")
			_, err := Start(context.Background(), cfg, "k8s.io", "c1", testBundle(t, ""))
			if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("err %v, want one line with %q", err, want)
			}
		})
	}
	cfg := Config{Binary: "no-such-runc-shim", Containerd: "/nonexistent/containerd"}
	if _, err := Start(context.Background(), cfg, "k8s.io", "c1", testBundle(t, "")); err == nil || !strings.Contains(err.Error(), "config runc_shim") {
		t.Fatalf("missing binary: %v", err)
	}
}

// TestCleanup checks the delete action's part: a runc shim that still
// serves deletes the container and is asked to end; one that is gone is
// replaced by its binary's delete action. Either way the record goes.
func TestCleanup(t *testing.T) {
	ctx := context.Background()
	t.Run("live", func(t *testing.T) {
		fake, addr := runcshimtest.Serve(t)
		cfg, _ := fakeConfig(t, "ok", addr)
		bundle := testBundle(t, "")
		rec := Record{ID: "c1", Address: addr}
		if err := WriteRecord(bundle, rec); err != nil {
			t.Fatal(err)
		}
		got, err := ReadRecord(bundle)
		if err != nil || got == nil || *got != rec {
			t.Fatalf("record %v, %v", got, err)
		}
		resp, err := Cleanup(ctx, cfg, "k8s.io", bundle, got)
		if err != nil || resp.Pid != 7 {
			t.Fatalf("cleanup: %v, %v", resp, err)
		}
		if calls := strings.Join(fake.Calls(), ","); calls != "kill c1,wait c1,delete c1,shutdown" {
			t.Errorf("calls %s", calls)
		}
		if r, err := ReadRecord(bundle); r != nil || err != nil {
			t.Errorf("record left: %v, %v", r, err)
		}
	})
	t.Run("gone", func(t *testing.T) {
		cfg, _ := fakeConfig(t, "ok", "")
		bundle := testBundle(t, "")
		rec := &Record{ID: "c1", Address: "unix://" + filepath.Join(t.TempDir(), "gone")}
		if err := WriteRecord(bundle, *rec); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		resp, err := Cleanup(ctx, cfg, "k8s.io", bundle, rec)
		if err != nil || resp.Pid != 42 || resp.ExitStatus != 137 {
			t.Fatalf("cleanup: %v, %v", resp, err)
		}
		if r, err := ReadRecord(bundle); r != nil || err != nil {
			t.Errorf("record left: %v, %v", r, err)
		}
	})
	t.Run("corrupt record", func(t *testing.T) {
		bundle := t.TempDir()
		if err := os.WriteFile(filepath.Join(bundle, RecordFile), []byte("{"), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadRecord(bundle); err == nil || errors.Is(err, os.ErrNotExist) {
			t.Errorf("corrupt record read: %v", err)
		}
	})
}

// TestPodShimDied: the pod's runc shim is started once and kept; once it
// dies, the next container starts it again, and a call through the dead
// one fails rather than hangs.
func TestPodShimDied(t *testing.T) {
	ctx := namespaces.WithNamespace(context.Background(), "k8s.io")
	first, addr1 := runcshimtest.Serve(t)
	cfg, _ := fakeConfig(t, "ok", addr1)
	p := NewPod(cfg)
	defer p.Shutdown(ctx)
	bundle := testBundle(t, "")
	s1, err := p.Get(ctx, "c1", bundle)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := p.Get(ctx, "c2", bundle); err != nil || again != s1 {
		t.Fatalf("second Get: %p, %v; want the running shim %p", again, err, s1)
	}

	first.Stop()
	if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return s1.Gone(), nil
	}); err != nil {
		t.Fatalf("the connection to a stopped runc shim never closed: %v", err)
	}
	if _, err := s1.Task().State(ctx, &taskAPI.StateRequest{ID: "c1"}); err == nil {
		t.Errorf("a call through the dead runc shim succeeded")
	}

	second, addr2 := runcshimtest.Serve(t)
	t.Setenv(runcshimtest.AddrEnv, addr2)
	s2, err := p.Get(ctx, "c3", bundle)
	if err != nil {
		t.Fatal(err)
	}
	if s2 == s1 || s2.Address() != addr2 {
		t.Fatalf("Get after the runc shim died: %p at %s, want a new one at %s", s2, s2.Address(), addr2)
	}
	if _, err := s2.Task().State(ctx, &taskAPI.StateRequest{ID: "c3"}); err != nil {
		t.Fatal(err)
	}
	if calls := second.Calls(); len(calls) != 1 || calls[0] != "state c3" {
		t.Errorf("the new runc shim's calls: %q", calls)
	}
}
