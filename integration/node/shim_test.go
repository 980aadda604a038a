package node

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/vmshim/vmshim/integration/node/nodeapi"
)

// checkShimInPod creates a CRI pod sandbox task (its pause process, no
// VM) whose cgroupsPath is inside a pod's cgroup, as containerd's CRI makes
// it from the pod's cgroup_parent, and checks that the shim runs in a
// cgroup of its own inside the pod's (a scope in the pod's slice under
// systemd), with the memory controller, alone there; and that deleting the
// task, which ends the shim, leaves no cgroup or scope of it. It returns a
// summary line.
func (n *node) checkShimInPod(ctx context.Context, t *testing.T, d driver) string {
	t.Helper()
	id := "pod-" + d.name
	var path, podDir, shimDir, unit string
	if d.systemd() {
		path = "vmshimpod-p1.slice:cri-containerd:" + id
		podDir = "/vmshimpod.slice/vmshimpod-p1.slice"
		unit = "vmshim-shim-" + id + ".scope"
		shimDir = podDir + "/" + unit
	} else {
		path = "/vmshimpod/p1/" + id
		podDir = "/vmshimpod/p1"
		shimDir = podDir + "/vmshim-shim-" + id
	}
	t.Cleanup(func() {
		// The pod's cgroup is the kubelet's to remove.
		if d.systemd() {
			_, _ = n.run(ctx, "systemctl stop vmshimpod.slice", nil)
		} else {
			_, _ = n.run(ctx, "rmdir /sys/fs/cgroup"+podDir+" /sys/fs/cgroup/vmshimpod", nil)
		}
	})
	var c nodeapi.Created
	n.nodectl(ctx, t, &c, "create", "-sandbox", "-id", id, "-cgroup", path)
	remove := n.remover(ctx, t, id)

	got := n.read(ctx, t, fmt.Sprintf("/proc/%d/cgroup", c.ShimPid))
	t.Logf("%s: sandbox cgroupsPath %s; shim pid %d, /proc/%d/cgroup: %s", d.name, path, c.ShimPid, c.ShimPid, got)
	if got != "0::"+shimDir {
		t.Errorf("%s: the shim's cgroup is %q, want %q (inside the pod's %s)", d.name, got, "0::"+shimDir, podDir)
	}
	procs := strings.Fields(n.read(ctx, t, "/sys/fs/cgroup"+shimDir+"/cgroup.procs"))
	if len(procs) != 1 || procs[0] != strconv.Itoa(c.ShimPid) {
		t.Errorf("%s: %s/cgroup.procs holds %v, want the shim (%d) alone", d.name, shimDir, procs, c.ShimPid)
	}
	controllers := n.read(ctx, t, "/sys/fs/cgroup"+shimDir+"/cgroup.controllers")
	current := n.read(ctx, t, "/sys/fs/cgroup"+shimDir+"/memory.current")
	podCurrent := n.read(ctx, t, "/sys/fs/cgroup"+podDir+"/memory.current")
	t.Logf("%s: %s: controllers %q, memory.current %s (the pod's %s); shim oom_score_adj %s", d.name, shimDir,
		controllers, current, podCurrent, n.read(ctx, t, fmt.Sprintf("/proc/%d/oom_score_adj", c.ShimPid)))
	if !strings.Contains(" "+controllers+" ", " memory ") {
		t.Errorf("%s: the shim's cgroup has no memory controller: %q", d.name, controllers)
	}
	if unit != "" {
		show := n.sh(ctx, t, "systemctl show -p ActiveState -p ControlGroup -p Slice -p CollectMode "+unit)
		t.Logf("%s: systemctl show %s:\n%s", d.name, unit, strings.TrimRight(show, "\n"))
		for _, want := range []string{"ActiveState=active", "ControlGroup=" + shimDir, "Slice=vmshimpod-p1.slice", "CollectMode=inactive-or-failed"} {
			if !strings.Contains(show, want+"\n") {
				t.Errorf("%s: scope %s: want %s", d.name, unit, want)
			}
		}
	}

	remove()
	// The shim removes its cgroup before it answers containerd's
	// Shutdown; then it exits.
	r, err := n.run(ctx, fmt.Sprintf("test ! -e /sys/fs/cgroup%s && for i in $(seq 300); do test -e /proc/%d || exit 0; sleep 0.1; done; exit 1", shimDir, c.ShimPid), nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.code != 0 {
		t.Errorf("%s: after delete, /sys/fs/cgroup%s or the shim (pid %d) is still there", d.name, shimDir, c.ShimPid)
	}
	status := "no unit"
	if unit != "" {
		r, err := n.run(ctx, "systemctl status --no-pager "+unit, nil)
		if err != nil {
			t.Fatal(err)
		}
		status = fmt.Sprintf("systemctl status exit %d", r.code)
		// 4: no such unit.
		if r.code != 4 {
			t.Errorf("%s: scope %s is still known to systemd after delete (exit %d): %s", d.name, unit, r.code, strings.TrimSpace(r.stdout+r.stderr))
		}
	}
	return fmt.Sprintf("%-8s shim    sandbox cgroupsPath %-40s -> shim in %s (memory.current %s), gone after delete (%s)",
		d.name, path, shimDir, current, status)
}
