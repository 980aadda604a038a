// Package rootdisk keeps a VM's root disk on a volume of its pod, so that
// what the guest writes outlives the container: a restart, the pod made
// again, another node.
//
// On a filesystem volume the disk is DiskName, a standalone qcow2 image
// copied from the image's disk on the first boot (so it needs neither the
// image nor the node it was made on), with MetaName saying which image it
// came from. Later boots use it as it is; when the image has changed, the
// disk is kept unless the policy is to recreate it.
//
// A volume holds one running VM's disk at a time. The disk file carries an
// exclusive flock(2) on the open file description QEMU is given, so the
// claim lasts as long as QEMU (or the shim) holds it and dies with them;
// LockName serialises the shims that set a disk up.
//
// Everything on the volume is untrusted: another pod may share it. Files
// are resolved beneath the volume's directory without following symlinks,
// must be regular files with one link (checked before they are opened, so
// a planted device node or fifo never is), and the disk passes the image
// package's checks (no backing or data file) before QEMU sees it.
package rootdisk

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/vmshim/vmshim/image"
	"github.com/vmshim/vmshim/regfile"
)

// Names of the files on a filesystem volume.
const (
	DiskName = "vmshim-root.qcow2"
	MetaName = "vmshim-root.json"
	LockName = "vmshim-root.lock"
	tempName = DiskName + ".part"
)

// Image is the image's disk a root disk is made from.
type Image struct {
	File        *os.File // open read-only
	Format      string   // image.FormatQCOW2 or image.FormatRaw
	VirtualSize int64
	Name        string // for messages: the disk's path in the image, or its URL
}

// Options say how the disk is made and kept.
type Options struct {
	Size           int64 // virtual size of a new disk; 0 = the image's
	Recreate       bool  // make the disk again when the image has changed
	MaxVirtualSize int64 // largest disk accepted on the volume
	Img            image.QEMUImg
	Log            func(line string) // lines for the container's log; nil = none
}

// Disk is the root disk on the volume, claimed for this VM.
type Disk struct {
	File *os.File // the qcow2 image, read-write; its flock is the claim: pass this file to QEMU
	Made bool     // made (or made again) on this boot
}

// OnDirectory claims, and on its first boot makes, the root disk in dir, a
// filesystem volume's host directory; name is the volume as the container
// sees it, for messages.
func OnDirectory(ctx context.Context, dir, name string, img Image, o Options) (_ *Disk, retErr error) {
	v, err := openVolume(dir, name)
	if err != nil {
		return nil, err
	}
	defer v.dir.Close()
	unlock, err := v.lock(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	fingerprint, err := Fingerprint(img.File, img.Format)
	if err != nil {
		return nil, fmt.Errorf("root disk volume %s: %w", name, err)
	}
	disk, err := v.claim()
	if err != nil {
		return nil, err
	}
	if disk != nil {
		m, err := v.readMeta()
		if err != nil {
			disk.Close()
			return nil, err
		}
		switch {
		case m.Image == fingerprint:
		case !o.Recreate:
			o.log("vmshim: root disk on volume %s kept: it was made from %s, the image's disk is now another (root-disk-policy recreate starts again from it)", name, m.source())
		default:
			o.log("vmshim: root disk on volume %s made again: the image's disk %s is not the one it was made from (%s)", name, img.Name, m.source())
			disk.Close()
			disk = nil
		}
	}
	if disk == nil {
		if disk, err = v.make(ctx, img, o, fingerprint); err != nil {
			return nil, err
		}
		return &Disk{File: disk, Made: true}, nil
	}
	defer func() {
		if retErr != nil {
			disk.Close()
		}
	}()
	if err := v.check(ctx, disk, o); err != nil {
		return nil, err
	}
	return &Disk{File: disk}, nil
}

// volume is a filesystem volume's directory, open.
type volume struct {
	dir  *os.File
	name string
}

// openVolume opens the filesystem volume in dir, a host directory; name
// is the volume as the container sees it, for messages. The caller
// closes v.dir.
func openVolume(dir, name string) (volume, error) {
	d, err := os.OpenFile(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return volume{}, fmt.Errorf("root disk volume %s: %w", name, err)
	}
	return volume{dir: d, name: name}, nil
}

// lock takes LockName, waiting while another shim sets a disk up here.
func (v volume) lock(ctx context.Context) (func(), error) {
	f, err := v.openOrCreate(LockName)
	if err != nil {
		return nil, err
	}
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("root disk volume %s: lock %s: %w", v.name, LockName, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("root disk volume %s: waiting for another VM's setup of the disk: %w", v.name, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// claim opens the volume's disk, if it has one, and takes its flock; a
// disk another VM holds is refused.
func (v volume) claim() (*os.File, error) {
	f, err := v.open(DiskName, unix.O_RDWR)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("root disk volume %s is in use by another running VM: %w", v.name, errdefs.ErrUnavailable)
		}
		return nil, fmt.Errorf("root disk volume %s: lock %s: %w", v.name, DiskName, err)
	}
	return f, nil
}

// make copies the image's disk into a new disk on the volume, claimed,
// and records where it came from. A disk left half made by a crash is
// made again.
func (v volume) make(ctx context.Context, img Image, o Options, fingerprint string) (_ *os.File, retErr error) {
	size := max(o.Size, img.VirtualSize)
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(v.dir.Fd()), &st); err != nil {
		return nil, fmt.Errorf("root disk volume %s: %w", v.name, err)
	}
	if capacity := int64(st.Blocks) * st.Bsize; capacity < size {
		return nil, fmt.Errorf("root disk volume %s holds %s (%d bytes), less than the root disk's %s (%d bytes): %w",
			v.name, sizeString(capacity), capacity, sizeString(size), size, errdefs.ErrFailedPrecondition)
	}
	_ = unix.Unlinkat(int(v.dir.Fd()), tempName, 0)
	f, err := v.open(tempName, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL)
	if err != nil {
		return nil, err
	}
	defer func() {
		if retErr != nil {
			f.Close()
			_ = unix.Unlinkat(int(v.dir.Fd()), tempName, 0)
		}
	}()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return nil, fmt.Errorf("root disk volume %s: lock the new disk: %w", v.name, err)
	}
	o.log("vmshim: making the root disk on volume %s from %s (%s)", v.name, img.Name, sizeString(size))
	start := time.Now()
	if err := image.CopyToQCOW2(ctx, o.Img, img.File, img.Format, img.Name, img.VirtualSize, f, size); err != nil {
		return nil, fmt.Errorf("root disk volume %s: %w", v.name, err)
	}
	if err := v.writeMeta(meta{Version: 1, Image: fingerprint, Source: img.Name, Made: time.Now().UTC()}); err != nil {
		return nil, err
	}
	if err := unix.Renameat(int(v.dir.Fd()), tempName, int(v.dir.Fd()), DiskName); err != nil {
		return nil, fmt.Errorf("root disk volume %s: %w", v.name, err)
	}
	if err := v.dir.Sync(); err != nil {
		return nil, fmt.Errorf("root disk volume %s: %w", v.name, err)
	}
	o.log("vmshim: root disk on volume %s made in %.1f s", v.name, time.Since(start).Seconds())
	return f, nil
}

// check gives a kept disk to the VM's ids and applies the image package's
// checks to it, as to any image: it may have been written by anyone who
// can reach the volume.
func (v volume) check(ctx context.Context, f *os.File, o Options) error {
	if o.Img.Jail != nil {
		if err := f.Chown(int(o.Img.Jail.UID), int(o.Img.Jail.GID)); err != nil {
			return fmt.Errorf("root disk volume %s: %w", v.name, err)
		}
	}
	b := &image.Boot{Disk: filepath.Join(v.name, DiskName), Format: image.FormatQCOW2, DiskFile: f}
	if _, err := image.Inspect(ctx, o.Img, b, image.Limits{MaxVirtualSize: o.MaxVirtualSize}); err != nil {
		return fmt.Errorf("root disk volume %s: %w", v.name, err)
	}
	return nil
}

// open opens name in the volume's directory, never through a symlink or
// out of it; it must be a regular file with one link, so the shim never
// writes or hands QEMU a file the volume links to from elsewhere. The name
// is resolved to an O_PATH descriptor and checked through it before it is
// opened with flags, so a device node or fifo planted there is never
// opened. With O_CREAT, O_EXCL is implied: the file is made, never reused.
func (v volume) open(name string, flags int) (*os.File, error) {
	if flags&unix.O_CREAT != 0 {
		fd, err := unix.Openat2(int(v.dir.Fd()), name, &unix.OpenHow{
			Flags:   uint64(flags | unix.O_EXCL | unix.O_NOFOLLOW | unix.O_CLOEXEC),
			Mode:    0o600,
			Resolve: volumeResolve,
		})
		if err != nil {
			return nil, fmt.Errorf("root disk volume %s: create %s: %w", v.name, name, err)
		}
		return os.NewFile(uintptr(fd), filepath.Join(v.dir.Name(), name)), nil
	}
	f, err := regfile.Openat(int(v.dir.Fd()), name, regfile.Options{Flags: flags, OneLink: true, Resolve: volumeResolve})
	if err != nil {
		return nil, fmt.Errorf("root disk volume %s: open %s: %w", v.name, name, err)
	}
	return f, nil
}

// volumeResolve keeps a name on the volume to the volume's directory.
const volumeResolve = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

// openOrCreate opens name, making it empty when there is none.
func (v volume) openOrCreate(name string) (*os.File, error) {
	for range 3 {
		f, err := v.open(name, unix.O_RDWR)
		if !errors.Is(err, os.ErrNotExist) {
			return f, err
		}
		f, err = v.open(name, unix.O_RDWR|unix.O_CREAT)
		if !errors.Is(err, unix.EEXIST) {
			return f, err
		}
		// Made by another shim in between: open it.
	}
	return nil, fmt.Errorf("root disk volume %s: open %s: it keeps appearing and going: %w", v.name, name, errdefs.ErrUnavailable)
}

func (o Options) log(format string, args ...any) {
	if o.Log != nil {
		o.Log(fmt.Sprintf(format, args...))
	}
}

// sizeString writes a byte count in binary units.
func sizeString(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
