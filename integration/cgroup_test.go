package integration

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// cgroupRoot is where cgroup v1 hierarchies are mounted (these machines
// are v1 hybrid: one directory per controller, plus unified and systemd).
const cgroupRoot = "/sys/fs/cgroup"

// podCgroupBase holds the pod cgroups of the tests, as /kubepods does the
// kubelet's.
const podCgroupBase = "/vmshim-it"

// podCgroup is a pod's cgroup parent, which the kubelet would manage.
type podCgroup struct {
	path string // e.g. /vmshim-it/pod<uid>
}

// newPodCgroup makes the pod cgroup, with a memory limit when memLimit > 0
// (otherwise the runtime creates its directories as it needs them).
func newPodCgroup(t *testing.T, name string, memLimit int64) *podCgroup {
	t.Helper()
	pc := &podCgroup{path: podCgroupBase + "/" + name}
	if memLimit > 0 {
		dir := filepath.Join(cgroupRoot, "memory", pc.path)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatalf("pod cgroup: %v", err)
		}
		if err := os.WriteFile(filepath.Join(dir, "memory.limit_in_bytes"), []byte(strconv.FormatInt(memLimit, 10)), 0); err != nil {
			t.Fatalf("pod cgroup memory limit: %v", err)
		}
	}
	return pc
}

// file is a control file of a cgroup below the pod's (sub "" for the
// pod's own) in a controller's hierarchy.
func (pc *podCgroup) file(controller, sub, name string) string {
	return filepath.Join(cgroupRoot, controller, pc.path, sub, name)
}

// readInt reads a control file holding one number.
func (pc *podCgroup) readInt(t *testing.T, controller, sub, name string) int64 {
	t.Helper()
	b, err := os.ReadFile(pc.file(controller, sub, name))
	if err != nil {
		t.Fatalf("cgroup: %v", err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatalf("cgroup %s: %v", name, err)
	}
	return n
}

// remove checks that the runtime left no cgroup inside the pod's and
// removes the pod cgroup from every hierarchy.
func (pc *podCgroup) remove(t *testing.T) {
	dirs, _ := filepath.Glob(filepath.Join(cgroupRoot, "*", pc.path))
	for _, dir := range dirs {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if e.IsDir() {
				t.Errorf("cgroup left behind: %s", filepath.Join(dir, e.Name()))
				_ = os.Remove(filepath.Join(dir, e.Name()))
			}
		}
		if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Errorf("remove pod cgroup: %v", err)
		}
	}
}

// cgroupOf returns the path of pid's cgroup in a v1 controller's hierarchy.
func cgroupOf(t *testing.T, pid int, controller string) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		t.Fatalf("cgroup of %d: %v", pid, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c == controller {
				return parts[2]
			}
		}
	}
	t.Fatalf("pid %d has no %s cgroup: %s", pid, controller, b)
	return ""
}

// removeCgroupParents removes the given cgroups from every hierarchy once
// they are empty; a cgroup still holding children stays (and the tests
// that left them fail on their own).
func removeCgroupParents(paths ...string) {
	for _, p := range paths {
		dirs, _ := filepath.Glob(filepath.Join(cgroupRoot, "*", p))
		for _, dir := range dirs {
			_ = os.Remove(dir)
		}
	}
}
