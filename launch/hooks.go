package launch

import (
	"github.com/vmshim/vmshim/config"
	"github.com/vmshim/vmshim/thread"

	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// netnsAnnotation tells hooks where the VM's network namespace is. The
// task's pid is QEMU's, and a hook cannot find the namespace through
// /proc/<pid>/ns/net before QEMU exists; nerdctl's hook reads this
// annotation first, as it does for other VM runtimes.
const netnsAnnotation = "nerdctl/network-namespace"

// hookOutputLimit bounds how much of a hook's stderr is kept for its error.
const hookOutputLimit = 4 << 10

// hookWaitDelay bounds how long a hook's output is awaited once the hook
// has exited (or been killed) while children it left hold the pipe.
const hookWaitDelay = 2 * time.Second

// The OCI hook phases, named as in config.json.
const (
	phasePrestart        = "prestart"
	phaseCreateRuntime   = "createRuntime"
	phaseCreateContainer = "createContainer"
	phaseStartContainer  = "startContainer"
	phasePoststart       = "poststart"
	phasePoststop        = "poststop"
)

// ociHooks runs a task's OCI hooks with the state the runtime spec gives
// them on stdin. The VM's network namespace is the only namespace of the
// "container" on the host: createContainer and startContainer hooks run
// there, the others in the shim's (the runtime's) namespaces.
type ociHooks struct {
	hooks       specs.Hooks
	version     string
	id, bundle  string
	netns       string // the VM's network namespace; "" for the host's
	annotations map[string]string
}

// newOCIHooks returns the hooks of spec for task id; netns is the VM's
// network namespace ("" when the VM runs in the host's).
func newOCIHooks(id, bundle string, spec *specs.Spec, netns string) *ociHooks {
	h := &ociHooks{version: spec.Version, id: id, bundle: bundle, netns: netns}
	if spec.Hooks != nil {
		h.hooks = *spec.Hooks
	}
	h.annotations = make(map[string]string, len(spec.Annotations)+1)
	for k, v := range spec.Annotations {
		h.annotations[k] = v
	}
	if netns != "" {
		h.annotations[netnsAnnotation] = netns
	}
	return h
}

// any reports whether the spec has hooks at all.
func (h *ociHooks) any() bool {
	hk := h.hooks
	return len(hk.Prestart)+len(hk.CreateRuntime)+len(hk.CreateContainer)+
		len(hk.StartContainer)+len(hk.Poststart)+len(hk.Poststop) > 0
}

// check refuses hooks the runtime spec does not allow, before any runs.
func (h *ociHooks) check() error {
	for _, phase := range []string{phasePrestart, phaseCreateRuntime, phaseCreateContainer, phaseStartContainer, phasePoststart, phasePoststop} {
		for i, hk := range h.phase(phase) {
			if !filepath.IsAbs(hk.Path) {
				return fmt.Errorf("%s hook #%d: path %q is not absolute: %w", phase, i, hk.Path, errdefs.ErrInvalidArgument)
			}
			if hk.Timeout != nil && *hk.Timeout <= 0 {
				return fmt.Errorf("%s hook #%d (%s): timeout %d is not a positive number of seconds: %w",
					phase, i, hk.Path, *hk.Timeout, errdefs.ErrInvalidArgument)
			}
		}
	}
	return nil
}

// phase returns the hooks of one phase.
func (h *ociHooks) phase(name string) []specs.Hook {
	switch name {
	case phasePrestart:
		return h.hooks.Prestart //nolint:staticcheck // deprecated, still run as runc does
	case phaseCreateRuntime:
		return h.hooks.CreateRuntime
	case phaseCreateContainer:
		return h.hooks.CreateContainer
	case phaseStartContainer:
		return h.hooks.StartContainer
	case phasePoststart:
		return h.hooks.Poststart
	case phasePoststop:
		return h.hooks.Poststop
	}
	return nil
}

// create runs the hooks of the create operation: prestart and
// createRuntime in the runtime's namespaces, then createContainer in the
// VM's. The VM does not exist yet, so the state has no pid.
func (h *ociHooks) create(ctx context.Context) error {
	for _, phase := range []string{phasePrestart, phaseCreateRuntime, phaseCreateContainer} {
		if err := h.run(ctx, phase, specs.StateCreating, 0); err != nil {
			return err
		}
	}
	return nil
}

// run runs one phase's hooks in order and stops at the first failure.
func (h *ociHooks) run(ctx context.Context, phase string, status specs.ContainerState, pid int) error {
	return h.runPhase(ctx, phase, status, pid, true)
}

// runAll runs every hook of a phase whose failures must not stop the
// lifecycle (poststart, poststop): each failure is logged and the rest run.
func (h *ociHooks) runAll(ctx context.Context, phase string, status specs.ContainerState, pid int) {
	_ = h.runPhase(ctx, phase, status, pid, false)
}

func (h *ociHooks) runPhase(ctx context.Context, phase string, status specs.ContainerState, pid int, stopAtFailure bool) error {
	list := h.phase(phase)
	if len(list) == 0 {
		return nil
	}
	state, err := json.Marshal(specs.State{
		Version: h.version, ID: h.id, Status: status, Pid: pid, Bundle: h.bundle, Annotations: h.annotations,
	})
	if err != nil {
		return err
	}
	var steps []thread.Step
	if h.netns != "" && (phase == phaseCreateContainer || phase == phaseStartContainer) {
		steps = append(steps, thread.JoinNetns(h.netns))
	}
	for i, hk := range list {
		err := runHook(ctx, hk, state, h.bundle, steps...)
		if err == nil {
			continue
		}
		err = fmt.Errorf("%s hook #%d (%s): %w", phase, i, hk.Path, err)
		if stopAtFailure {
			return err
		}
		log.G(ctx).WithError(err).WithField("id", h.id).Warn("hook failed")
	}
	return nil
}

// runHook runs one hook with the state on stdin, from bundle, forked from a
// thread the steps moved, and waits for it within its timeout.
func runHook(ctx context.Context, hk specs.Hook, state []byte, bundle string, steps ...thread.Step) error {
	hookCtx := ctx
	if hk.Timeout != nil {
		var cancel context.CancelFunc
		hookCtx, cancel = context.WithTimeout(ctx, time.Duration(*hk.Timeout)*time.Second)
		defer cancel()
	}
	cmd := exec.CommandContext(hookCtx, hk.Path)
	if len(hk.Args) > 0 {
		cmd.Args = hk.Args
	}
	cmd.Env = hk.Env
	cmd.Dir = bundle
	cmd.Stdin = bytes.NewReader(state)
	stderr := &tailBuffer{limit: hookOutputLimit}
	cmd.Stderr = stderr // stdout goes to /dev/null
	cmd.WaitDelay = hookWaitDelay
	start := time.Now()
	if err := thread.Fork(cmd, steps...); err != nil {
		return err
	}
	err := cmd.Wait()
	log.G(ctx).WithField("hook", hk.Path).WithField("took", time.Since(start)).Debug("hook ran")
	switch {
	case err == nil:
		return nil
	case errors.Is(err, exec.ErrWaitDelay) && cmd.ProcessState != nil && cmd.ProcessState.Success():
		// It succeeded; a child it left behind holds its stderr.
		return nil
	case hk.Timeout != nil && hookCtx.Err() == context.DeadlineExceeded && ctx.Err() == nil:
		return fmt.Errorf("did not finish within its timeout of %ds: %w", *hk.Timeout, context.DeadlineExceeded)
	case ctx.Err() != nil:
		return fmt.Errorf("%w: %w", err, ctx.Err())
	}
	if out := stderr.lastLine(); out != "" {
		return fmt.Errorf("%w: %s", err, out)
	}
	return err
}

// tailBuffer keeps the last limit bytes written to it.
type tailBuffer struct {
	limit int
	buf   []byte
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.buf = append(b.buf, p...)
	if over := len(b.buf) - b.limit; over > 0 {
		b.buf = b.buf[over:]
	}
	return len(p), nil
}

// lastLine is the last non-empty line written, trimmed.
func (b *tailBuffer) lastLine() string {
	lines := strings.Split(strings.TrimSpace(string(b.buf)), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// runPoststop runs the spec's poststop hooks once, after the VM and its
// network are gone and before the namespace and the rootfs go.
func (r *Record) runPoststop(ctx context.Context) {
	spec, err := config.ReadSpec(r.Bundle)
	if err != nil {
		log.G(ctx).WithError(err).WithField("id", r.ID).Warn("poststop hooks not run")
		return
	}
	newOCIHooks(r.ID, r.Bundle, spec, r.HookNetns).runAll(ctx, phasePoststop, specs.StateStopped, 0)
	r.Poststop = false
}

// undoPoststop runs the spec's poststop hooks (madePoststop).
func undoPoststop(ctx context.Context, r *Record) error {
	r.runPoststop(ctx)
	return nil
}
