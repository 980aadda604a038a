package launch

import (
	"context"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/vmshim/vmshim/config"
	"github.com/vmshim/vmshim/network"
	"github.com/vmshim/vmshim/qemu"
	"github.com/vmshim/vmshim/thread"

	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// netnsDir is where the shim pins the network namespaces it makes, next to
// those of `ip netns` and the CRI, so that `ip netns` lists them.
const netnsDir = "/run/netns"

// taskNetnsPath names the network namespace the shim makes for a task
// whose spec asks for a new one without a path.
func taskNetnsPath(ns, id string) string {
	sum := sha256.Sum256([]byte(ns + "/" + id))
	return filepath.Join(netnsDir, "vmshim-"+hex.EncodeToString(sum[:8]))
}

// createNetns makes a new network namespace with its loopback up and pins
// it with a bind mount at path. On failure nothing is left at path.
func createNetns(path string) (retErr error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("create %s: %w", filepath.Dir(path), err)
	}
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return fmt.Errorf("create netns mount point: %w", err)
	}
	f.Close()
	defer func() {
		if retErr != nil {
			_ = removeNetns(path)
		}
	}()
	return thread.Run(func() error {
		if err := unix.Mount("/proc/thread-self/ns/net", path, "none", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("pin netns at %s: %w", path, err)
		}
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return fmt.Errorf("loopback in new netns: %w", err)
		}
		if err := netlink.LinkSetUp(lo); err != nil {
			return fmt.Errorf("loopback up in new netns: %w", err)
		}
		return nil
	}, thread.NewNetns)
}

// removeNetns unpins and removes a namespace createNetns made; a missing
// one is removed already.
func removeNetns(path string) error {
	if err := mount.Unmount(path, unix.MNT_DETACH); err != nil &&
		!errors.Is(err, os.ErrNotExist) && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("unmount netns %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove netns %s: %w", path, err)
	}
	return nil
}

// netnsIsEmpty reports whether the namespace at path has no interface
// but lo: nothing (a hook, say) has given it a network.
func netnsIsEmpty(path string) (bool, error) {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return false, fmt.Errorf("open netns %s: %w", path, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return false, fmt.Errorf("netlink in netns %s: %w", path, err)
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		return false, fmt.Errorf("list links in netns %s: %w", path, err)
	}
	for _, l := range links {
		if l.Attrs().Flags&net.FlagLoopback == 0 {
			return false, nil
		}
	}
	return true, nil
}

// netns finds the VM's network namespace, or makes it when the spec asks
// for a new one, and gives it its network: the create hooks and a CNI
// network. It comes before the disks, as a disk by URL is fetched from
// there.
func (c *build) netns(ctx context.Context) error {
	var err error
	if c.nsPath, err = c.launcher.vmNetns(ctx, c.ns, c.r.ID, c.spec, c.rec); err != nil {
		return err
	}
	c.hooks = newOCIHooks(c.r.ID, c.r.Bundle, c.spec, c.nsPath)
	if c.hooks.any() {
		// From here on, poststop hooks run whatever happens, as the
		// runtime spec asks of a failed create too.
		if err := c.rec.push(madePoststop, func(r *Record) { r.Poststop, r.HookNetns = true, c.nsPath }); err != nil {
			return err
		}
		if err := c.hooks.create(ctx); err != nil {
			return err
		}
	}
	if c.rec.Netns != "" && c.cfg.CNINetwork != "" {
		return attachCNI(ctx, c.cfg, c.ns, c.r.ID, c.rec)
	}
	return nil
}

// vmNetns returns the network namespace the VM runs in and its NICs come
// from: the pod's (CRI), the one the spec names, or, when the spec asks
// for a new one, one the shim makes, pins and records for removal. ""
// means the host's: the VM then has no NIC.
func (l *qemuLauncher) vmNetns(ctx context.Context, ns, id string, spec *specs.Spec, rec *Record) (string, error) {
	path, ok := specNetns(spec)
	switch {
	case !ok:
		return "", nil
	case path != "":
		// CRI names the pod's netns through the sandbox's pause process;
		// use the namespace's own path, which outlives that process.
		return podNetns(path), nil
	}
	if err := rec.push(madeNetns, func(r *Record) { r.Netns = taskNetnsPath(ns, id) }); err != nil {
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
// (nerdctl does). The attachment is pushed before ADD, so that release,
// or the delete action after a crash, detaches it.
func attachCNI(ctx context.Context, cfg config.Config, ns, id string, rec *Record) error {
	empty, err := netnsIsEmpty(rec.Netns)
	if err != nil {
		return err
	}
	if !empty {
		log.G(ctx).WithField("id", id).Info("hooks gave the network namespace interfaces; cni_network not attached")
		return nil
	}
	att, err := network.PrepareCNI(ctx, network.CNIConfig{
		Network: cfg.CNINetwork, ConfDir: cfg.CNIConfDir, BinDirs: cfg.CNIBinDirs,
	}, ns+"-"+id, rec.Netns)
	if err != nil {
		return fmt.Errorf("config cni_network: %w", err)
	}
	if err := rec.push(madeCNI, func(r *Record) { r.CNI = att }); err != nil {
		return err
	}
	if err := att.Attach(ctx); err != nil {
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

// network wires the VM's network namespace (see netns): the console, and
// one NIC per CNI interface.
func (c *build) network(ctx context.Context) error {
	guestEnd, shimEnd, err := consolePair()
	if err != nil {
		return err
	}
	c.keep(guestEnd)
	c.console = shimEnd
	c.qs.ConsoleFD = c.fds.Add(guestEnd)
	if c.nsPath == "" {
		return nil
	}
	if err := checkSteering(c.nsPath, c.desc.Mesh, c.logger); err != nil {
		return err
	}
	if err := c.adoptMACs(); err != nil {
		return err
	}
	opts := network.Options{Hostname: c.host, ResolvConf: podResolvConf(c.spec), Logger: c.logger}
	if c.desc.VNC {
		c.vnc = &vncServer{logger: c.logger}
		opts.Local = c.vnc.local()
	}
	pl, err := network.Inspect(ctx, c.nsPath, opts)
	if err != nil {
		return fmt.Errorf("pod network: %w", err)
	}
	if err := c.rec.push(madeNetwork, func(r *Record) { r.Network = pl.State() }); err != nil {
		pl.Close()
		return err
	}
	if c.netw, err = pl.Wire(ctx); err != nil {
		return fmt.Errorf("pod network: %w", err)
	}
	c.rec.net = c.netw
	for i, nic := range c.netw.NICs() {
		c.qs.NICs = append(c.qs.NICs, qemu.NIC{ID: fmt.Sprintf("net%d", i), TapFD: c.fds.Add(nic.Tap), MAC: nic.MAC.String(), Model: c.desc.NICModel})
	}
	return nil
}

// checkSteering refuses the VM in one line when the netns at path
// steers traffic through a proxy with netfilter rules, as a service
// mesh's init container installs them, unless mesh is MeshBypass: the
// tc datapath moves the VM's packets between the CNI interface and the
// tap before netfilter sees them, so the VM's traffic would bypass the
// proxy and the mesh's policies (docs/kubernetes.md, service meshes).
func checkSteering(path, mesh string, logger *log.Entry) error {
	rules, err := network.Steering(path)
	if err != nil {
		return fmt.Errorf("pod network: %w", err)
	}
	if len(rules) == 0 {
		return nil
	}
	if mesh == config.MeshBypass {
		logger.WithField("rules", rules).Warnf("the pod's network namespace steers traffic through a proxy; the VM's traffic bypasses it (%s: %s)", config.AnnotationMesh, config.MeshBypass)
		return nil
	}
	return fmt.Errorf("the pod's network namespace steers traffic through a proxy (%s, as a service mesh's init container installs); "+
		"the VM's traffic would bypass it and the mesh's policies: keep the pod out of the mesh (for Istio, the pod annotation sidecar.istio.io/inject: \"false\"), or set %s: %s: %w",
		strings.Join(rules, ", "), config.AnnotationMesh, config.MeshBypass, errdefs.ErrFailedPrecondition)
}

// undoNetns removes the network namespace the shim made (madeNetns).
func undoNetns(_ context.Context, r *Record) error { return removeNetns(r.Netns) }

// undoCNI takes the namespace the shim made off its cni_network (madeCNI).
func undoCNI(ctx context.Context, r *Record) error { return r.CNI.Detach(ctx) }

// undoNetwork gives the VM's network namespace back its CNI interfaces
// as they were (madeNetwork): torn down by the process that wired it, or
// restored from the record after a crash.
func undoNetwork(ctx context.Context, r *Record) error {
	if r.net != nil {
		return r.net.Teardown(ctx)
	}
	return network.Restore(ctx, r.Network)
}
