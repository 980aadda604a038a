package shim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	bootapi "github.com/containerd/containerd/api/runtime/bootstrap/v1"
	"github.com/containerd/containerd/api/types"
	"github.com/containerd/containerd/v2/defaults"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/shim"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"
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
	group, err := groupOf(id)
	if err != nil {
		return nil, err
	}
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
	if params.GetLogLevel() <= bootapi.LogLevel_LOG_LEVEL_DEBUG {
		args = append(args, "-debug")
	}
	cmd := exec.Command(self, args...)
	cmd.Dir = cwd
	cmd.Env = append(os.Environ(), "GOMAXPROCS=2")
	cmd.ExtraFiles = []*os.File{f} // fd 3: the ttrpc listener
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start shim process: %w", err)
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
	return result, nil
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

// groupOf reads the bundle's config.json (the working directory during
// start) and returns the shim group the task belongs to.
func groupOf(id string) (string, error) {
	data, err := os.ReadFile("config.json")
	if err != nil {
		return "", fmt.Errorf("read bundle spec: %w", err)
	}
	var spec struct {
		Annotations map[string]string `json:"annotations"`
	}
	if err := json.Unmarshal(data, &spec); err != nil {
		return "", fmt.Errorf("parse bundle spec: %w", err)
	}
	if g := spec.Annotations[sandboxIDAnnotation]; g != "" {
		return g, nil
	}
	return id, nil
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
	rec, err := readRecord(bundle)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			log.G(ctx).WithError(err).WithField("id", id).Warn("read task record")
		}
		return status, nil
	}
	status.Pid = rec.Pid
	if err := rec.release(ctx); err != nil {
		// The record keeps what is left, for the next delete.
		log.G(ctx).WithError(err).WithField("id", id).Warn("delete action")
	}
	return status, nil
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
