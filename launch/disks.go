package launch

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/vmshim/vmshim/config"
	"github.com/vmshim/vmshim/diskcache"
	"github.com/vmshim/vmshim/hostdev"
	"github.com/vmshim/vmshim/image"
	"github.com/vmshim/vmshim/network"
	"github.com/vmshim/vmshim/qemu"
	"github.com/vmshim/vmshim/rootdisk"
)

// disks checks the image's disk and gives the VM its root disk: an
// overlay over the image's disk made anew each boot, or the disk kept on
// the volume the pod names. A kernel boot takes the kernel and initrd.
func (c *build) disks(ctx context.Context) error {
	if c.boot.URL != "" {
		if err := c.fetchDisk(ctx); err != nil {
			return err
		}
	}
	if c.boot.ISO != "" {
		return c.installerDisks(ctx)
	}
	if c.boot.Disk == "" {
		if c.desc.RootVolume != nil {
			return fmt.Errorf("annotation %s: the image boots a kernel; it has no disk to keep on a volume: %w",
				config.AnnotationRootDiskVolume, errdefs.ErrInvalidArgument)
		}
		c.qs.Append = c.desc.KernelCmdline // the jail step passes the kernel
		return nil
	}
	info, err := image.Inspect(ctx, c.img, c.boot, image.Limits{MaxVirtualSize: c.cfg.MaxDiskBytes()})
	if err != nil {
		return c.refuseFetched(err)
	}
	if c.desc.RootDiskSize > 0 && c.desc.RootDiskSize < info.VirtualSize {
		return fmt.Errorf("annotation %s: %d bytes is smaller than the image's disk %s (%d bytes); disks can only grow: %w",
			config.AnnotationRootDiskSize, c.desc.RootDiskSize, c.boot.InImage(c.boot.Disk), info.VirtualSize, errdefs.ErrInvalidArgument)
	}
	if c.desc.RootVolume != nil {
		return c.keptDisk(ctx, info)
	}
	overlay, err := c.create(image.OverlayName)
	if err != nil {
		return err
	}
	if err := image.CreateOverlay(ctx, c.img, overlay, c.boot.Format, info.VirtualSize, c.desc.RootDiskSize); err != nil {
		return err
	}
	c.qs.Drives = append(c.qs.Drives, qemu.Drive{
		ID: "root", Path: c.fdSet(overlay), Format: qemu.FormatQCOW2,
		BackingPath: c.fdSet(c.boot.DiskFile), BackingFormat: c.boot.Format,
		Driver: c.desc.DiskDriver, BootIndex: 1,
	})
	return nil
}

// keptDisk claims the root disk on the pod's volume, made from the
// image's disk on its first boot. It is the volume's, never undone: the
// claim is a lock on the file QEMU holds, and ends with it.
func (c *build) keptDisk(ctx context.Context, info *image.Info) error {
	v := c.desc.RootVolume
	img := rootdisk.Image{File: c.boot.DiskFile, Format: c.boot.Format, VirtualSize: info.VirtualSize, Name: c.boot.InImage(c.boot.Disk)}
	opts := rootdisk.Options{
		Size: c.desc.RootDiskSize, Recreate: c.desc.RootDiskPolicy == config.RootDiskRecreate,
		MaxVirtualSize: c.cfg.MaxDiskBytes(), Img: c.img, Log: c.log,
	}
	if v.Block {
		return c.keptDiskOnDevice(ctx, img, opts)
	}
	d, err := rootdisk.OnDirectory(ctx, v.HostDir, v.Path, img, opts)
	if err != nil {
		return err
	}
	c.logger.WithField("volume", v.Path).WithField("made", d.Made).Info("root disk kept on a volume")
	c.qs.Drives = append(c.qs.Drives, qemu.Drive{
		ID: "root", Path: c.fdSet(c.keep(d.File)), Format: qemu.FormatQCOW2,
		Driver: c.desc.DiskDriver, BootIndex: 1,
	})
	return c.openSavedState(d.File)
}

// keptDiskOnDevice claims the block volume the root disk is kept on, by
// opening it exclusively (O_EXCL, which lasts as long as QEMU's copy of
// the file), and writes the image's disk onto it on its first boot. The
// guest sees all of it but the end, which records what was written.
func (c *build) keptDiskOnDevice(ctx context.Context, img rootdisk.Image, opts rootdisk.Options) error {
	v := c.desc.RootVolume
	devs, err := hostdev.ResolveDevices(c.spec, c.sysfs(), c.cfg.PrivilegedDevices)
	if err != nil {
		return err
	}
	i := slices.IndexFunc(devs.Block, func(b hostdev.BlockDevice) bool { return b.ContainerPath == v.Path })
	switch {
	case i < 0 && devs.Privileged:
		return fmt.Errorf("root disk volume %s: a privileged container's devices are not given to its VM (config privileged_devices): %w", v.Path, errdefs.ErrFailedPrecondition)
	case i < 0:
		return fmt.Errorf("root disk volume %s: the container may not read the device: %w", v.Path, errdefs.ErrInvalidArgument)
	case devs.Block[i].ReadOnly:
		return fmt.Errorf("root disk volume %s: the container may not write the device: %w", v.Path, errdefs.ErrInvalidArgument)
	}
	f, err := openBlockDevice(devs.Block[i], unix.O_EXCL)
	if errors.Is(err, unix.EBUSY) {
		return fmt.Errorf("root disk volume %s is in use by another running VM, or mounted: %w", v.Path, errdefs.ErrUnavailable)
	}
	if err != nil {
		return err
	}
	c.keep(f)
	d, err := rootdisk.OnDevice(ctx, f, v.Path, img, opts)
	if err != nil {
		return err
	}
	c.logger.WithField("volume", v.Path).WithField("made", d.Made).Info("root disk kept on a block volume")
	c.qs.Drives = append(c.qs.Drives, qemu.Drive{
		ID: "root", Path: c.fdSet(f), Format: qemu.FormatRaw, HostDevice: true, Size: d.Size,
		Driver: c.desc.DiskDriver, BootIndex: 1,
	})
	return nil
}

// fetchDisk gets the disk the annotations or a pointer image name by URL
// from the node's disk cache, downloading it first if need be, and boots
// from it as from a disk in the image. The download, and the request that
// shows a disk already in the cache is the pod's to use, are made from the
// container's network namespace with the pod's DNS (podClient). The cache
// marks the disk in use for as long as a copy of its file is open, QEMU's
// among them: nothing to undo.
func (c *build) fetchDisk(ctx context.Context) error {
	if !c.cfg.URLDisks {
		return fmt.Errorf("disk-url: disks by URL and pointer images are turned off on this node (config url_disks): %w",
			errdefs.ErrFailedPrecondition)
	}
	u, err := diskcache.ParseURL(c.boot.URL)
	if err != nil {
		return err
	}
	digest, err := diskcache.ParseDigest(c.boot.SHA256)
	if err != nil {
		return err
	}
	client, err := c.podClient()
	if err != nil {
		return err
	}
	defer client.CloseIdleConnections()
	cache := &diskcache.Cache{Dir: c.cfg.CacheDir, MaxSize: c.cfg.CacheMaxBytes(), MaxDisk: c.cfg.MaxDiskBytes(), Client: client, Logger: c.logger,
		MaxDownload: c.cfg.MaxDownloadBytes(), MaxRatio: int64(c.cfg.MaxDecompressionRatio), DownloadTimeout: c.cfg.DownloadTimeoutDuration()}
	d, err := cache.Get(ctx, u, digest, c.log)
	if err != nil {
		return err
	}
	c.boot.Close()
	c.boot = &image.Boot{DiskFile: d.File}
	c.fetched = &fetched{cache: cache, digest: digest}
	b, err := image.DiskBoot(d.File, u.Redacted())
	if err != nil {
		return c.refuseFetched(err)
	}
	c.boot = b
	return nil
}

// podClient is the HTTP client of the container's downloads: every
// connection is made in its network namespace (the pod's under the CRI,
// the one the spec names or the shim made under ctr and nerdctl), names
// are resolved by the nameservers of the pod's resolv.conf, and config
// url_deny_cidrs is refused. A container with no namespace of its own
// has no client.
func (c *build) podClient() (*http.Client, error) {
	servers, search, err := network.PodDNS(podResolvConf(c.spec))
	if err != nil {
		return nil, fmt.Errorf("disk-url: %w", err)
	}
	n := &diskcache.Netns{Path: c.nsPath, Nameservers: servers, Search: search, Deny: c.cfg.URLDeny()}
	client, err := diskcache.NewPodClient(c.cfg.CAFile, n)
	if err != nil && c.cfg.CAFile != "" && errdefs.IsInvalidArgument(err) {
		return nil, fmt.Errorf("config ca_file: %w", err)
	}
	return client, err
}

// fetched is a disk fetched by URL into the node's cache.
type fetched struct {
	cache  *diskcache.Cache
	digest string
}

// refuseFetched returns err, the reason the VM cannot boot the disk it
// fetched, once it has removed the disk from the cache (unless another VM
// uses it): a refused disk leaves nothing behind.
func (c *build) refuseFetched(err error) error {
	if c.fetched == nil {
		return err
	}
	c.boot.Close()
	c.boot = &image.Boot{}
	if _, rerr := c.fetched.cache.Remove(c.fetched.digest); rerr != nil {
		c.logger.WithError(rerr).Warn("remove a refused disk from the cache")
	}
	return err
}

// installerDiskSize is the empty root disk an installer ISO gets when
// vmshim.io/root-disk-size does not say.
const installerDiskSize = 20 << 30

// installerDisks gives an image that holds an installer's ISO an empty
// root disk and the ISO as a CD-ROM after it in the boot order: the empty
// disk does not boot, so the installer does, and once it has installed
// onto the disk, the disk boots. The CD-ROM goes on the disk's controller
// when that is SATA or IDE, else on SATA, which installers drive.
func (c *build) installerDisks(ctx context.Context) error {
	if c.desc.RootVolume != nil {
		return fmt.Errorf("annotation %s: an installer ISO installs onto a root disk made anew; keeping it on a volume is not supported: %w",
			config.AnnotationRootDiskVolume, errdefs.ErrInvalidArgument)
	}
	size := c.desc.RootDiskSize
	if size == 0 {
		size = installerDiskSize
	}
	root, err := c.create(image.OverlayName)
	if err != nil {
		return err
	}
	if err := image.CreateEmpty(ctx, c.img, root, size); err != nil {
		return err
	}
	cdDriver := c.desc.DiskDriver
	if cdDriver != config.DiskDriverSATA && cdDriver != config.DiskDriverIDE {
		cdDriver = config.DiskDriverSATA
	}
	c.qs.Drives = append(c.qs.Drives,
		qemu.Drive{ID: "root", Path: c.fdSet(root), Format: qemu.FormatQCOW2, Driver: c.desc.DiskDriver, BootIndex: 1},
		qemu.Drive{ID: "installer", Path: c.fdSet(c.boot.ISOFile), Format: qemu.FormatRaw, ReadOnly: true, CDROM: true, Driver: cdDriver, BootIndex: 2},
	)
	c.logger.WithField("iso", c.boot.InImage(c.boot.ISO)).WithField("size", size).Info("installer iso with an empty root disk")
	return nil
}

// log writes a line into the container's log while it is made.
func (c *build) log(line string) {
	if c.r.Log != nil {
		c.r.Log(line)
	}
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
