// Package runcshim runs a VM pod's ordinary containers, those whose image
// holds no VM, through containerd's own runc shim (containerd-shim-runc-v2):
// one runc shim process per pod, started the way containerd starts a shim
// (the start action, bootstrap parameters on stdin), whose ttrpc task
// service the task service forwards those containers' calls to. The runc
// shim publishes their events to containerd itself. What it needs to be
// cleaned up after the VM shim is gone is written in each container's
// bundle (Record).
package runcshim

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	bootapi "github.com/containerd/containerd/api/runtime/bootstrap/v1"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/containerd/ttrpc"
	"github.com/containerd/typeurl/v2"
	"google.golang.org/protobuf/proto"
)

// startTimeout bounds the runc shim's start action and the dial of its
// socket.
const startTimeout = 30 * time.Second

// Config is how to reach containerd and run its runc shim.
type Config struct {
	// Binary is the runc shim (config runc_shim): a command name, looked
	// up on PATH and then beside containerd's binary, as containerd looks
	// up a shim, or an absolute path.
	Binary string
	// Runc is the runc binary the shim runs containers with ("" for its
	// default, runc on its PATH).
	Runc string
	// Address and TTRPCAddress are containerd's gRPC and ttrpc sockets,
	// as containerd gave them to the VM shim; Containerd is containerd's
	// binary (-publish-binary).
	Address, TTRPCAddress, Containerd string
	// SocketDir is where the runc shim's socket goes: a directory of its
	// own, so that its socket, named after the pod as the VM shim's is,
	// is not the VM shim's.
	SocketDir string
	// Debug runs the runc shim at debug level.
	Debug bool
}

// Shim is a running runc shim: its task service.
type Shim struct {
	address string
	conn    *ttrpc.Client
	task    taskAPI.TTRPCTaskService
	closed  chan struct{} // closed with the connection, by either end
}

// Start runs the runc shim's start action for container id, whose bundle
// is given, in namespace ns: it starts the pod's runc shim, or finds the
// one that serves the pod already (the runc shim groups a pod's
// containers by their sandbox), and connects to it.
func Start(ctx context.Context, cfg Config, ns, id, bundle string) (*Shim, error) {
	bin, err := cfg.binary()
	if err != nil {
		return nil, err
	}
	cfg.Binary = bin
	params := &bootapi.BootstrapParams{
		InstanceID:             id,
		Namespace:              ns,
		LogLevel:               bootapi.LogLevel_LOG_LEVEL_INFO,
		ContainerdGrpcAddress:  cfg.Address,
		ContainerdTtrpcAddress: cfg.TTRPCAddress,
		ContainerdBinary:       cfg.Containerd,
		SocketDir:              &cfg.SocketDir,
	}
	if cfg.Debug {
		params.LogLevel = bootapi.LogLevel_LOG_LEVEL_DEBUG
	}
	if err := params.AddExtension(cfg.options(bundle)); err != nil {
		return nil, err
	}
	var in []byte
	in, err = proto.Marshal(params)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.SocketDir, 0o711); err != nil {
		return nil, fmt.Errorf("runc shim socket dir: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	cmd := cfg.command(ctx, ns, id, bundle, "start")
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("start runc shim %s: %w: %s", cfg.Binary, err, lastLine(stderr.Bytes()))
	}
	var result bootapi.BootstrapResult
	if err := proto.Unmarshal(out, &result); err != nil || result.GetAddress() == "" {
		return nil, fmt.Errorf("start runc shim %s: unreadable answer %q", cfg.Binary, lastLine(out))
	}
	if p := result.GetProtocol(); p != "ttrpc" {
		return nil, fmt.Errorf("start runc shim %s: protocol %q, want ttrpc: %w", cfg.Binary, p, errdefs.ErrNotImplemented)
	}
	return Dial(ctx, result.GetAddress())
}

// Dial connects to the runc shim serving at address (unix://PATH).
func Dial(ctx context.Context, address string) (*Shim, error) {
	path := strings.TrimPrefix(address, "unix://")
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("connect to runc shim at %s: %w", address, err)
	}
	closed := make(chan struct{})
	conn := ttrpc.NewClient(c, ttrpc.WithOnClose(func() { close(closed) }))
	return &Shim{address: address, conn: conn, task: taskAPI.NewTTRPCTaskClient(conn), closed: closed}, nil
}

// Gone tells whether the connection has closed: the runc shim ended, or
// Close was called.
func (s *Shim) Gone() bool {
	select {
	case <-s.closed:
		return true
	default:
		return false
	}
}

// Task is the runc shim's task service.
func (s *Shim) Task() taskAPI.TTRPCTaskService { return s.task }

// Address is where the runc shim serves.
func (s *Shim) Address() string { return s.address }

// Close closes the connection; the runc shim goes on.
func (s *Shim) Close() error { return s.conn.Close() }

// options are the runc shim's options for the container in bundle: the
// systemd cgroup driver when its cgroups path is in systemd's form
// (slice:prefix:name), as containerd's CRI gives it under that driver.
func (cfg Config) options(bundle string) *options.Options {
	o := &options.Options{BinaryName: cfg.Runc}
	if p, err := cgroupsPath(bundle); err == nil && strings.Count(p, ":") == 2 && !strings.HasPrefix(p, "/") {
		o.SystemdCgroup = true
	}
	return o
}

// CreateRequest is r as the runc shim takes it: with the runc options in
// place of the VM shim's own runtime options, which it does not know.
func (cfg Config) CreateRequest(r *taskAPI.CreateTaskRequest) (*taskAPI.CreateTaskRequest, error) {
	opts, err := typeurl.MarshalAnyToProto(cfg.options(r.Bundle))
	if err != nil {
		return nil, err
	}
	c := proto.Clone(r).(*taskAPI.CreateTaskRequest)
	c.Options = opts
	return c, nil
}

// command is the runc shim binary run for action, as containerd runs a
// shim: in the bundle, with containerd's addresses.
func (cfg Config) command(ctx context.Context, ns, id, bundle, action string) *exec.Cmd {
	args := []string{"-namespace", ns, "-address", cfg.Address, "-publish-binary", cfg.Containerd, "-id", id}
	if action == "delete" {
		args = append(args, "-bundle", bundle)
	}
	if cfg.Debug {
		args = append(args, "-debug")
	}
	cmd := exec.CommandContext(ctx, cfg.Binary, append(args, action)...)
	cmd.Dir = bundle
	cmd.Env = append(os.Environ(),
		"GOMAXPROCS=2",
		"TTRPC_ADDRESS="+cfg.TTRPCAddress,
		"GRPC_ADDRESS="+cfg.Address,
		"NAMESPACE="+ns,
	)
	cmd.WaitDelay = time.Second
	return cmd
}

// binary finds the runc shim.
func (cfg Config) binary() (string, error) {
	if filepath.IsAbs(cfg.Binary) {
		return cfg.Binary, nil
	}
	if p, err := exec.LookPath(cfg.Binary); err == nil {
		return filepath.Abs(p)
	}
	if cfg.Containerd != "" && !strings.Contains(cfg.Binary, "/") {
		p := filepath.Join(filepath.Dir(cfg.Containerd), cfg.Binary)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("config runc_shim: %q, which runs the containers of a VM pod whose image holds no VM, is neither on PATH nor beside containerd: %w",
		cfg.Binary, errdefs.ErrFailedPrecondition)
}

// lastLine is the last non-empty line of b, trimmed, at most 512 bytes.
func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	s := strings.TrimSpace(lines[len(lines)-1])
	if len(s) > 512 {
		s = s[:512] + "..."
	}
	return s
}

// Pod is the runc shim of the VM shim's pod, started on first use.
type Pod struct {
	cfg Config

	mu   sync.Mutex // guards shim
	shim *Shim
}

// NewPod returns the pod's runc shim, not started yet.
func NewPod(cfg Config) *Pod { return &Pod{cfg: cfg} }

// Get returns the pod's runc shim, starting it for container id if it
// does not run yet, or no longer does: a runc shim that died (killed,
// crashed) is started again for the next container. The containers the
// dead one served cannot be reached through the new one.
func (p *Pod) Get(ctx context.Context, id, bundle string) (*Shim, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.shim != nil && !p.shim.Gone() {
		return p.shim, nil
	}
	if p.shim != nil {
		log.G(ctx).WithField("address", p.shim.Address()).Warn("the pod's runc shim is gone; starting it again")
		_ = p.shim.Close()
		p.shim = nil
	}
	ns, err := namespaces.NamespaceRequired(ctx)
	if err != nil {
		return nil, err
	}
	s, err := Start(ctx, p.cfg, ns, id, bundle)
	if err != nil {
		return nil, err
	}
	p.shim = s
	return s, nil
}

// CreateRequest is r as the pod's runc shim takes it (see
// Config.CreateRequest).
func (p *Pod) CreateRequest(r *taskAPI.CreateTaskRequest) (*taskAPI.CreateTaskRequest, error) {
	return p.cfg.CreateRequest(r)
}

// Shutdown asks the pod's runc shim, if it runs, to end (it does once it
// serves no container) and closes the connection.
func (p *Pod) Shutdown(ctx context.Context) {
	p.mu.Lock()
	s := p.shim
	p.shim = nil
	p.mu.Unlock()
	if s == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	if _, err := s.task.Shutdown(ctx, &taskAPI.ShutdownRequest{}); err != nil && !errors.Is(err, ttrpc.ErrClosed) {
		log.G(ctx).WithError(err).Debug("shut the runc shim down")
	}
	_ = s.Close()
}
