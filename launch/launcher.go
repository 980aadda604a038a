package launch

import (
	"github.com/vmshim/vmshim/hostdev"

	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	runtimeoptions "github.com/containerd/containerd/api/types/runtimeoptions/v1"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/log"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/vmshim/vmshim/config"
	"github.com/vmshim/vmshim/jail"
	"github.com/vmshim/vmshim/oom"
	"github.com/vmshim/vmshim/qemu"
	"github.com/vmshim/vmshim/regfile"
)

// runtimeRoot holds each VM's runtime directory (QMP socket). It is short
// so socket paths stay within the unix socket path limit.
const runtimeRoot = "/run/vmshim"

// qemuLauncher creates VMs with QEMU from a bundle.
type qemuLauncher struct {
	containerd string // containerd's gRPC socket, where container labels are read; "" for none
	sysfs      string // where the host's sysfs is read (hostdev.DefaultSysfs)

	mu     sync.Mutex // guards accels
	accels map[string]qemu.Accel
}

// NewLauncher returns the Launcher that boots VMs with QEMU. containerd
// is containerd's gRPC socket, which holds the labels an image gives its
// containers.
func NewLauncher(containerd string) Launcher {
	return &qemuLauncher{containerd: containerd, sysfs: hostdev.DefaultSysfs, accels: make(map[string]qemu.Accel)}
}

// Launch resolves the task's settings, prepares its disks and starts QEMU
// with the vCPUs stopped, step by step (see steps). On failure it leaves
// nothing behind: the task record names everything made so far, and its
// release undoes it, as the delete action does after a crash.
func (l *qemuLauncher) Launch(ctx context.Context, r *Request) (_ VM, retErr error) {
	cfg, err := loadConfig(r.Options)
	if err != nil {
		return nil, err
	}
	spec, err := config.ReadSpec(r.Bundle)
	if err != nil {
		return nil, err
	}
	// The pod's shim is never a likelier survivor of the node's OOM
	// killer than the pod's tasks.
	if err := oom.RaiseScoreAdj(os.Getpid(), specOOMScoreAdj(spec)); err != nil {
		log.G(ctx).WithError(err).WithField("id", r.ID).Warn("raise shim oom score to the task's")
	}
	ns, _ := namespaces.Namespace(ctx)
	if config.IsSandbox(spec) {
		return l.launchSandbox(ctx, r, spec, cfg.JailIDRange(), ns+"/"+r.ID)
	}
	c := &build{launcher: l, r: r, cfg: cfg, spec: spec, ns: ns, logger: log.G(ctx).WithField("id", r.ID)}
	defer func() {
		c.closeFiles()
		if retErr != nil {
			c.rollback(ctx)
		}
	}()
	for _, step := range steps {
		begin := time.Now()
		if err := step.do(c, ctx); err != nil {
			c.logger.WithError(err).WithField("step", step.name).Debug("create failed")
			return nil, err
		}
		Span(c.logger, step.name, begin)
	}
	c.logger.WithFields(log.Fields{"pid": c.vm.Pid(), "accel": c.qs.Accel, "nics": len(c.qs.NICs), "jail": c.j != nil}).Info("vm created")
	return c.vm, nil
}

// accel picks the accelerator for a mode once per shim process.
func (l *qemuLauncher) accel(ctx context.Context, mode, binary string) (qemu.Accel, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if a, ok := l.accels[mode]; ok {
		return a, nil
	}
	a, reason, err := qemu.ChooseAccel(ctx, mode, binary)
	if err != nil {
		return "", err
	}
	log.G(ctx).WithFields(log.Fields{"accel": a, "reason": reason}).Info("accelerator chosen")
	l.accels[mode] = a
	return a, nil
}

// launchSandbox starts a pod sandbox's pause process, as an id of ids
// claimed for owner, and writes the pod's state, which its VM
// container's Create reads, into its bundle.
func (l *qemuLauncher) launchSandbox(ctx context.Context, r *Request, spec *specs.Spec, ids jail.IDRange, owner string) (VM, error) {
	ns, err := sandboxNamespaces(spec)
	if err != nil {
		return nil, err
	}
	if err := OpenPod(r.Bundle); err != nil {
		return nil, err
	}
	return launchSandbox(ctx, r, spec, ns, ids, owner)
}

// idsDir holds the node-wide claims on jail ids (see jail.Claim); on a
// tmpfs, so a reboot frees them all.
const idsDir = runtimeRoot + "/ids"

// runtimeDir is the VM's runtime directory, named by a hash of its
// namespace and id to stay short.
func runtimeDir(ns, id string) string {
	sum := sha256.Sum256([]byte(ns + "/" + id))
	return filepath.Join(runtimeRoot, hex.EncodeToString(sum[:8]))
}

// consolePair returns a connected pair of stream sockets: one for QEMU's
// serial port, one for the shim.
func consolePair() (guest *os.File, shimSide net.Conn, err error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("console socketpair: %w", err)
	}
	guest = os.NewFile(uintptr(fds[0]), "console-guest")
	f := os.NewFile(uintptr(fds[1]), "console-shim")
	defer f.Close()
	if shimSide, err = net.FileConn(f); err != nil {
		guest.Close()
		return nil, nil, fmt.Errorf("console socket: %w", err)
	}
	return guest, shimSide, nil
}

// loadConfig reads the shim configuration, honouring the ConfigPath of
// containerd's runtime options.
func loadConfig(opts typeurl.Any) (config.Config, error) {
	var explicit string
	if opts != nil && opts.GetTypeUrl() != "" {
		v, err := typeurl.UnmarshalAny(opts)
		if err != nil {
			return config.Config{}, fmt.Errorf("runtime options: %w", err)
		}
		if o, ok := v.(*runtimeoptions.Options); ok {
			explicit = o.ConfigPath
		}
	}
	return config.Load(config.PathFrom(explicit))
}

// specNetns returns the path of the network namespace the spec joins, and
// whether the spec has a network namespace at all: one without a path asks
// for a new namespace (ctr run, nerdctl); none means the host's.
func specNetns(spec *specs.Spec) (path string, ok bool) {
	if spec.Linux != nil {
		for _, ns := range spec.Linux.Namespaces {
			if ns.Type == specs.NetworkNamespace {
				return ns.Path, true
			}
		}
	}
	return "", false
}

// podResolvConf is the host path of the pod's resolv.conf, if the spec
// mounts one.
func podResolvConf(spec *specs.Spec) string {
	for _, m := range spec.Mounts {
		if m.Destination == "/etc/resolv.conf" {
			return m.Source
		}
	}
	return ""
}

// maxHostnameFile bounds what is read of a CRI container's /etc/hostname:
// a host name is at most 253 bytes.
const maxHostnameFile = 4 << 10

// hostname is the pod's host name: the spec's, or, for a CRI container
// (which shares the sandbox's UTS namespace and so has none in its spec),
// the content of the /etc/hostname file the CRI mounts into it. That file
// must be a regular file of at most maxHostnameFile bytes: it is checked
// through an O_PATH descriptor before it is opened (the path is the
// spec's, so only its last component is not followed), then read
// non-blocking. A missing file means no host name.
func hostname(spec *specs.Spec) (string, error) {
	if spec.Hostname != "" {
		return spec.Hostname, nil
	}
	for _, m := range spec.Mounts {
		if m.Destination == "/etc/hostname" {
			data, err := regfile.ReadFile(m.Source, maxHostnameFile)
			if errors.Is(err, os.ErrNotExist) {
				return "", nil
			}
			if err != nil {
				return "", fmt.Errorf("/etc/hostname mount: %w", err)
			}
			return strings.TrimSpace(string(data)), nil
		}
	}
	return "", nil
}
