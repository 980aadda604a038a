package shim

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/vmshim/vmshim/cgroup"
	"github.com/vmshim/vmshim/config"
	"github.com/vmshim/vmshim/launch"
)

func TestShimCgroupPath(t *testing.T) {
	sandbox := map[string]string{config.AnnotationContainerType: "sandbox"}
	for _, tc := range []struct {
		name   string
		annots map[string]string
		path   string
		noLin  bool
		want   string
		err    bool
	}{
		{name: "cgroupfs pod", annots: sandbox, path: "/kubepods/burstable/pod1/sb", want: "/kubepods/burstable/pod1/vmshim-shim-sb"},
		{name: "cgroupfs relative", annots: sandbox, path: "kubepods/pod1/sb", want: "/kubepods/pod1/vmshim-shim-sb"},
		{
			name: "systemd pod", annots: sandbox, path: "kubepods-burstable-pod1.slice:cri-containerd:sb",
			want: "kubepods-burstable-pod1.slice:vmshim-shim:sb",
		},
		{name: "below the root", annots: sandbox, path: "/sb"},
		{name: "root slice", annots: sandbox, path: "-.slice:cri-containerd:sb"},
		{name: "no cgroups path", annots: sandbox},
		{name: "no linux section", annots: sandbox, noLin: true},
		{name: "container, not sandbox", annots: map[string]string{config.AnnotationContainerType: "container"}, path: "/kubepods/pod1/c"},
		{name: "ctr task", path: "/default/c"},
		{name: "invalid", annots: sandbox, path: "a.slice:p", err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := &specs.Spec{Annotations: tc.annots}
			if !tc.noLin {
				spec.Linux = &specs.Linux{CgroupsPath: tc.path}
			}
			got, err := shimCgroupPath("sb", spec)
			if tc.err {
				if err == nil || !strings.Contains(err.Error(), tc.path) {
					t.Fatalf("got %q, %v; want an error naming %q", got, err, tc.path)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// TestShimOOMKilledTasks checks which VM the delete actions of a pod
// whose shim was OOM-killed report, from the sandbox's bundle and from
// the VM's record, and that nothing is reported when the shim was not.
func TestShimOOMKilledTasks(t *testing.T) {
	ctx, _ := testLogger(t)
	bundles := t.TempDir()
	sandbox, vmBundle := filepath.Join(bundles, "sb"), filepath.Join(bundles, "vm")
	for _, b := range []string{sandbox, vmBundle} {
		if err := os.Mkdir(b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	const raw = "/kubepods/pod1/vmshim-shim-sb"
	if err := os.WriteFile(filepath.Join(sandbox, cgroup.ShimFile), []byte(`{"cgroup":"`+raw+`"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := launch.OpenPod(sandbox); err != nil {
		t.Fatal(err)
	}
	if err := launch.ClaimPod(sandbox, "vm"); err != nil {
		t.Fatal(err)
	}
	vmRec := &launch.Record{ID: "vm", Bundle: vmBundle, Pod: sandbox}
	var n uint64
	kills := func(got string) uint64 {
		if got != raw {
			t.Errorf("kills read of cgroup %q, want %q", got, raw)
		}
		return n
	}
	check := func(what string, got []string, want ...string) {
		t.Helper()
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: reported %q, want %q", what, got, want)
		}
	}
	check("sandbox, no OOM kill", shimOOMKilledTasks(ctx, sandbox, "sb", nil, kills))
	check("vm, no OOM kill", shimOOMKilledTasks(ctx, vmBundle, "vm", vmRec, kills))

	n = 1
	check("sandbox", shimOOMKilledTasks(ctx, sandbox, "sb", nil, kills), "vm")
	check("vm", shimOOMKilledTasks(ctx, vmBundle, "vm", vmRec, kills), "vm")
	check("a task of no pod", shimOOMKilledTasks(ctx, vmBundle, "vm", &launch.Record{ID: "vm", Bundle: vmBundle}, kills))
	check("no record", shimOOMKilledTasks(ctx, vmBundle, "vm", nil, kills))

	// The VM released its claim first: the sandbox has no VM to report.
	if err := launch.ReleasePod(sandbox, "vm"); err != nil {
		t.Fatal(err)
	}
	check("sandbox after the VM's delete", shimOOMKilledTasks(ctx, sandbox, "sb", nil, kills))
	// The sandbox's delete removed the cgroup first: nothing left to read.
	if err := os.Remove(filepath.Join(sandbox, cgroup.ShimFile)); err != nil {
		t.Fatal(err)
	}
	check("vm after the sandbox's delete", shimOOMKilledTasks(ctx, vmBundle, "vm", vmRec, kills))
}
