package shim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	bootapi "github.com/containerd/containerd/api/runtime/bootstrap/v1"
	"github.com/containerd/containerd/api/types"
	"github.com/containerd/containerd/v2/core/runtime"
	"github.com/containerd/containerd/v2/defaults"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/shim"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/vmshim/vmshim/config"
	"github.com/vmshim/vmshim/launch"
	"github.com/vmshim/vmshim/oom"
	"github.com/vmshim/vmshim/runcshim"
)

// manager implements the shim binary's start and delete actions.
type manager struct {
	name string
}

// NewManager returns the manager behind the shim binary's actions.
func NewManager(name string) shim.Shim {
	return manager{name: name}
}

// Name returns the runtime name.
func (m manager) Name() string { return m.name }

// Start launches the long-running shim process for a task, or returns the
// address of the one already serving the task's group.
func (m manager) Start(ctx context.Context, params *bootapi.BootstrapParams) (_ *bootapi.BootstrapResult, retErr error) {
	id := params.GetInstanceID()
	ns, err := namespaces.NamespaceRequired(ctx)
	if err != nil {
		return nil, err
	}
	spec, err := config.ReadSpec(".") // the working directory is the bundle
	if err != nil {
		return nil, err
	}
	group := groupOf(id, spec)
	socketDir := params.GetSocketDir()
	if socketDir == "" {
		socketDir = filepath.Join(defaults.DefaultStateDir, "s")
	}
	address, err := shim.CreateSocketAddress(ctx, socketDir, params.GetContainerdGrpcAddress(), group, false)
	if err != nil {
		return nil, err
	}
	result := &bootapi.BootstrapResult{Version: 3, Protocol: "ttrpc", Address: address}

	listener, err := listen(address)
	if errors.Is(err, errdefs.ErrAlreadyExists) {
		return result, nil // the group's shim is already serving
	}
	if err != nil {
		return nil, err
	}
	defer func() {
		if retErr != nil {
			_ = shim.RemoveSocket(address)
		}
	}()
	f, err := listener.File()
	// The serving process inherits the socket; closing our copy must not
	// unlink it.
	listener.SetUnlinkOnClose(false)
	listener.Close()
	if err != nil {
		return nil, err
	}
	defer f.Close()

	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cwd, err := os.Getwd()
	if err != nil {
		return nil, err
	}
	args := []string{"-namespace", ns, "-id", id, "-address", params.GetContainerdGrpcAddress()}
	// The serving shim finds containerd's runc shim beside containerd.
	if bin := params.GetContainerdBinary(); bin != "" {
		args = append(args, "-publish-binary", bin)
	} else if bin := flagValue(os.Args, "-publish-binary"); bin != "" {
		args = append(args, "-publish-binary", bin)
	}
	if params.GetLogLevel() <= bootapi.LogLevel_LOG_LEVEL_DEBUG {
		args = append(args, "-debug")
	}
	cmd := exec.Command(self, args...)
	cmd.Dir = cwd
	cmd.Env = append(os.Environ(), "GOMAXPROCS=2")
	cmd.ExtraFiles = []*os.File{f} // fd 3: the ttrpc listener
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := startShim(ctx, cmd, id, cwd, spec); err != nil {
		return nil, err
	}
	defer func() {
		if retErr != nil {
			_ = cmd.Process.Kill()
		}
	}()
	go func() { _ = cmd.Wait() }()

	if err := shim.AdjustOOMScore(cmd.Process.Pid); err != nil {
		log.G(ctx).WithError(err).Warn("adjust shim oom score")
	}
	// Never below the pod's: the node's OOM killer must not take every
	// pod before the shim.
	if err := raiseOOMScoreAdj(cmd.Process.Pid, spec); err != nil {
		log.G(ctx).WithError(err).Warn("raise shim oom score to the pod's")
	}
	return result, nil
}

// startShim starts the serving shim process: for a CRI pod sandbox, in a
// cgroup of its own inside the pod's (see shimCgroupPath); otherwise where
// the start action runs, containerd's cgroup.
func startShim(ctx context.Context, cmd *exec.Cmd, id, bundle string, spec *specs.Spec) error {
	raw, err := shimCgroupPath(id, spec)
	if err != nil {
		return fmt.Errorf("the shim's cgroup in the pod's: %w", err)
	}
	if raw == "" {
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("start shim process: %w", err)
		}
		return nil
	}
	if err := shimCgroups().StartShim(ctx, bundle, raw, cmd); err != nil {
		return fmt.Errorf("start shim process in cgroup %s: %w", raw, err)
	}
	log.G(ctx).WithFields(log.Fields{"cgroup": raw, "pid": cmd.Process.Pid}).Debug("shim runs in the pod's cgroup")
	return nil
}

// listen creates the shim's socket; ErrAlreadyExists means a live shim
// already serves it.
func listen(address string) (*net.UnixListener, error) {
	l, err := shim.NewSocket(address)
	if err == nil {
		return l, nil
	}
	if !shim.SocketEaddrinuse(err) {
		return nil, fmt.Errorf("create shim socket: %w", err)
	}
	if shim.CanConnect(address) {
		return nil, errdefs.ErrAlreadyExists
	}
	// A stale socket left by a dead shim.
	if err := shim.RemoveSocket(address); err != nil {
		return nil, fmt.Errorf("remove stale shim socket: %w", err)
	}
	return shim.NewSocket(address)
}

// groupOf returns the shim group task id, whose spec is given, belongs
// to: its pod sandbox's, or its own.
func groupOf(id string, spec *specs.Spec) string {
	if g := config.SandboxID(spec); g != "" {
		return g
	}
	return id
}

// Stop is the delete action: containerd runs it when a shim died or a
// create failed. It rebuilds what to undo from the bundle and only warns
// on failure.
func (m manager) Stop(ctx context.Context, id string) (shim.StopStatus, error) {
	bundle, err := bundlePath(ctx, id)
	if err != nil {
		return shim.StopStatus{}, err
	}
	status := shim.StopStatus{ExitedAt: time.Now(), ExitStatus: 128 + int(unix.SIGKILL)}
	if rr, err := runcshim.ReadRecord(bundle); err != nil || rr != nil {
		return stopOrdinary(ctx, bundle, rr, status, err)
	}
	// A pod sandbox's bundle names the cgroup its shim ran in; the shim
	// is gone (it crashed, or was OOM-killed there), so it can go.
	defer func() {
		if err := shimCgroups().RemoveShim(ctx, bundle); err != nil {
			log.G(ctx).WithError(err).WithField("id", id).Warn("remove the shim's cgroup")
		}
	}()
	rec, err := launch.ReadRecord(bundle)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		log.G(ctx).WithError(err).WithField("id", id).Warn("read task record")
	}
	// The CRI says OOMKilled only when told: a shim killed by the
	// pod's memory limit ends the pod's VM for that reason.
	publishOOM(ctx, shimOOMKilledTasks(ctx, bundle, id, rec, func(raw string) uint64 { return shimCgroups().OOMKills(ctx, raw) }))
	if rec == nil {
		return status, nil
	}
	status.Pid = rec.Pid
	if err := rec.Release(ctx); err != nil {
		// The record keeps what is left, for the next delete.
		log.G(ctx).WithError(err).WithField("id", id).Warn("delete action")
	}
	return status, nil
}

// stopOrdinary is the delete action of an ordinary container, which the
// pod's runc shim runs (see runcshim.Cleanup): it reports the exit the
// runc shim knows, or SIGKILL's when it knows none.
func stopOrdinary(ctx context.Context, bundle string, rec *runcshim.Record, status shim.StopStatus, err error) (shim.StopStatus, error) {
	if err != nil {
		log.G(ctx).WithError(err).Warn("delete action")
		return status, nil
	}
	ns, _ := namespaces.Namespace(ctx)
	cfg := runcshim.Config{
		Binary: config.Default().RuncShim, Address: os.Getenv("GRPC_ADDRESS"), TTRPCAddress: os.Getenv("TTRPC_ADDRESS"),
		Containerd: flagValue(os.Args, "-publish-binary"), SocketDir: runcSocketDir,
	}
	if c, err := config.Load(config.PathFrom("")); err == nil {
		cfg.Binary, cfg.Runc = c.RuncShim, c.Runc
	}
	resp, err := runcshim.Cleanup(ctx, cfg, ns, bundle, rec)
	if err != nil {
		log.G(ctx).WithError(err).WithField("id", rec.ID).Warn("delete action")
		return status, nil
	}
	return shim.StopStatus{Pid: int(resp.Pid), ExitStatus: int(resp.ExitStatus), ExitedAt: resp.ExitedAt.AsTime()}, nil
}

// publishOOM sends containerd a TaskOOM event for each task in ids,
// through the address containerd gives the delete action.
func publishOOM(ctx context.Context, ids []string) {
	if len(ids) == 0 {
		return
	}
	address := os.Getenv("TTRPC_ADDRESS")
	if address == "" {
		log.G(ctx).Warn("no containerd address to report the shim's OOM kill to")
		return
	}
	p, err := shim.NewPublisher(address)
	if err != nil {
		log.G(ctx).WithError(err).Warn("report the shim's OOM kill")
		return
	}
	defer p.Close()
	for _, id := range ids {
		if err := p.Publish(ctx, runtime.TaskOOMEventTopic, &eventstypes.TaskOOM{ContainerID: id}); err != nil {
			log.G(ctx).WithError(err).WithField("id", id).Warn("report the shim's OOM kill")
		}
	}
}

// bundlePath finds the bundle of task id: the -bundle flag when containerd
// passed one, else a sibling of the working directory (the shim's cwd is
// the bundle of the first task of its group).
func bundlePath(ctx context.Context, id string) (string, error) {
	if opts, ok := ctx.Value(shim.OptsKey{}).(shim.Opts); ok && opts.BundlePath != "" {
		return opts.BundlePath, nil
	}
	cwd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	return filepath.Join(filepath.Dir(cwd), id), nil
}

// Info describes the runtime to containerd.
func (m manager) Info(ctx context.Context, _ io.Reader) (*types.RuntimeInfo, error) {
	return &types.RuntimeInfo{
		Name:    m.name,
		Version: &types.RuntimeVersion{Version: Version, Revision: Revision},
	}, nil
}

// raiseOOMScoreAdj raises pid's oom_score_adj to the spec's, never
// lowering it (see oom.RaiseScoreAdj).
func raiseOOMScoreAdj(pid int, spec *specs.Spec) error {
	if spec.Process == nil {
		return nil
	}
	return oom.RaiseScoreAdj(pid, spec.Process.OOMScoreAdj)
}
