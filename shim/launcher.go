package shim

import (
	"github.com/vmshim/vmshim/thread"

	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	runtimeoptions "github.com/containerd/containerd/api/types/runtimeoptions/v1"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/vmshim/vmshim/config"
	"github.com/vmshim/vmshim/image"
	"github.com/vmshim/vmshim/network"
	"github.com/vmshim/vmshim/qemu"
)

// runtimeRoot holds each VM's runtime directory (QMP socket). It is short
// so socket paths stay within the unix socket path limit.
const runtimeRoot = "/run/vmshim"

// overlayDir is where, inside the container's writable layer, the VM's
// root disk overlay lives.
const overlayDir = ".vmshim"

// qemuLauncher creates VMs with QEMU from a bundle.
type qemuLauncher struct {
	mu        sync.Mutex // guards accels, sandboxes and podVMs
	accels    map[string]qemu.Accel
	sandboxes map[string]string // /proc/PID/ns/net of a pause process → the pod netns it joined
	podVMs    map[string]string // CRI sandbox id → the container whose VM the pod runs
}

// NewLauncher returns the Launcher that boots VMs with QEMU.
func NewLauncher() Launcher {
	return &qemuLauncher{accels: make(map[string]qemu.Accel), sandboxes: make(map[string]string), podVMs: make(map[string]string)}
}

// Launch resolves the task's settings, prepares its disks and starts QEMU
// with the vCPUs stopped. On failure it leaves nothing behind.
func (l *qemuLauncher) Launch(ctx context.Context, r *CreateRequest) (_ VM, retErr error) {
	cfg, err := loadConfig(r.Options)
	if err != nil {
		return nil, err
	}
	spec, err := readSpec(r.Bundle)
	if err != nil {
		return nil, err
	}
	if isSandbox(spec) {
		return l.launchSandbox(ctx, r, spec)
	}
	desc, err := config.Resolve(cfg, r.ID, spec)
	if err != nil {
		return nil, err
	}
	if err := newOCIHooks(r.ID, r.Bundle, spec, "").check(); err != nil {
		return nil, err
	}
	release, err := l.claimPod(spec.Annotations[groupAnnotation], r.ID)
	if err != nil {
		return nil, err
	}
	defer func() {
		if retErr != nil {
			release()
		}
	}()
	binary, err := exec.LookPath(cfg.QEMUBinary)
	if err != nil {
		return nil, fmt.Errorf("config qemu_binary: %q not found: %w", cfg.QEMUBinary, errdefs.ErrFailedPrecondition)
	}
	ns, _ := namespaces.Namespace(ctx)
	rec := &record{ID: r.ID, Bundle: r.Bundle, RuntimeDir: runtimeDir(ns, r.ID)}
	if err := rec.save(); err != nil {
		return nil, err
	}
	defer func() {
		if retErr != nil {
			rec.release(ctx)
		}
	}()

	rootfs := filepath.Join(r.Bundle, "rootfs")
	if len(r.Rootfs) > 0 {
		rec.Rootfs = rootfs
		if err := rec.save(); err != nil {
			return nil, err
		}
		if err := mount.All(r.Rootfs, rootfs); err != nil {
			return nil, fmt.Errorf("mount rootfs: %w", err)
		}
	}
	boot, err := image.Find(rootfs)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(rec.RuntimeDir, 0o700); err != nil {
		return nil, fmt.Errorf("create runtime dir: %w", err)
	}

	qs := qemu.Spec{
		Name:      r.ID,
		CPUs:      desc.VCPUs,
		MemoryMiB: desc.MemoryMiB,
		QMPSocket: filepath.Join(rec.RuntimeDir, "qmp.sock"),
		// Exec runs through qemu-guest-agent; a guest without one
		// simply never opens the port.
		AgentSocket: filepath.Join(rec.RuntimeDir, "agent.sock"),
		Sandbox:     cfg.Sandbox,
		RunAs:       cfg.QEMUUser,
		Paused:      true,
	}
	if boot.Disk != "" {
		drive, err := rootDrive(ctx, cfg, desc, boot, rec, rootfs)
		if err != nil {
			return nil, err
		}
		qs.Drives = []qemu.Drive{drive}
	} else {
		qs.Kernel, qs.Initrd, qs.Append = boot.Kernel, boot.Initrd, desc.KernelCmdline
	}
	if qs.Accel, err = l.accel(ctx, cfg.Accel, binary); err != nil {
		return nil, err
	}
	if err := hostDevices(ctx, spec, desc.DiskDriver, &qs); err != nil {
		return nil, err
	}
	mounts := shares(ctx, spec, &qs)

	guestEnd, shimEnd, err := consolePair()
	if err != nil {
		return nil, err
	}
	defer guestEnd.Close()
	defer func() {
		if retErr != nil {
			shimEnd.Close()
		}
	}()
	var fds qemu.FDSet
	qs.ConsoleFD = fds.Add(guestEnd)

	logger := log.G(ctx).WithField("id", r.ID)
	nsPath, err := l.vmNetns(ctx, ns, r.ID, spec, rec)
	if err != nil {
		return nil, err
	}
	hooks := newOCIHooks(r.ID, r.Bundle, spec, nsPath)
	if hooks.any() {
		// From here on, poststop hooks run whatever happens, as the
		// runtime spec asks of a failed create too.
		rec.Poststop, rec.HookNetns = true, nsPath
		if err := rec.save(); err != nil {
			return nil, err
		}
		if err := hooks.create(ctx); err != nil {
			return nil, err
		}
	}
	if rec.Netns != "" && cfg.CNINetwork != "" {
		if err := attachCNI(ctx, cfg, ns, r.ID, rec); err != nil {
			return nil, err
		}
	}
	var netw *network.Network
	if nsPath != "" {
		netw, err = network.Setup(ctx, nsPath, network.Options{
			Hostname: hostname(spec), ResolvConf: podResolvConf(spec), Logger: logger,
			Record: func(st *network.State) error {
				rec.Network = st
				return rec.save()
			},
		})
		if err != nil {
			return nil, fmt.Errorf("pod network: %w", err)
		}
		defer func() {
			if retErr != nil {
				if err := netw.Teardown(ctx); err != nil {
					logger.WithError(err).Warn("undo pod network")
				}
			}
		}()
		for i, nic := range netw.NICs() {
			qs.NICs = append(qs.NICs, qemu.NIC{ID: fmt.Sprintf("net%d", i), TapFD: fds.Add(nic.Tap), MAC: nic.MAC.String()})
		}
	}

	var nics []network.NIC
	if netw != nil {
		nics = netw.NICs()
	}
	seed, err := seedDrive(ns, spec, desc, rec, rootfs, mounts, nics)
	if err != nil {
		return nil, err
	}
	qs.Drives = append(qs.Drives, seed)

	limits := &cgroupLimits{guest: int64(desc.MemoryMiB) << 20, overhead: cfg.MemoryOverheadBytes(), memLimit: specMemoryLimit(spec)}
	if err := limits.create(ctx, spec, rec); err != nil {
		return nil, err
	}

	bootCtx, cancel := context.WithTimeout(ctx, desc.BootTimeout)
	defer cancel()
	stderr := logger.WriterLevel(logrus.WarnLevel)
	vm, err := qemu.Launch(bootCtx, qemu.LaunchConfig{
		Binary: binary, Spec: qs, Files: fds.Files(), Stderr: stderr, Dir: rec.RuntimeDir,
		// QEMU starts in the VM's cgroup: all it allocates, the kernel
		// it loads into guest RAM included, is charged there. It runs in
		// the VM's network namespace, where /proc/PID/ns/net leads
		// tools such as `nerdctl inspect` and `nsenter -t PID -n`.
		Start: func(cmd *exec.Cmd) error { return limits.start(cmd, netnsSteps(nsPath)...) },
	})
	if err != nil {
		stderr.Close()
		return nil, fmt.Errorf("start vm %s: %w", r.ID, err)
	}
	rec.Pid = vm.Pid()
	rec.PidStart, _ = processStart(vm.Pid())
	if err = rec.save(); err != nil {
		_ = vm.Kill()
		<-vm.Done()
		stderr.Close()
		return nil, err
	}
	logger.WithFields(log.Fields{"pid": vm.Pid(), "accel": qs.Accel, "nics": len(qs.NICs)}).Info("vm created")
	return &qemuVM{VM: vm, cgroupLimits: limits, console: shimEnd, rec: rec, stderr: stderr, network: netw, hooks: hooks, onRelease: release}, nil
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

// rootDrive checks the image's disk and makes the qcow2 overlay the VM
// boots from, in the container's writable layer; the record names the
// overlay before it exists.
func rootDrive(ctx context.Context, cfg config.Config, desc *config.VM, boot *image.Boot, rec *record, rootfs string) (qemu.Drive, error) {
	info, err := image.Inspect(ctx, cfg.QEMUImg, boot, image.Limits{MaxVirtualSize: cfg.MaxDiskBytes()})
	if err != nil {
		return qemu.Drive{}, err
	}
	if desc.RootDiskSize > 0 && desc.RootDiskSize < info.VirtualSize {
		return qemu.Drive{}, fmt.Errorf("annotation %s: %d bytes is smaller than the image's disk %s (%d bytes); disks can only grow: %w",
			config.AnnotationRootDiskSize, desc.RootDiskSize, boot.InImage(boot.Disk), info.VirtualSize, errdefs.ErrInvalidArgument)
	}
	rec.Overlay = filepath.Join(rootfs, overlayDir, "root.qcow2")
	if err = rec.save(); err != nil {
		return qemu.Drive{}, err
	}
	if err = os.MkdirAll(filepath.Dir(rec.Overlay), 0o700); err != nil {
		return qemu.Drive{}, fmt.Errorf("create overlay dir: %w", err)
	}
	if err = image.CreateOverlay(ctx, cfg.QEMUImg, boot.Disk, boot.Format, info.VirtualSize, rec.Overlay, desc.RootDiskSize); err != nil {
		return qemu.Drive{}, err
	}
	return qemu.Drive{
		ID: "root", Path: rec.Overlay, Format: "qcow2",
		BackingPath: boot.Disk, BackingFormat: boot.Format,
		Driver: desc.DiskDriver, BootIndex: 1,
	}, nil
}

// launchSandbox starts a pod sandbox's pause process and remembers the
// pod netns it joined.
func (l *qemuLauncher) launchSandbox(ctx context.Context, r *CreateRequest, spec *specs.Spec) (VM, error) {
	nsPath, _ := specNetns(spec)
	s, err := launchSandbox(ctx, r, spec, nsPath)
	if err != nil {
		return nil, err
	}
	if nsPath != "" {
		key := fmt.Sprintf("/proc/%d/ns/net", s.Pid())
		l.mu.Lock()
		l.sandboxes[key] = nsPath
		l.mu.Unlock()
		s.onRelease = func() {
			l.mu.Lock()
			delete(l.sandboxes, key)
			l.mu.Unlock()
		}
	}
	return s, nil
}

// claimPod makes container id the pod's one VM. A VM pod runs one VM: the
// VM owns the pod's IP, which two VMs cannot share. The returned func gives
// the claim back.
func (l *qemuLauncher) claimPod(sandboxID, id string) (func(), error) {
	if sandboxID == "" {
		return func() {}, nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if other, ok := l.podVMs[sandboxID]; ok {
		return nil, fmt.Errorf("pod already runs a VM in container %s; a VM pod has one VM container: %w", other, errdefs.ErrFailedPrecondition)
	}
	l.podVMs[sandboxID] = id
	return func() {
		l.mu.Lock()
		delete(l.podVMs, sandboxID)
		l.mu.Unlock()
	}, nil
}

// podNetns maps a /proc/PID/ns/net path of one of this shim's pause
// processes to the pod netns it joined; other paths are returned as is.
func (l *qemuLauncher) podNetns(path string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if p, ok := l.sandboxes[path]; ok {
		return p
	}
	return path
}

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

// readSpec reads the bundle's OCI runtime spec.
func readSpec(bundle string) (*specs.Spec, error) {
	data, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil {
		return nil, fmt.Errorf("read bundle spec: %w", err)
	}
	var spec specs.Spec
	if err := json.Unmarshal(data, &spec); err != nil {
		return nil, fmt.Errorf("parse bundle spec: %w", errdefs.ErrInvalidArgument)
	}
	return &spec, nil
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

// vmNetns returns the network namespace the VM runs in and its NICs come
// from: the pod's (CRI), the one the spec names, or, when the spec asks
// for a new one, one the shim makes, pins and records for removal. ""
// means the host's: the VM then has no NIC.
func (l *qemuLauncher) vmNetns(ctx context.Context, ns, id string, spec *specs.Spec, rec *record) (string, error) {
	path, ok := specNetns(spec)
	switch {
	case !ok:
		return "", nil
	case path != "":
		// CRI names the pod's netns through the sandbox's pause process;
		// use the namespace's own path, which outlives that process.
		return l.podNetns(path), nil
	}
	rec.Netns = taskNetnsPath(ns, id)
	if err := rec.save(); err != nil {
		return "", err
	}
	if err := createNetns(rec.Netns); err != nil {
		return "", fmt.Errorf("network namespace for %s: %w", id, err)
	}
	log.G(ctx).WithField("netns", rec.Netns).Debug("network namespace created")
	return rec.Netns, nil
}

// attachCNI puts the namespace the shim made for the task on the CNI
// network cni_network names, unless hooks have given it a network already
// (nerdctl does). The attachment is recorded before ADD, so that release,
// or the delete action after a crash, detaches it.
func attachCNI(ctx context.Context, cfg config.Config, ns, id string, rec *record) error {
	empty, err := netnsIsEmpty(rec.Netns)
	if err != nil {
		return err
	}
	if !empty {
		log.G(ctx).WithField("id", id).Info("hooks gave the network namespace interfaces; cni_network not attached")
		return nil
	}
	att, err := network.AttachCNI(ctx, network.CNIConfig{
		Network: cfg.CNINetwork, ConfDir: cfg.CNIConfDir, BinDirs: cfg.CNIBinDirs,
		Record: func(a *network.CNIAttachment) error {
			rec.CNI = a
			return rec.save()
		},
	}, ns+"-"+id, rec.Netns)
	if err != nil {
		return fmt.Errorf("config cni_network: %w", err)
	}
	log.G(ctx).WithFields(log.Fields{"id": id, "network": att.Network, "ips": att.IPs}).Info("cni network attached")
	return nil
}

// netnsSteps moves a forking thread into the network namespace at path;
// none for the host's.
func netnsSteps(path string) []thread.Step {
	if path == "" {
		return nil
	}
	return []thread.Step{thread.JoinNetns(path)}
}

// hostname is the pod's host name: the spec's, or, for a CRI container
// (which shares the sandbox's UTS namespace and so has none in its spec),
// the content of the /etc/hostname file the CRI mounts into it.
func hostname(spec *specs.Spec) string {
	if spec.Hostname != "" {
		return spec.Hostname
	}
	for _, m := range spec.Mounts {
		if m.Destination == "/etc/hostname" {
			if data, err := os.ReadFile(m.Source); err == nil {
				return strings.TrimSpace(string(data))
			}
		}
	}
	return ""
}

// qemuVM is a QEMU VM with the host resources recorded for it.
type qemuVM struct {
	*qemu.VM
	*cgroupLimits
	console net.Conn
	rec     *record
	stderr  io.Closer
	network *network.Network // nil without a pod network
	hooks   *ociHooks

	onRelease func() // gives the pod back its VM slot
}

// Console returns the shim's end of the guest's serial port.
func (v *qemuVM) Console() io.ReadWriteCloser { return v.console }

// GuestAgent returns the channel to the guest's agent.
func (v *qemuVM) GuestAgent() GuestAgent {
	if a := v.Agent(); a != nil {
		return a
	}
	return nil
}

// beforeStart runs the startContainer hooks, in the VM's network
// namespace, just before the vCPUs run.
func (v *qemuVM) beforeStart(ctx context.Context) error {
	return v.hooks.run(ctx, phaseStartContainer, specs.StateCreated, v.Pid())
}

// afterStart runs the poststart hooks once the vCPUs run; their failures
// are logged, as the runtime spec asks.
func (v *qemuVM) afterStart(ctx context.Context) {
	v.hooks.runAll(ctx, phasePoststart, specs.StateRunning, v.Pid())
}

// Release frees what the VM held once QEMU has exited.
func (v *qemuVM) Release(ctx context.Context) {
	v.stderr.Close()
	if v.network != nil {
		if err := v.network.Teardown(ctx); err != nil {
			log.G(ctx).WithError(err).WithField("id", v.rec.ID).Warn("tear down pod network")
		} else {
			v.rec.Network = nil // restored; nothing left for release to redo
		}
	}
	v.rec.release(ctx)
	v.onRelease()
}
