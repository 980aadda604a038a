package cgroup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
)

// The shim of a CRI pod runs in a cgroup of its own inside the pod's
// cgroup (see Sibling), so that what a guest makes it allocate is charged
// to the pod, within the pod's memory limit, and not to containerd. A
// child, not the pod cgroup itself: cgroup v2 allows no process in a
// cgroup that has children with controllers, and on v1 a child keeps the
// shim apart from the pod's containers' cgroups.
//
// The start action makes it and starts the shim in it (StartShim); the
// shim leaves and removes it when it shuts down (LeaveShim); the delete
// action removes it after a crash or an OOM kill (RemoveShim), named by
// ShimFile in the sandbox's bundle.
const (
	// ShimFile is the file in a pod sandbox's bundle naming the shim's
	// cgroup, written before the cgroup is made.
	ShimFile = "vmshim-shim.json"
	// ShimName prefixes the shim's cgroup (cgroupfs) or scope (systemd)
	// inside the pod's.
	ShimName = "vmshim-shim"
)

// shimRecord is what ShimFile holds.
type shimRecord struct {
	Cgroup string `json:"cgroup"` // an OCI cgroupsPath
}

// StartShim notes raw in bundle's ShimFile, makes the cgroup and starts
// cmd, the shim, in it (see Enter). On failure neither the file nor the
// cgroup is left, and cmd is not running.
func (h Host) StartShim(ctx context.Context, bundle, raw string, cmd *exec.Cmd) error {
	if err := noteShim(bundle, raw); err != nil {
		return err
	}
	if _, err := h.Enter(ctx, raw, cmd); err != nil {
		_ = os.Remove(filepath.Join(bundle, ShimFile))
		return err
	}
	return nil
}

// noteShim writes bundle's ShimFile, naming raw.
func noteShim(bundle, raw string) error {
	data, err := json.Marshal(shimRecord{Cgroup: raw})
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(bundle, ShimFile), data, 0o600); err != nil {
		return fmt.Errorf("note the shim's cgroup: %w", err)
	}
	return nil
}

// ReadShim returns the cgroup ShimFile in bundle names, "" when there is
// none.
func ReadShim(bundle string) (string, error) {
	data, err := os.ReadFile(filepath.Join(bundle, ShimFile))
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read the shim's cgroup: %w", err)
	}
	var rec shimRecord
	if err := json.Unmarshal(data, &rec); err != nil {
		return "", fmt.Errorf("parse %s: %w", ShimFile, err)
	}
	if _, err := parsePath(rec.Cgroup); err != nil {
		return "", fmt.Errorf("%s: %w", ShimFile, err)
	}
	return rec.Cgroup, nil
}

// LeaveShim moves the calling shim to the root cgroup and removes the
// cgroup raw, the shim's own, as the shim shuts down: a cgroup holding a
// process cannot be removed, and nothing else would remove it after the
// shim exits. (The memory the shim used stays charged to the pod until
// it is freed, as the kernel moves the charge to the parent.)
func (h Host) LeaveShim(ctx context.Context, raw string) error {
	if err := h.MoveToRoot(os.Getpid()); err != nil {
		return err
	}
	return h.removeShimAt(ctx, raw)
}

// removeShimAt removes the shim's cgroup raw, if it is there, and says
// so when the shim was OOM-killed in it.
func (h Host) removeShimAt(ctx context.Context, raw string) error {
	cg, err := h.Load(ctx, raw)
	if errdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if n := OOMKillCount(cg.MemoryDir()); n > 0 {
		log.G(ctx).WithField("cgroup", raw).Warnf("the pod's shim was OOM-killed (%d kills in its cgroup): the pod's memory limit, less its containers', did not cover it", n)
	}
	return cg.Delete()
}

// RemoveShim is the delete action's part: it removes the cgroup the
// bundle's ShimFile names, and the file.
func (h Host) RemoveShim(ctx context.Context, bundle string) error {
	raw, err := ReadShim(bundle)
	if err != nil || raw == "" {
		return err
	}
	if err := h.removeShimAt(ctx, raw); err != nil {
		return err
	}
	if err := os.Remove(filepath.Join(bundle, ShimFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// OOMKills is how many processes the OOM killer ended in the cgroup raw
// names (see OOMKillCount); 0 when it is not there.
func (h Host) OOMKills(ctx context.Context, raw string) uint64 {
	cg, err := h.Load(ctx, raw)
	if err != nil {
		return 0
	}
	return OOMKillCount(cg.MemoryDir())
}
