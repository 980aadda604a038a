package launch

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/vmshim/vmshim/cloudinit"
	"github.com/vmshim/vmshim/config"
	"github.com/vmshim/vmshim/hostdev"
	"github.com/vmshim/vmshim/image"
	"github.com/vmshim/vmshim/jail"
	"github.com/vmshim/vmshim/network"
	"github.com/vmshim/vmshim/oom"
	"github.com/vmshim/vmshim/procmem"
	"github.com/vmshim/vmshim/qemu"
	"github.com/vmshim/vmshim/topology"
)

// build is one Create on its way through Launch's steps: what the steps
// have resolved, opened and made so far. Everything a step makes on the
// host is pushed on the undo stack of rec, the task record (see
// record.push), so rollback, Delete and the delete action after a crash
// all undo it through rec.release; the files it opened are closed once
// QEMU holds its own copies.
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
	fetched  *fetched        // the disk fetched by URL, if any
	vnc      *vncServer      // with vmshim.io/graphics vnc
	layout   topology.Layout // the vCPUs on the container's cpuset, if it has one

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

// inJail makes f visible to QEMU: bound at target in the jail, or, with
// no jail, passed as an fd QEMU opens through /proc. It returns the path
// QEMU opens.
func (c *build) inJail(f *os.File, target string) string {
	if c.j != nil {
		c.j.Binds = append(c.j.Binds, jail.Bind{Target: target, File: f, ReadOnly: true})
		return target
	}
	return "/proc/self/fd/" + strconv.Itoa(c.fds.Add(f))
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

// newJail describes a jail of the VM's ids rooted at name in the runtime
// directory.
func (c *build) newJail(name string) *jail.Jail {
	return &jail.Jail{Root: filepath.Join(c.rec.RuntimeDir, name), UID: c.rec.JailID, GID: c.rec.JailID}
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

// hostDevices opens the block devices the container was given, with the
// access it was given, as extra disks, and adds its VFIO functions.
func (c *build) hostDevices(ctx context.Context) error {
	devs, err := hostdev.ResolveDevices(c.spec, c.sysfs(), c.cfg.PrivilegedDevices)
	if err != nil {
		return err
	}
	for i, b := range devs.Block {
		if v := c.desc.RootVolume; v != nil && v.Block && b.ContainerPath == v.Path {
			continue // the root disk (see keptDisk)
		}
		f, err := openBlockDevice(b, 0)
		if err != nil {
			return err
		}
		c.qs.Drives = append(c.qs.Drives, qemu.Drive{
			ID: fmt.Sprintf("blk%d", i), Path: c.fdSet(c.keep(f)), Format: qemu.FormatRaw,
			HostDevice: true, ReadOnly: b.ReadOnly, Driver: c.desc.DiskDriver,
		})
	}
	c.qs.VFIO, c.vfio = devs.VFIO, devs.VFIOGroups
	switch {
	case devs.Privileged:
		c.logger.WithField("devices", strings.Join(devs.Ignored, " ")).Warn("privileged container: its host devices are not given to the vm (config privileged_devices)")
	case len(devs.Ignored) > 0:
		c.logger.WithField("devices", strings.Join(devs.Ignored, " ")).Info("devices not given to the vm")
	}
	return nil
}

// openBlockDevice opens a container's block device with its access (and
// the extra open flags) and checks the node is the device the spec names.
func openBlockDevice(b hostdev.BlockDevice, extra int) (*os.File, error) {
	flags := os.O_RDWR | extra
	if b.ReadOnly {
		flags = os.O_RDONLY
	}
	f, err := os.OpenFile(b.HostPath, flags|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("device %s: %w", b.ContainerPath, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFBLK ||
		int64(unix.Major(st.Rdev)) != b.Major || int64(unix.Minor(st.Rdev)) != b.Minor {
		f.Close()
		return nil, fmt.Errorf("device %s: %s is not block device %d:%d: %w", b.ContainerPath, b.HostPath, b.Major, b.Minor, errdefs.ErrFailedPrecondition)
	}
	return f, nil
}

// shares exposes the container's volumes to the guest over virtio-9p.
func (c *build) shares(ctx context.Context) error {
	var hugePages []int64
	c.mounts, hugePages = shares(ctx, c.spec, &c.qs, c.desc.RootVolume)
	// A hugetlbfs volume is how Kubernetes gives a pod huge pages; with
	// containerd's default disable_hugetlb_controller the spec carries
	// no hugepages limit, so the volume alone says guest RAM goes there.
	for _, size := range hugePages {
		if err := c.desc.OnHugePages(size, "a hugetlbfs volume"); err != nil {
			return err
		}
	}
	return nil
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

// seed writes the cloud-init seed into the VM's files directory.
func (c *build) seed(context.Context) error {
	var nics []network.NIC
	if c.netw != nil {
		nics = c.netw.NICs()
	}
	files, err := cloudInitFiles(c.ns, c.spec, c.host, c.desc, c.mounts, nics)
	if err != nil {
		return err
	}
	f, err := c.create(image.SeedName)
	if err != nil {
		return err
	}
	if err := cloudinit.WriteSeed(f, files); err != nil {
		return fmt.Errorf("cloud-init seed: %w", err)
	}
	// QEMU opens the seed read-only: it needs a read-only fd of it.
	ro, err := os.OpenFile(fmt.Sprintf("/proc/self/fd/%d", f.Fd()), os.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("cloud-init seed: %w", err)
	}
	c.qs.Drives = append(c.qs.Drives, seedDrive(c.fdSet(c.keep(ro)), c.desc.DiskDriver))
	return nil
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

// accel chooses the accelerator (once per shim), which the jail needs to
// know: KVM wants /dev/kvm in it.
func (c *build) accel(ctx context.Context) (err error) {
	c.qs.Accel, err = c.launcher.accel(ctx, c.cfg.Accel, c.binary)
	return err
}

// jail describes QEMU's jail, unless config jail is off: the VM's ids and
// the container's non-zero groups (so volumes shared with the pod's group
// work), the kernel, initrd and shares bound in, and the device nodes
// QEMU opens itself (/dev/kvm, VFIO).
func (c *build) jail(context.Context) error {
	if c.cfg.Jail {
		c.j = c.newJail("root")
		c.j.Groups = containerGroups(c.spec)
		if err := os.Mkdir(c.j.Root, 0o700); err != nil {
			return fmt.Errorf("jail: %w", err)
		}
	}
	if c.boot.KernelFile != nil {
		c.qs.Kernel = c.inJail(c.boot.KernelFile, jail.VMDir+"/kernel")
		if c.boot.InitrdFile != nil {
			c.qs.Initrd = c.inJail(c.boot.InitrdFile, jail.VMDir+"/initrd")
		}
	}
	if c.j == nil {
		return nil
	}
	for i := range c.qs.Shares {
		sh := &c.qs.Shares[i]
		target := fmt.Sprintf("%s/share/%d", jail.VMDir, i)
		c.j.Binds = append(c.j.Binds, jail.Bind{Target: target, Source: sh.Path, ReadOnly: sh.ReadOnly})
		sh.Path = target
	}
	var nodes []string
	if c.qs.Accel == qemu.AccelKVM {
		nodes = append(nodes, "/dev/kvm")
	}
	if len(c.qs.VFIO) > 0 {
		c.j.Sysfs = true
		nodes = append(nodes, "/dev/vfio/vfio")
		for _, g := range c.vfio {
			c.j.Devices = append(c.j.Devices, jail.Device{Path: g.Path, Major: uint32(g.Major), Minor: uint32(g.Minor)})
		}
	}
	for _, n := range nodes {
		var st unix.Stat_t
		if err := unix.Stat(n, &st); err != nil {
			return fmt.Errorf("jail: device %s: %w", n, err)
		}
		c.j.Devices = append(c.j.Devices, jail.Device{Path: n, Major: unix.Major(st.Rdev), Minor: unix.Minor(st.Rdev)})
	}
	return nil
}

// containerGroups are the container's groups other than root's.
func containerGroups(spec *specs.Spec) []uint32 {
	if spec.Process == nil {
		return nil
	}
	var out []uint32
	for _, g := range append([]uint32{spec.Process.User.GID}, spec.Process.User.AdditionalGids...) {
		if g != 0 && !slices.Contains(out, g) {
			out = append(out, g)
		}
	}
	return out
}

// qemu starts QEMU paused, in the VM's cgroup, network namespace and jail,
// with its QMP and agent sockets as listening fds.
func (c *build) qemu(ctx context.Context) (err error) {
	c.qs.Name = c.r.ID
	c.qs.Sandbox, c.qs.Paused = c.cfg.Sandbox, true
	c.qs.VNC, c.qs.Windows, c.qs.Machine = c.desc.VNC, c.desc.Windows, c.desc.Machine
	if c.qs.Machine == config.MachineMicroVM && c.qs.Kernel == "" {
		return fmt.Errorf("annotation %s: %s boots a kernel directly, and the image boots a disk: %w",
			config.AnnotationMachine, config.MachineMicroVM, errdefs.ErrInvalidArgument)
	}
	c.qs.QMPSocket = filepath.Join(c.rec.RuntimeDir, "qmp.sock")
	// Exec runs through qemu-guest-agent; a guest without one simply
	// never opens the port.
	c.qs.AgentSocket = filepath.Join(c.rec.RuntimeDir, "agent.sock")
	for _, l := range []struct {
		path string
		fd   *int
	}{{c.qs.QMPSocket, &c.qs.QMPFD}, {c.qs.AgentSocket, &c.qs.AgentFD}} {
		f, err := qemu.Listen(l.path)
		if err != nil {
			return err
		}
		*l.fd = c.fds.Add(c.keep(f))
	}
	steps := netnsSteps(c.nsPath)
	if c.j != nil {
		steps = append(steps, c.j.Enter)
	}
	bootCtx, cancel := context.WithTimeout(ctx, c.desc.BootTimeout)
	defer cancel()
	stderr := c.logger.WriterLevel(logrus.WarnLevel)
	vm, err := qemu.Launch(bootCtx, qemu.LaunchConfig{
		Binary: c.binary, Spec: c.qs, Files: c.fds.Files(), Stderr: stderr, Dir: c.rec.RuntimeDir,
		// QEMU starts in the VM's cgroup: all it allocates, the kernel
		// it loads into guest RAM included, is charged there. It runs in
		// the VM's network namespace, where /proc/PID/ns/net leads
		// tools such as `nerdctl inspect` and `nsenter -t PID -n`.
		Start: func(cmd *exec.Cmd) error {
			if c.j != nil {
				c.j.Apply(cmd)
			}
			return c.limits.start(cmd, steps...)
		},
		Span: func(phase string, begin time.Time) { Span(c.logger, phase, begin) },
	})
	if err != nil {
		stderr.Close()
		return fmt.Errorf("start vm %s: %w", c.r.ID, err)
	}
	pidStart, _ := processStart(vm.Pid())
	if err := c.rec.push(madeProcess, func(r *Record) { r.Pid, r.PidStart = vm.Pid(), pidStart }); err != nil {
		_ = vm.Kill()
		<-vm.Done()
		stderr.Close()
		return err
	}
	if err := setOOMScoreAdj(vm.Pid(), c.spec); err != nil {
		stderr.Close()
		return err // the rollback stops QEMU
	}
	c.vm = &qemuVM{proc: vm, limits: c.limits, console: c.console, rec: c.rec, stderr: stderr, hooks: c.hooks, oom: c.watchOOM()}
	if c.vnc != nil {
		c.vnc.vm.Store(vm)
	}
	c.pageOutBootFiles(vm)
	return nil
}

// pageOutBootFiles has the kernel reclaim, off the way to the guest
// running, QEMU's pages of the kernel and initrd of a direct kernel boot
// (procmem.PageOut): the guest has its copy by now. The firmware then
// reads the initrd (and a compressed kernel) through fw_cfg, which brings
// their pages back, until it starts the kernel: the shim does it again
// at the guest's first console output, which comes from the kernel, and
// once more bootFilesRead later, for a kernel that prints nothing.
func (c *build) pageOutBootFiles(vm *qemu.VM) {
	var ids []procmem.FileID
	for _, f := range []*os.File{c.boot.KernelFile, c.boot.InitrdFile} {
		if f == nil {
			continue
		}
		id, err := procmem.FileIDOf(f)
		if err != nil {
			c.logger.WithError(err).Debug("page out boot files")
			return
		}
		ids = append(ids, id)
	}
	if len(ids) == 0 {
		return
	}
	logger := c.logger
	pageOut := func(when string) {
		begin := time.Now()
		if err := procmem.PageOut(vm.Pid(), ids...); err != nil {
			logger.WithError(err).WithField("when", when).Debug("page out boot files")
			return
		}
		logger.WithFields(log.Fields{"when": when, "ms": time.Since(begin).Milliseconds()}).Debug("boot files paged out")
	}
	c.vm.console = &firstRead{Conn: c.vm.console, then: func() { go pageOut("guest output") }}
	go func() {
		pageOut("qemu started")
		select {
		case <-vm.Done():
		case <-time.After(bootFilesRead):
			pageOut("after boot")
		}
	}()
}

// firstRead is a connection that calls then once, when a read first
// returns data.
type firstRead struct {
	net.Conn
	once sync.Once
	then func()
}

func (f *firstRead) Read(p []byte) (int, error) {
	n, err := f.Conn.Read(p)
	if n > 0 {
		f.once.Do(f.then)
	}
	return n, err
}

// bootFilesRead is how long after QEMU's start a guest's firmware is done
// reading the kernel and initrd through fw_cfg, with room to spare.
const bootFilesRead = 30 * time.Second

// watchOOM watches the VM's memory cgroup for OOM kills, so that the task
// reports them; without a cgroup, or if it cannot be watched, the VM
// runs unwatched.
func (c *build) watchOOM() *oom.Watcher {
	if c.limits.memoryDir() == "" {
		return nil
	}
	w, err := oom.Watch(context.Background(), c.limits.memoryDir())
	if err != nil {
		c.logger.WithError(err).Warn("oom kills of this vm will not be reported")
		return nil
	}
	return w
}
