package cgroup

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/containerd/cgroups/v3"
	"github.com/containerd/errdefs"
	sddbus "github.com/coreos/go-systemd/v22/dbus"
	godbus "github.com/godbus/dbus/v5"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Check reports whether raw is an OCI cgroupsPath this package can use.
func Check(raw string) error {
	_, err := parsePath(raw)
	return err
}

// Sibling is the cgroupsPath of the cgroup called name beside the one raw
// names, in its parent: under systemd, the scope slice:name:id of raw's
// slice, where id is given; under cgroupfs, <parent of raw>/name-id. ""
// when raw has no parent that is not the root's.
func Sibling(raw, name, id string) (string, error) {
	p, err := parsePath(raw)
	if err != nil {
		return "", err
	}
	var out string
	switch {
	case p.unit != "" && p.slice == "-.slice":
		return "", nil // the root slice is nobody's parent
	case p.unit != "":
		out = p.slice + ":" + name + ":" + id
	case path.Dir(p.dir) == "/":
		return "", nil // a cgroup right below the root has no parent of its own
	default:
		out = path.Join(path.Dir(p.dir), name+"-"+id)
	}
	if _, err := parsePath(out); err != nil {
		return "", err
	}
	return out, nil
}

// Enter makes the cgroup raw, with no limit of its own, and starts cmd
// in it: forked into it under cgroupfs, so that its first page is charged
// there; under systemd, started and then made the process of a new scope,
// which systemd forgets once cmd is gone, whatever its end (an OOM kill
// included). The memory controller is named so that on v2 the cgroup
// gets one of its own, which counts OOM kills. On failure cmd is not
// running and the cgroup is gone.
func (h Host) Enter(ctx context.Context, raw string, cmd *exec.Cmd) (Cgroup, error) {
	cg, err := h.Create(ctx, raw, &specs.LinuxResources{Memory: &specs.LinuxMemory{}})
	if err != nil {
		return nil, err
	}
	sc, scope := cg.(*scopeCgroup)
	if !scope {
		err = cg.Start(cmd)
	} else {
		sc.extra = []sddbus.Property{{Name: "CollectMode", Value: godbus.MakeVariant("inactive-or-failed")}}
		if err = cmd.Start(); err == nil {
			err = cg.Add(cmd.Process.Pid)
		}
	}
	if err != nil {
		if cmd.Process != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		return nil, errors.Join(err, cg.Delete())
	}
	return cg, nil
}

// MoveToRoot moves process pid, all its threads, to the root cgroup of
// every hierarchy the host's cgroups use.
func (h Host) MoveToRoot(pid int) error {
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

// OOMKillCount reads how many processes of the memory cgroup at dir (see
// Cgroup.MemoryDir) the OOM killer ended: memory.events on v2,
// memory.oom_control on v1. It is 0 when it cannot tell.
func OOMKillCount(dir string) uint64 {
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
