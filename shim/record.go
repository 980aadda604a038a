package shim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/vmshim/vmshim/image"
	"github.com/vmshim/vmshim/jail"
	"github.com/vmshim/vmshim/network"
)

// recordFile is the file in the bundle that lists what a task holds on
// the host, written before each resource is created.
const recordFile = "vmshim.json"

// record is everything needed to undo a task after the shim is gone: the
// delete action rebuilds it from the bundle.
type record struct {
	ID         string `json:"id"`
	Bundle     string `json:"bundle"`
	RuntimeDir string `json:"runtime_dir,omitempty"` // QMP socket and other runtime files
	Rootfs     string `json:"rootfs,omitempty"`      // set while the shim holds the rootfs mounted
	VMFiles    string `json:"vm_files,omitempty"`    // the rootfs in which the shim made the VM's files directory (image.FilesDirName)
	JailOwner  string `json:"jail_owner,omitempty"`  // the owner of the jail id claim: namespace/id
	JailID     uint32 `json:"jail_id,omitempty"`     // the VM's claimed jail uid and gid
	Pod        string `json:"pod,omitempty"`         // the bundle of the pod sandbox whose VM this task may be (podState)
	Pid        int    `json:"pid,omitempty"`         // the task's process: QEMU, or a sandbox's pause process
	PidStart   uint64 `json:"pid_start,omitempty"`   // its start time in clock ticks, guards against pid reuse
	Cgroup     string `json:"cgroup,omitempty"`      // the cgroup the task's process runs in (OCI cgroupsPath)

	Network *network.State `json:"network,omitempty"` // what the pod netns looked like before it was wired

	Netns     string                 `json:"netns,omitempty"`      // a network namespace the shim made for the task
	CNI       *network.CNIAttachment `json:"cni,omitempty"`        // the cni_network attachment of Netns
	Poststop  bool                   `json:"poststop,omitempty"`   // the spec's poststop hooks are still to run
	HookNetns string                 `json:"hook_netns,omitempty"` // the VM's netns, as hooks were told
}

// save writes the record atomically to the bundle.
func (r *record) save() error {
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	tmp := filepath.Join(r.Bundle, "."+recordFile)
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("write task record: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(r.Bundle, recordFile)); err != nil {
		return fmt.Errorf("write task record: %w", err)
	}
	return nil
}

// readRecord loads the record of the task whose bundle is given.
func readRecord(bundle string) (*record, error) {
	data, err := os.ReadFile(filepath.Join(bundle, recordFile))
	if err != nil {
		return nil, err
	}
	var r record
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("parse task record %s: %w", bundle, err)
	}
	r.Bundle = bundle
	return &r, nil
}

// release undoes everything the record names, in reverse order of
// creation, and removes the record. Failures are logged, not returned:
// release runs on paths (delete action, rollback) that must go on.
func (r *record) release(ctx context.Context) {
	logger := log.G(ctx).WithField("id", r.ID)
	if r.Pid > 0 {
		if err := killProcess(ctx, r.Pid, r.PidStart); err != nil {
			logger.WithError(err).WithField("pid", r.Pid).Warn("stop task process")
		}
	}
	if r.Cgroup != "" {
		if err := removeCgroup(ctx, r.Cgroup); err != nil {
			logger.WithError(err).WithField("cgroup", r.Cgroup).Warn("remove cgroup")
		}
	}
	if r.Network != nil {
		if err := network.Restore(ctx, r.Network); err != nil {
			logger.WithError(err).Warn("restore pod network")
		}
	}
	if r.CNI != nil {
		if err := r.CNI.Detach(ctx); err != nil {
			logger.WithError(err).Warn("detach cni network")
		}
	}
	if r.Poststop {
		r.runPoststop(ctx)
	}
	if r.Netns != "" {
		if err := removeNetns(r.Netns); err != nil {
			logger.WithError(err).Warn("remove network namespace")
		}
	}
	if r.RuntimeDir != "" {
		if err := os.RemoveAll(r.RuntimeDir); err != nil {
			logger.WithError(err).Warn("remove runtime dir")
		}
	}
	if r.VMFiles != "" {
		if err := image.RemoveFilesDir(r.VMFiles); err != nil {
			logger.WithError(err).Warn("remove the vm's files")
		}
	}
	if r.Pod != "" {
		if err := releasePod(r.Pod, r.ID); err != nil {
			logger.WithError(err).Warn("give back the pod's vm")
		}
	}
	if r.JailID != 0 {
		if err := jail.Release(idsDir, r.JailID, r.JailOwner); err != nil {
			logger.WithError(err).Warn("release jail id")
		}
	}
	if r.Rootfs != "" {
		if err := mount.UnmountRecursive(r.Rootfs, 0); err != nil {
			logger.WithError(err).Warn("unmount rootfs, retrying detached")
			if err := mount.UnmountRecursive(r.Rootfs, unix.MNT_DETACH); err != nil {
				logger.WithError(err).Warn("unmount rootfs")
			}
		}
	}
	if err := os.Remove(filepath.Join(r.Bundle, recordFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		logger.WithError(err).Warn("remove task record")
	}
}

// runPoststop runs the spec's poststop hooks once, after the VM and its
// network are gone and before the namespace and the rootfs go.
func (r *record) runPoststop(ctx context.Context) {
	spec, err := readSpec(r.Bundle)
	if err != nil {
		log.G(ctx).WithError(err).WithField("id", r.ID).Warn("poststop hooks not run")
		return
	}
	newOCIHooks(r.ID, r.Bundle, spec, r.HookNetns).runAll(ctx, phasePoststop, specs.StateStopped, 0)
	r.Poststop = false
	if err := r.save(); err != nil {
		log.G(ctx).WithError(err).WithField("id", r.ID).Warn("record poststop hooks as run")
	}
}

// killProcess sends SIGKILL to pid if it is still the process that started
// at the given time, and waits until it is gone.
func killProcess(ctx context.Context, pid int, start uint64) error {
	if st, err := processStart(pid); err != nil || (start != 0 && st != start) {
		return nil // gone, or the pid now belongs to someone else
	}
	if err := unix.Kill(pid, unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		// A process that is not our child stays a zombie until its parent
		// reaps it; count a zombie as gone.
		if st, err := processState(pid); err != nil || st == 'Z' || st == 'X' {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("process %d still alive after SIGKILL: %w", pid, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// procStat returns the fields of /proc/PID/stat after the command name.
func procStat(pid int) ([]string, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil, err
	}
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 {
		return nil, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	fields := strings.Fields(string(data[i+1:]))
	if len(fields) < 20 {
		return nil, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	return fields, nil
}

// processStart returns a process's start time in clock ticks since boot.
func processStart(pid int) (uint64, error) {
	f, err := procStat(pid)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(f[19], 10, 64) // field 22 of stat
}

// processState returns a process's state letter (R, S, Z, ...).
func processState(pid int) (byte, error) {
	f, err := procStat(pid)
	if err != nil {
		return 0, err
	}
	return f[0][0], nil
}
