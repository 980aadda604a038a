package shim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/containerd/cgroups/v3"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	sddbus "github.com/coreos/go-systemd/v22/dbus"
	godbus "github.com/godbus/dbus/v5"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// The shim of a CRI pod runs in a cgroup of its own inside the pod's
// cgroup (the sandbox's cgroup_parent), so that what a guest makes it
// allocate is charged to the pod, within the pod's memory limit, and not
// to containerd. A child, not the pod cgroup itself: cgroup v2 allows no
// process in a cgroup that has children with controllers, and on v1 a
// child keeps the shim apart from the pod's containers' cgroups.
//
// Under the cgroupfs driver it is <pod cgroup>/vmshim-shim-<sandbox id>;
// under systemd, the scope vmshim-shim-<sandbox id>.scope in the pod's
// slice. The start action makes it and starts the shim in it; the shim
// leaves and removes it when it shuts down; the delete action removes it
// after a crash (or an OOM kill), named by a file in the sandbox's bundle.
// A task that is no CRI sandbox (ctr, nerdctl) names no pod: its shim
// stays in containerd's cgroup, as containerd's runc shim does.

const (
	// shimCgroupFile is the file in a pod sandbox's bundle naming the
	// shim's cgroup, written before the cgroup is made.
	shimCgroupFile = "vmshim-shim.json"
	// shimCgroupName prefixes the shim's cgroup (cgroupfs) or scope
	// (systemd) inside the pod's.
	shimCgroupName = "vmshim-shim"
)

// shimCgroupRecord is what shimCgroupFile holds.
type shimCgroupRecord struct {
	Cgroup string `json:"cgroup"` // an OCI cgroupsPath
}

// shimCgroupPath returns the cgroupsPath of the cgroup the shim of the
// task id, whose spec is given, runs in: a child of the pod's cgroup for
// a CRI pod sandbox with a cgroup_parent, "" for anything else.
func shimCgroupPath(id string, spec *specs.Spec) (string, error) {
	if !isSandbox(spec) || spec.Linux == nil || spec.Linux.CgroupsPath == "" {
		return "", nil
	}
	p, err := parseCgroupPath(spec.Linux.CgroupsPath)
	if err != nil {
		return "", err
	}
	var raw string
	switch {
	case p.unit != "" && p.slice == "-.slice":
		return "", nil // the root slice is no pod's
	case p.unit != "":
		raw = p.slice + ":" + shimCgroupName + ":" + id
	case path.Dir(p.dir) == "/":
		return "", nil // a cgroup right below the root has no pod above it
	default:
		raw = path.Join(path.Dir(p.dir), shimCgroupName+"-"+id)
	}
	if _, err := parseCgroupPath(raw); err != nil {
		return "", err
	}
	return raw, nil
}

// shimCgroup is the cgroup a new shim process is started in.
type shimCgroup struct {
	host   cgroupHost
	bundle string // where shimCgroupFile is
	cg     taskCgroup
}

// newShimCgroup notes raw in the bundle and makes the cgroup.
func newShimCgroup(ctx context.Context, h cgroupHost, bundle, raw string) (_ *shimCgroup, retErr error) {
	data, err := json.Marshal(shimCgroupRecord{Cgroup: raw})
	if err != nil {
		return nil, err
	}
	file := filepath.Join(bundle, shimCgroupFile)
	if err := os.WriteFile(file, data, 0o600); err != nil {
		return nil, fmt.Errorf("note the shim's cgroup: %w", err)
	}
	defer func() {
		if retErr != nil {
			_ = os.Remove(file)
		}
	}()
	// No limit: the pod's apply. The memory controller is named so that
	// on v2 the cgroup gets one of its own, which counts OOM kills.
	cg, err := h.create(ctx, raw, &specs.LinuxResources{Memory: &specs.LinuxMemory{}})
	if err != nil {
		return nil, err
	}
	if sc, ok := cg.(*scopeCgroup); ok {
		// systemd forgets the scope once the shim is gone, even after
		// a failure such as an OOM kill: nothing stays listed.
		sc.extra = []sddbus.Property{{Name: "CollectMode", Value: godbus.MakeVariant("inactive-or-failed")}}
	}
	return &shimCgroup{host: h, bundle: bundle, cg: cg}, nil
}

// start starts cmd in the cgroup: forked into it under cgroupfs, so that
// its first page is charged there; under systemd, started and then made
// the scope's process (a scope is made around a running process, and
// goes once its last process has).
func (s *shimCgroup) start(cmd *exec.Cmd) error {
	if _, scope := s.cg.(*scopeCgroup); !scope {
		return s.cg.Start(cmd)
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	if err := s.cg.Add(cmd.Process.Pid); err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return err
	}
	return nil
}

// remove undoes newShimCgroup, once no process is left in the cgroup.
func (s *shimCgroup) remove() error {
	err := s.cg.Delete()
	if rmErr := os.Remove(filepath.Join(s.bundle, shimCgroupFile)); rmErr != nil && !errors.Is(rmErr, fs.ErrNotExist) {
		err = errors.Join(err, rmErr)
	}
	return err
}

// readShimCgroup returns the cgroup shimCgroupFile in bundle names, ""
// when there is none.
func readShimCgroup(bundle string) (string, error) {
	data, err := os.ReadFile(filepath.Join(bundle, shimCgroupFile))
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read the shim's cgroup: %w", err)
	}
	var rec shimCgroupRecord
	if err := json.Unmarshal(data, &rec); err != nil {
		return "", fmt.Errorf("parse %s: %w", shimCgroupFile, err)
	}
	if _, err := parseCgroupPath(rec.Cgroup); err != nil {
		return "", fmt.Errorf("%s: %w", shimCgroupFile, err)
	}
	return rec.Cgroup, nil
}

// leaveShimCgroup moves the calling shim to the root cgroup and removes
// the cgroup raw, the shim's own, as the shim shuts down: a cgroup holding
// a process cannot be removed, and nothing else would remove it after the
// shim exits. (The memory the shim used stays charged to the pod until it
// is freed, as the kernel moves the charge to the parent.)
func leaveShimCgroup(ctx context.Context, h cgroupHost, raw string) error {
	if err := h.moveToRoot(os.Getpid()); err != nil {
		return err
	}
	return removeShimCgroupAt(ctx, h, raw)
}

// removeShimCgroupAt removes the shim's cgroup raw, if it is there, and
// reports it when the shim was OOM-killed in it.
func removeShimCgroupAt(ctx context.Context, h cgroupHost, raw string) error {
	cg, err := h.load(ctx, raw)
	if errdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if n := oomKillCount(cg.MemoryDir()); n > 0 {
		log.G(ctx).WithField("cgroup", raw).Warnf("the pod's shim was OOM-killed (%d kills in its cgroup): the pod's memory limit, less its containers', did not cover it", n)
	}
	return cg.Delete()
}

// removeShimCgroup is the delete action's part: it removes the cgroup
// the bundle's shimCgroupFile names, and the file.
func removeShimCgroup(ctx context.Context, h cgroupHost, bundle string) error {
	raw, err := readShimCgroup(bundle)
	if err != nil || raw == "" {
		return err
	}
	if err := removeShimCgroupAt(ctx, h, raw); err != nil {
		return err
	}
	if err := os.Remove(filepath.Join(bundle, shimCgroupFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// oomKillCount reads how many processes of the memory cgroup at dir the
// OOM killer ended (memory.events on v2, memory.oom_control on v1); 0
// when it cannot tell.
func oomKillCount(dir string) uint64 {
	if dir == "" {
		return 0
	}
	for _, name := range []string{"memory.events", "memory.oom_control"} {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n") {
			if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
				n, _ := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
				return n
			}
		}
	}
	return 0
}

// moveToRoot moves process pid, all its threads, to the root cgroup of
// every hierarchy the host's cgroups use.
func (h cgroupHost) moveToRoot(pid int) error {
	var dirs []string
	switch h.mode() {
	case cgroups.Unified:
		dirs = []string{h.root}
	case cgroups.Legacy, cgroups.Hybrid:
		subs, err := h.v1Subsystems()
		if err != nil {
			return err
		}
		for _, s := range subs {
			dirs = append(dirs, s.(pather).Path("/"))
		}
	default:
		return fmt.Errorf("move pid %d to the root cgroup: no cgroup hierarchy is mounted: %w", pid, errdefs.ErrFailedPrecondition)
	}
	for _, dir := range dirs {
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
			return fmt.Errorf("move pid %d to the root cgroup: %w", pid, err)
		}
	}
	return nil
}

// raiseOOMScoreAdj raises the oom_score_adj of pid to the spec's, when
// the spec has one above it; it never lowers it (which needs
// CAP_SYS_RESOURCE). The shim of a pod raises its own to each of its
// tasks' so that the node's OOM killer does not spare it over its pod.
func raiseOOMScoreAdj(pid int, spec *specs.Spec) error {
	if spec.Process == nil || spec.Process.OOMScoreAdj == nil {
		return nil
	}
	file := fmt.Sprintf("/proc/%d/oom_score_adj", pid)
	data, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("read oom_score_adj of pid %d: %w", pid, err)
	}
	current, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		return fmt.Errorf("read oom_score_adj of pid %d: %w", pid, err)
	}
	want := *spec.Process.OOMScoreAdj
	if want <= current {
		return nil
	}
	if err := os.WriteFile(file, []byte(strconv.Itoa(want)), 0); err != nil {
		return fmt.Errorf("raise oom_score_adj of pid %d from %d to %d: %w", pid, current, want, err)
	}
	return nil
}

// shimOOMKilledTasks returns the tasks whose exit the delete action of
// task id (bundle, and its record when it has one) should report as an
// OOM kill: the pod's VM, when the pod's shim was OOM-killed in its
// cgroup. The sandbox's delete action names the VM the pod state holds;
// the VM's own names itself. Each looks before it undoes its part (the
// sandbox's removes the cgroup, the VM's releases its claim on the pod),
// so whichever order containerd runs them in, one of them reports.
func shimOOMKilledTasks(ctx context.Context, h cgroupHost, bundle, id string, rec *record) []string {
	var pod, vm string
	raw, err := readShimCgroup(bundle)
	switch {
	case err == nil && raw != "":
		st, ok, err := readPodState(bundle)
		if err != nil || !ok || st.VM == "" {
			return nil
		}
		pod, vm = bundle, st.VM
	case rec != nil && rec.Pod != "":
		pod, vm = rec.Pod, id
		if raw, err = readShimCgroup(pod); err != nil || raw == "" {
			return nil
		}
	default:
		return nil
	}
	cg, err := h.load(ctx, raw)
	if err != nil {
		return nil
	}
	if n := oomKillCount(cg.MemoryDir()); n == 0 {
		return nil
	}
	log.G(ctx).WithFields(log.Fields{"id": vm, "pod": filepath.Base(pod), "cgroup": raw}).Warn("the pod's shim was OOM-killed: its VM's exit is reported as an OOM kill")
	return []string{vm}
}
