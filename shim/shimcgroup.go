package shim

import (
	"context"
	"path/filepath"

	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/vmshim/vmshim/cgroup"
	"github.com/vmshim/vmshim/config"
	"github.com/vmshim/vmshim/launch"
)

// The shim of a CRI pod runs in a cgroup of its own inside the pod's (see
// cgroup.StartShim): <pod cgroup>/vmshim-shim-<sandbox id> under the
// cgroupfs driver, the scope vmshim-shim-<sandbox id>.scope in the pod's
// slice under systemd. A task that is no CRI sandbox (ctr, nerdctl) names
// no pod: its shim stays in containerd's cgroup, as containerd's runc
// shim does.

// shimCgroupPath returns the cgroupsPath of the cgroup the shim of the
// task id, whose spec is given, runs in: beside the sandbox's cgroup, in
// the pod's, for a CRI pod sandbox with a cgroup_parent; "" for anything
// else.
func shimCgroupPath(id string, spec *specs.Spec) (string, error) {
	if !config.IsSandbox(spec) || spec.Linux == nil || spec.Linux.CgroupsPath == "" {
		return "", nil
	}
	return cgroup.Sibling(spec.Linux.CgroupsPath, cgroup.ShimName, id)
}

// shimCgroups is this machine's cgroups as the shim's own cgroup needs
// them: a shim is the first process of its systemd scope, so none is
// made around a placeholder.
func shimCgroups() cgroup.Host { return cgroup.NewHost(nil) }

// shimOOMKilledTasks returns the tasks whose exit the delete action of
// task id (bundle, and its record when it has one) should report as an
// OOM kill: the pod's VM, when the pod's shim was OOM-killed in its
// cgroup, as kills (the count of the cgroup a cgroupsPath names) says.
// The sandbox's delete action names the VM the pod holds; the VM's own
// names itself. Each looks before it undoes its part (the sandbox's
// removes the cgroup, the VM's releases its claim on the pod), so
// whichever order containerd runs them in, one of them reports.
func shimOOMKilledTasks(ctx context.Context, bundle, id string, rec *launch.Record, kills func(raw string) uint64) []string {
	var pod, vm string
	raw, err := cgroup.ReadShim(bundle)
	switch {
	case err == nil && raw != "":
		v, err := launch.PodVM(bundle)
		if err != nil || v == "" {
			return nil
		}
		pod, vm = bundle, v
	case rec != nil && rec.Pod != "":
		pod, vm = rec.Pod, id
		if raw, err = cgroup.ReadShim(pod); err != nil || raw == "" {
			return nil
		}
	default:
		return nil
	}
	if kills(raw) == 0 {
		return nil
	}
	log.G(ctx).WithFields(log.Fields{"id": vm, "pod": filepath.Base(pod), "cgroup": raw}).Warn("the pod's shim was OOM-killed: its VM's exit is reported as an OOM kill")
	return []string{vm}
}
