package launch

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/moby/sys/mountinfo"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/vmshim/vmshim/cloudinit"
	"github.com/vmshim/vmshim/config"
	"github.com/vmshim/vmshim/hostdev"
	"github.com/vmshim/vmshim/image"
	"github.com/vmshim/vmshim/jail"
	"github.com/vmshim/vmshim/network"
	"github.com/vmshim/vmshim/qemu"
	"github.com/vmshim/vmshim/rootdisk"
	"github.com/vmshim/vmshim/topology"
)

// build is one Create on its way through Launch's steps: what the steps
// have resolved, opened and made so far; each field is set by the step
// that makes it (see steps) and read only by the steps that need it.
// Everything a step makes on the host is pushed on the undo stack of rec,
// the task record (see Record.push), so rollback, Delete and the delete
// action after a crash all undo it through rec.Release; the files it
// opened are closed once QEMU holds its own copies.
type build struct {
	launcher *qemuLauncher
	r        *Request
	cfg      config.Config
	spec     *specs.Spec
	ns       string
	logger   *log.Entry

	desc     *config.VM
	host     string // the pod's host name
	rec      *Record
	filesDir *image.FilesDir // the VM's files directory in the rootfs, once made
	boot     *image.Boot
	rootDir  string // the rootfs the image is in
	img      image.QEMUImg
	binary   string // QEMU, an absolute path
	mounts   []cloudinit.Mount
	console  net.Conn
	nsPath   string
	hooks    *ociHooks
	netw     *network.Network
	limits   *cgroupLimits
	j        *jail.Jail     // nil when config jail is off
	vfio     []hostdev.Node // the VFIO group nodes QEMU opens
	vm       *qemuVM
	fetched  *fetched             // the disk fetched by URL, if any
	vnc      *vncServer           // with vmshim.io/graphics vnc
	layout   topology.Layout      // the vCPUs on the container's cpuset, if it has one
	saved    *rootdisk.SavedState // the state a suspend left on that volume, to resume
	tpmState string               // where the TPM's state is, for errors; "" without a TPM

	qs    qemu.Spec
	fds   qemu.FDSet
	sets  int        // fd sets filed so far
	files []*os.File // closed once QEMU has started
}

// sysfs is where the host's sysfs is read: hostdev.DefaultSysfs unless
// the launcher says otherwise.
func (c *build) sysfs() string {
	if c.launcher == nil || c.launcher.sysfs == "" {
		return hostdev.DefaultSysfs
	}
	return c.launcher.sysfs
}

// keep has f closed once QEMU has started, or the launch failed.
func (c *build) keep(f *os.File) *os.File {
	c.files = append(c.files, f)
	return f
}

// fdSet passes f to QEMU in an fd set of its own and returns the path
// QEMU opens it by.
func (c *build) fdSet(f *os.File) string {
	set := c.sets
	c.sets++
	c.qs.FDSets = append(c.qs.FDSets, qemu.AddFD{Set: set, FD: c.fds.Add(f)})
	return qemu.FDSetPath(set)
}

func (c *build) closeFiles() {
	for _, f := range c.files {
		f.Close()
	}
	c.files = nil
	if c.boot != nil {
		c.boot.Close()
	}
	if c.filesDir != nil {
		c.filesDir.Close()
	}
	if c.saved != nil {
		c.saved.Close()
	}
}

// rollback undoes what the steps made, newest first, as Delete would.
func (c *build) rollback(ctx context.Context) {
	if c.console != nil {
		c.console.Close()
	}
	if c.rec != nil {
		if err := c.rec.Release(ctx); err != nil {
			c.logger.WithError(err).Warn("undo failed create; the delete action retries")
		}
	}
}

// resolve turns the config, the spec and its annotations into the VM's
// description, and finds the programs it needs.
func (c *build) resolve(ctx context.Context) error {
	var err error
	if c.desc, err = config.Resolve(c.cfg, c.r.ID, c.spec); err != nil {
		return err
	}
	if err := newOCIHooks(c.r.ID, c.r.Bundle, c.spec, "").check(); err != nil {
		return err
	}
	if c.host, err = hostname(c.spec); err != nil {
		return err
	}
	if c.binary, err = program("config qemu_binary", c.cfg.QEMUBinary); err != nil {
		return err
	}
	c.img.Path, err = program("config qemu_img", c.cfg.QEMUImg)
	return err
}

// program finds a command (what names where it comes from: a config
// key); the jails show only /usr, so it must be there.
func program(what, name string) (string, error) {
	p, err := exec.LookPath(name)
	if err == nil {
		p, err = filepath.EvalSymlinks(p)
	}
	if err != nil {
		return "", fmt.Errorf("%s: %q not found: %w", what, name, errdefs.ErrFailedPrecondition)
	}
	if !jail.Shows(p) {
		return "", fmt.Errorf("%s: %s is outside /usr, the only host directory the VM's jail shows: %w", what, p, errdefs.ErrFailedPrecondition)
	}
	return p, nil
}

// claimPod makes this container its pod's one VM.
func (c *build) claimPod(context.Context) error {
	dir := sandboxBundle(c.r.Bundle, config.SandboxID(c.spec))
	if dir == "" {
		return nil
	}
	if err := c.rec.push(madePod, func(r *Record) { r.Pod = dir }); err != nil {
		return err
	}
	return ClaimPod(dir, c.r.ID)
}

// record starts the task record, claims the VM's jail ids and makes its
// runtime directory.
func (c *build) record(context.Context) error {
	c.rec = &Record{ID: c.r.ID, Bundle: c.r.Bundle}
	owner := c.ns + "/" + c.r.ID
	if err := c.rec.push(madeJailID, func(r *Record) { r.JailOwner = owner }); err != nil {
		return err
	}
	id, err := jail.Claim(idsDir, c.cfg.JailIDRange(), owner)
	if err != nil {
		return fmt.Errorf("config jail_ids: %w", err)
	}
	// Saved by the next push; until then, release finds the claim by its
	// owner.
	c.rec.JailID = id
	if err := c.rec.push(madeRuntimeDir, func(r *Record) { r.RuntimeDir = runtimeDir(c.ns, c.r.ID) }); err != nil {
		return err
	}
	if err := os.MkdirAll(c.rec.RuntimeDir, 0o700); err != nil {
		return fmt.Errorf("create runtime dir: %w", err)
	}
	c.img.Jail = c.newJail("img")
	return os.Mkdir(c.img.Jail.Root, 0o700)
}

// rootfs mounts the container's rootfs, when containerd has not, and
// finds the VM in it, its files open.
func (c *build) rootfs(context.Context) error {
	c.rootDir = filepath.Join(c.r.Bundle, "rootfs")
	if len(c.r.Rootfs) > 0 {
		if err := c.rec.push(madeRootfs, func(r *Record) { r.Rootfs = c.rootDir }); err != nil {
			return err
		}
		if err := mount.All(c.r.Rootfs, c.rootDir); err != nil {
			return fmt.Errorf("mount rootfs: %w", err)
		}
	}
	if c.desc.DiskURL != "" {
		// The disk comes from the URL (see fetchDisk); the image need
		// hold none, and a pointer to another is not read.
		c.boot = &image.Boot{Root: c.rootDir, URL: c.desc.DiskURL, SHA256: c.desc.DiskSHA256}
		return nil
	}
	var err error
	c.boot, err = image.Find(c.rootDir)
	return err
}

// create makes a file in the VM's files directory of the rootfs, making
// the directory first. The directory is pushed only once made, as an
// image that has one already is refused: so only what the shim made is
// ever removed.
func (c *build) create(name string) (*os.File, error) {
	if c.filesDir == nil {
		dir, err := image.MakeFilesDir(c.rootDir)
		if err != nil {
			return nil, err
		}
		c.filesDir = dir
		if err := c.rec.push(madeVMFiles, func(r *Record) { r.VMFiles = c.rootDir }); err != nil {
			return nil, err
		}
	}
	f, err := c.filesDir.Create(name)
	if err != nil {
		return nil, err
	}
	return c.keep(f), nil
}

// cgroup makes the VM's cgroup, sized guest RAM plus overhead. It comes
// before the disks: qemu-img, which reads the untrusted image, runs in
// it too, so what a crafted image makes it allocate is charged to the
// VM, under the VM's limit.
func (c *build) cgroup(ctx context.Context) error {
	c.limits = &cgroupLimits{guest: int64(c.desc.MemoryMiB) << 20, overhead: c.cfg.MemoryOverheadBytes(), memLimit: specMemoryLimit(c.spec)}
	if err := c.limits.create(ctx, c.spec, c.rec); err != nil {
		return err
	}
	c.img.Start = c.limits.start
	return nil
}

// releaseJailID gives back the task's jail id once no process runs with
// it: whatever a jailed program left behind (QEMU's or qemu-img's
// children, should a namespace not have taken them) is killed first, so
// that the VM that gets the id next inherits nothing.
func releaseJailID(ctx context.Context, r *Record) error {
	return jail.ReleaseEmpty(idsDir, r.JailID, r.JailOwner, func(id uint32, pids []int) {
		log.G(ctx).WithFields(log.Fields{"id": r.ID, "jail_id": id, "pids": pids}).Warn("killed processes left with the vm's jail id")
	})
}

// unmountRootfs unmounts the rootfs the shim mounted, detaching it when a
// plain unmount fails. The one mount the shim made usually goes with one
// umount(2); the recursive unmount, which reads the node's whole mount
// table, runs only when that fails or leaves a mount there.
func unmountRootfs(rootfs string) error {
	if unix.Unmount(rootfs, 0) == nil {
		if still, err := mountinfo.Mounted(rootfs); err == nil && !still {
			return nil
		}
	}
	if err := mount.UnmountRecursive(rootfs, 0); err != nil {
		return mount.UnmountRecursive(rootfs, unix.MNT_DETACH)
	}
	return nil
}

// undoJailID gives back the task's jail id (madeJailID).
func undoJailID(ctx context.Context, r *Record) error { return releaseJailID(ctx, r) }

// undoRuntimeDir removes the VM's runtime directory (madeRuntimeDir).
func undoRuntimeDir(_ context.Context, r *Record) error { return os.RemoveAll(r.RuntimeDir) }

// undoVMFiles removes the VM's files directory the shim made in the
// rootfs (madeVMFiles).
func undoVMFiles(_ context.Context, r *Record) error { return image.RemoveFilesDir(r.VMFiles) }

// undoRootfs unmounts the rootfs the shim mounted (madeRootfs).
func undoRootfs(_ context.Context, r *Record) error { return unmountRootfs(r.Rootfs) }
