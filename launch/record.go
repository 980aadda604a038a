package launch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/containerd/log"

	"github.com/vmshim/vmshim/network"
)

// recordFile is the file in the bundle that lists what a task holds on
// the host, written before each resource is created.
const recordFile = "vmshim.json"

// Record is everything needed to undo a task after the shim is gone: the
// delete action rebuilds it from the bundle.
type Record struct {
	ID          string `json:"id"`
	Bundle      string `json:"bundle"`
	RuntimeDir  string `json:"runtime_dir,omitempty"`   // QMP socket and other runtime files
	Rootfs      string `json:"rootfs,omitempty"`        // set while the shim holds the rootfs mounted
	VMFiles     string `json:"vm_files,omitempty"`      // the rootfs in which the shim made the VM's files directory (image.FilesDirName)
	JailOwner   string `json:"jail_owner,omitempty"`    // the owner of the jail id claim: namespace/id
	JailID      uint32 `json:"jail_id,omitempty"`       // the VM's claimed jail uid and gid
	Pod         string `json:"pod,omitempty"`           // the bundle of the pod sandbox whose VM this task may be (podState)
	Pid         int    `json:"pid,omitempty"`           // the task's process: QEMU, or a sandbox's pause process
	PidStart    uint64 `json:"pid_start,omitempty"`     // its start time in clock ticks, guards against pid reuse
	TPMPid      int    `json:"tpm_pid,omitempty"`       // the VM's swtpm
	TPMPidStart uint64 `json:"tpm_pid_start,omitempty"` // its start time, as PidStart
	Cgroup      string `json:"cgroup,omitempty"`        // the cgroup the task's process runs in (OCI cgroupsPath)

	Network *network.State `json:"network,omitempty"` // what the pod netns looked like before it was wired

	Netns     string                 `json:"netns,omitempty"`      // a network namespace the shim made for the task
	CNI       *network.CNIAttachment `json:"cni,omitempty"`        // the cni_network attachment of Netns
	Poststop  bool                   `json:"poststop,omitempty"`   // the spec's poststop hooks are still to run
	HookNetns string                 `json:"hook_netns,omitempty"` // the VM's netns, as hooks were told

	// Made is the undo stack: what the task has made on the host, oldest
	// first, each named before it is made (see push). release undoes it
	// newest first.
	Made []string `json:"made,omitempty"`

	net  *network.Network  // the pod network this process wired, torn down in place of Restore
	undo map[string]undoer // what undoes each kind; nil for undoers (tests give their own)
}

// undoer undoes one thing a record names.
type undoer func(context.Context, *Record) error

// The things a record can name as made, each undone by its undoer.
const (
	madeJailID     = "jail-id"
	madeRuntimeDir = "runtime-dir"
	madePod        = "pod"
	madeRootfs     = "rootfs"
	madeVMFiles    = "vm-files"
	madeNetns      = "netns"
	madePoststop   = "poststop-hooks"
	madeCNI        = "cni"
	madeNetwork    = "network"
	madeCgroup     = "cgroup"
	madeProcess    = "process"
	madeTPM        = "tpm"
)

// undoers undo each thing a record names. Each is idempotent, and leaves
// alone what is not the task's: it may run again after a crash, or after
// it failed. Each is written next to the code that makes its thing; the
// map is never changed.
var undoers = map[string]undoer{
	madeJailID:     undoJailID,
	madeRuntimeDir: undoRuntimeDir,
	madePod:        undoPod,
	madeRootfs:     undoRootfs,
	madeVMFiles:    undoVMFiles,
	madeNetns:      undoNetns,
	madePoststop:   undoPoststop,
	madeCNI:        undoCNI,
	madeNetwork:    undoNetwork,
	madeCgroup:     undoCgroup,
	madeProcess:    undoProcess,
	madeTPM:        undoTPM,
}

// push notes in the record that the task is about to make what kind
// names (change fills in the fields its undoer reads) and saves the
// record: the one place a record is written while a task is made. A
// thing is pushed before it is made, so that after a crash at any point
// release undoes it; the process, whose pid is known only once it runs,
// is pushed just after.
func (r *Record) push(kind string, change func(*Record)) error {
	if _, ok := r.undoer(kind); !ok {
		return fmt.Errorf("task record: nothing undoes %q", kind)
	}
	if change != nil {
		change(r)
	}
	r.Made = append(r.Made, kind)
	if err := r.save(); err != nil {
		r.Made = r.Made[:len(r.Made)-1]
		return err
	}
	return nil
}

// undoer is what undoes kind.
func (r *Record) undoer(kind string) (undoer, bool) {
	m := r.undo
	if m == nil {
		m = undoers
	}
	f, ok := m[kind]
	return f, ok
}

// save writes the record atomically to the bundle.
func (r *Record) save() error {
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

// ReadRecord loads the record of the task whose bundle is given.
func ReadRecord(bundle string) (*Record, error) {
	data, err := os.ReadFile(filepath.Join(bundle, recordFile))
	if err != nil {
		return nil, err
	}
	var r Record
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("parse task record %s: %w", bundle, err)
	}
	r.Bundle = bundle
	return &r, nil
}

// Release undoes what the record names, newest first, on every path that
// ends a task: a failed create's rollback, Delete, and the delete action
// after a crash. An undo that fails stays on the stack, and the record
// stays in the bundle, so the next release finishes the job; the others go
// on, and the record is saved after each, so nothing is undone twice.
// release reports the failures, if any, as one error.
func (r *Record) Release(ctx context.Context) error {
	logger := log.G(ctx).WithField("id", r.ID)
	stack := r.Made
	if stack == nil {
		stack = r.legacyStack()
	}
	var failed []string
	var errs []error
	for i := len(stack) - 1; i >= 0; i-- {
		kind := stack[i]
		undo, ok := r.undoer(kind)
		if !ok {
			logger.WithField("made", kind).Warn("task record names something this shim cannot undo; left as it is")
			continue
		}
		if err := undo(ctx, r); err != nil {
			logger.WithError(err).WithField("made", kind).Warn("undo")
			failed = append([]string{kind}, failed...)
			errs = append(errs, fmt.Errorf("%s: %w", kind, err))
		}
		r.Made = append(append([]string{}, stack[:i]...), failed...)
		if i > 0 || len(failed) > 0 {
			if err := r.save(); err != nil {
				logger.WithError(err).Warn("save task record")
			}
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("release task %s: %w", r.ID, errors.Join(errs...))
	}
	if err := os.Remove(filepath.Join(r.Bundle, recordFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove task record: %w", err)
	}
	return nil
}

// legacyStack is the undo stack of a record written without one: what its
// fields name, in the order a task makes them.
func (r *Record) legacyStack() []string {
	var stack []string
	for _, m := range []struct {
		kind string
		set  bool
	}{
		{madeJailID, r.JailID != 0}, {madeRuntimeDir, r.RuntimeDir != ""}, {madePod, r.Pod != ""},
		{madeRootfs, r.Rootfs != ""}, {madeVMFiles, r.VMFiles != ""}, {madeNetns, r.Netns != ""},
		{madePoststop, r.Poststop}, {madeCNI, r.CNI != nil}, {madeNetwork, r.Network != nil},
		{madeCgroup, r.Cgroup != ""}, {madeProcess, r.Pid > 0},
	} {
		if m.set {
			stack = append(stack, m.kind)
		}
	}
	return stack
}
