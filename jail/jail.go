// Package jail confines a program the shim starts for a VM (QEMU, or
// qemu-img inspecting an untrusted image), as Firecracker's jailer does:
// its own uid and gid, no capabilities, no_new_privs, and a mount
// namespace of its own whose root is a small read-only tmpfs holding only
// /usr (read-only), a few device nodes, a /proc that shows only the jail's
// own processes, and the files bound in for it.
//
// A jail is entered by a thread.Step on the thread the program is forked
// from: in a new mount namespace the step builds the jail at Root,
// pivot_roots into it and detaches the host's tree, so that the namespace
// holds the jail's mounts and nothing else (its /proc/self/mountinfo
// names no other mount of the node). The program inherits that root, the
// empty capability bounding set and no_new_privs, and Apply makes it drop
// to the jail's ids before it execs. The namespace, and every mount in it,
// goes away with the last process in it: nothing is left to clean up but
// the empty Root directory.
package jail

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// VMDir is the directory in the jail that holds what is bound in for the
// program: kernel, initrd, shares.
const VMDir = "/vm"

// systemDirs are the host's program directories the jail shows: /usr
// read-only, and the top-level names that point into it (Debian's merged
// /usr makes them symlinks, which the jail copies).
var systemDirs = []string{"/usr", "/bin", "/sbin", "/lib", "/lib64"}

// baseDevices are the device nodes every jail has, readable and writable
// by anyone in it.
var baseDevices = []Device{
	{Path: "/dev/null", Major: 1, Minor: 3},
	{Path: "/dev/zero", Major: 1, Minor: 5},
	{Path: "/dev/full", Major: 1, Minor: 7},
	{Path: "/dev/random", Major: 1, Minor: 8},
	{Path: "/dev/urandom", Major: 1, Minor: 9},
}

// Jail describes one jail.
type Jail struct {
	// Root is an empty host directory that becomes the jail's root in
	// the jail's mount namespace; on the host it stays empty.
	Root string
	// UID and GID the program runs as; Groups are its supplementary groups.
	UID, GID uint32
	Groups   []uint32
	// Binds are files and directories bound into the jail.
	Binds []Bind
	// Devices are device nodes made in the jail besides the base ones,
	// owned by UID:GID, mode 0600 (/dev/kvm, VFIO groups, a block volume
	// qemu-img writes a disk onto).
	Devices []Device
	// Sysfs shows the host's /sys, read-only (VFIO needs it).
	Sysfs bool
}

// Bind is a file or directory bound into the jail.
type Bind struct {
	// Target is the absolute path in the jail, under VMDir.
	Target string
	// File is an open file or directory, bound through its descriptor so
	// that no path is resolved again; when nil, Source is bound.
	File *os.File
	// Source is a host path, for binds without File.
	Source   string
	ReadOnly bool
}

// Device is a device node in the jail.
type Device struct {
	Path         string // absolute path in the jail, under /dev
	Major, Minor uint32
	Block        bool // a block device; else a character device
}

// Validate checks the jail's description; the error names the first bad field.
func (j *Jail) Validate() error {
	if !filepath.IsAbs(j.Root) || filepath.Clean(j.Root) != j.Root || j.Root == "/" {
		return fmt.Errorf("jail root %q: not an absolute, clean path below /: %w", j.Root, errdefs.ErrInvalidArgument)
	}
	if j.UID == 0 || j.GID == 0 {
		return fmt.Errorf("jail ids %d:%d: the program must not run as root: %w", j.UID, j.GID, errdefs.ErrInvalidArgument)
	}
	seen := map[string]bool{}
	for _, b := range j.Binds {
		if !underDir(b.Target, VMDir) {
			return fmt.Errorf("jail bind %q: target must be a clean path under %s: %w", b.Target, VMDir, errdefs.ErrInvalidArgument)
		}
		if b.File == nil && !filepath.IsAbs(b.Source) {
			return fmt.Errorf("jail bind %s: source %q is not an absolute path: %w", b.Target, b.Source, errdefs.ErrInvalidArgument)
		}
		if seen[b.Target] {
			return fmt.Errorf("jail bind %s: bound twice: %w", b.Target, errdefs.ErrInvalidArgument)
		}
		seen[b.Target] = true
	}
	for _, d := range j.Devices {
		if !underDir(d.Path, "/dev") || seen[d.Path] {
			return fmt.Errorf("jail device %q: must be a clean path under /dev, once: %w", d.Path, errdefs.ErrInvalidArgument)
		}
		seen[d.Path] = true
	}
	return nil
}

// underDir reports whether p is a clean absolute path strictly below dir.
func underDir(p, dir string) bool {
	return path.Clean(p) == p && strings.HasPrefix(p, dir+"/")
}

// Enter is a thread.Step: it moves the calling thread into a new mount
// namespace whose root is the jail (pivot_root), empties the thread's
// capability bounding set and sets no_new_privs. None of that can be
// undone, so the step reports that the thread cannot go back, and the
// thread is discarded after the fork. After it the thread sees only the
// jail: a step that opens host paths must come before it.
func (j *Jail) Enter() (func() bool, error) {
	if err := j.Validate(); err != nil {
		return nil, err
	}
	// The binds are cloned while their files' mounts are still this
	// namespace's: a mount of another namespace cannot be bound, a
	// detached clone can be attached anywhere.
	trees, err := j.cloneBinds()
	if err != nil {
		return nil, fmt.Errorf("jail %s: %w", j.Root, err)
	}
	defer closeAll(trees)
	back := func() bool { return false }
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return back, fmt.Errorf("jail: new mount namespace: %w", err)
	}
	// Mounts made here never reach the host, nor the host's here; the
	// detach of the host's tree below stays here too.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return back, fmt.Errorf("jail: make mounts private: %w", err)
	}
	if err := j.build(trees); err != nil {
		return back, fmt.Errorf("jail %s: %w", j.Root, err)
	}
	if err := pivot(j.Root); err != nil {
		return back, fmt.Errorf("jail %s: %w", j.Root, err)
	}
	if err := dropBoundingSet(); err != nil {
		return back, fmt.Errorf("jail: drop capabilities: %w", err)
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return back, fmt.Errorf("jail: set no_new_privs: %w", err)
	}
	return back, nil
}

// pivot makes root, a mount point, the root of the calling thread's mount
// namespace, and detaches the tree that was the root, with every mount of
// the host in it, as runc does: pivot_root(".", ".") stacks the old root
// on the new one, where it is unmounted. Root is read-only by then, so it
// has no room for a put_old directory.
func pivot(root string) error {
	old, err := unix.Open("/", unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open old root: %w", err)
	}
	defer unix.Close(old)
	// A bind cloned from a shared mount is the host mount's peer: made
	// private, the host's later mounts below it stay out of the jail.
	if err := unix.Mount("", root, "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make the jail's mounts private: %w", err)
	}
	if err := unix.Chdir(root); err != nil {
		return err
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Fchdir(old); err != nil {
		return fmt.Errorf("enter old root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach old root: %w", err)
	}
	return unix.Chdir("/")
}

// cloneBinds makes a detached mount of each bind's file or source,
// nosuid, nodev, and read-only where asked.
func (j *Jail) cloneBinds() (_ []int, retErr error) {
	var trees []int
	defer func() {
		if retErr != nil {
			closeAll(trees)
		}
	}()
	for _, b := range j.Binds {
		dirfd, name, flags := unix.AT_FDCWD, b.Source, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC
		if b.File != nil {
			// The descriptor's own file, whatever its path leads to now.
			dirfd, name, flags = int(b.File.Fd()), "", flags|unix.AT_EMPTY_PATH
		}
		fd, err := unix.OpenTree(dirfd, name, uint(flags))
		if err != nil {
			return nil, fmt.Errorf("bind %s: clone: %w", b.Target, err)
		}
		trees = append(trees, fd)
		attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV}
		if b.ReadOnly {
			attr.Attr_set |= unix.MOUNT_ATTR_RDONLY
		}
		if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &attr); err != nil {
			return nil, fmt.Errorf("bind %s: set attributes: %w", b.Target, err)
		}
	}
	return trees, nil
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// build mounts the jail's tmpfs at Root and fills it, then makes it
// read-only. trees are the cloned binds, in the order of Binds.
func (j *Jail) build(trees []int) error {
	// Not nodev: the jail's device nodes live on it. nosuid: nothing in it
	// gains privileges.
	if err := unix.Mount("vmshim-jail", j.Root, "tmpfs", unix.MS_NOSUID, "mode=0755,size=256k,nr_inodes=1024"); err != nil {
		return fmt.Errorf("mount tmpfs: %w", err)
	}
	for _, d := range systemDirs {
		if err := j.system(d); err != nil {
			return err
		}
	}
	if err := os.Mkdir(filepath.Join(j.Root, "dev"), 0o755); err != nil {
		return err
	}
	for _, d := range baseDevices {
		if err := j.mknod(d, 0o666, false); err != nil {
			return err
		}
	}
	for _, d := range j.Devices {
		if err := j.mknod(d, 0o600, true); err != nil {
			return err
		}
	}
	// QEMU reaches its own descriptors through /proc/self/fd (9p sets a
	// new file's mode that way). This proc shows only the processes of
	// the jail's uid, and none of proc's other files.
	if err := os.Mkdir(filepath.Join(j.Root, "proc"), 0o555); err != nil {
		return err
	}
	if err := unix.Mount("proc", filepath.Join(j.Root, "proc"), "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "subset=pid,hidepid=invisible"); err != nil {
		return fmt.Errorf("mount proc: %w", err)
	}
	if j.Sysfs {
		if err := os.Mkdir(filepath.Join(j.Root, "sys"), 0o755); err != nil {
			return err
		}
		// sysfs alone: the mounts under the host's /sys (cgroups,
		// debugfs, securityfs) stay out.
		if err := bindMount("/sys", filepath.Join(j.Root, "sys"), true, false); err != nil {
			return err
		}
	}
	for i, b := range j.Binds {
		if err := j.attach(b, trees[i]); err != nil {
			return fmt.Errorf("bind %s: %w", b.Target, err)
		}
	}
	if err := unix.Mount("", j.Root, "", unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID, ""); err != nil {
		return fmt.Errorf("make read-only: %w", err)
	}
	return nil
}

// system shows the host's dir in the jail: a symlink as the same symlink,
// a directory bound read-only; a missing one is left out.
func (j *Jail) system(dir string) error {
	fi, err := os.Lstat(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	target := filepath.Join(j.Root, dir)
	if fi.Mode()&os.ModeSymlink != 0 {
		link, err := os.Readlink(dir)
		if err != nil {
			return err
		}
		return os.Symlink(link, target)
	}
	if err := os.Mkdir(target, 0o755); err != nil {
		return err
	}
	return bindMount(dir, target, true, true)
}

// mknod makes a device node in the jail, owned by the jail's ids when
// owned.
func (j *Jail) mknod(d Device, mode uint32, owned bool) error {
	p := filepath.Join(j.Root, d.Path)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	kind := uint32(unix.S_IFCHR)
	if d.Block {
		kind = unix.S_IFBLK
	}
	if err := unix.Mknod(p, kind|mode, int(unix.Mkdev(d.Major, d.Minor))); err != nil {
		return fmt.Errorf("mknod %s: %w", d.Path, err)
	}
	// The umask may have taken bits away.
	if err := unix.Chmod(p, mode); err != nil {
		return err
	}
	if owned {
		return os.Lchown(p, int(j.UID), int(j.GID))
	}
	return nil
}

// attach makes the mount point for b and attaches its cloned tree there.
func (j *Jail) attach(b Bind, tree int) error {
	var st unix.Stat_t
	if err := unix.Fstat(tree, &st); err != nil {
		return err
	}
	target := filepath.Join(j.Root, b.Target)
	if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
		return err
	}
	var err error
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		err = os.Mkdir(target, 0o755)
	} else {
		err = os.WriteFile(target, nil, 0o444)
	}
	if err != nil {
		return err
	}
	if err := unix.MoveMount(tree, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("attach: %w", err)
	}
	return nil
}

// bindMount binds src at target, nosuid and nodev, and read-only when ro;
// recursive binds carry the mounts below src along.
func bindMount(src, target string, ro, recursive bool) error {
	flags := uintptr(unix.MS_BIND)
	if recursive {
		flags |= unix.MS_REC
	}
	if err := unix.Mount(src, target, "", flags, ""); err != nil {
		return fmt.Errorf("bind %s: %w", src, err)
	}
	flags = unix.MS_BIND | unix.MS_REMOUNT | unix.MS_NOSUID | unix.MS_NODEV
	if ro {
		flags |= unix.MS_RDONLY
	}
	if err := unix.Mount("", target, "", flags, ""); err != nil {
		return fmt.Errorf("remount %s: %w", target, err)
	}
	return nil
}

// dropBoundingSet empties the calling thread's capability bounding set:
// a program it execs can never gain a capability.
func dropBoundingSet() error {
	for c := 0; ; c++ {
		err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0)
		if errors.Is(err, unix.EINVAL) {
			return nil // past the last capability this kernel knows
		}
		if err != nil {
			return fmt.Errorf("capability %d: %w", c, err)
		}
	}
}

// Apply makes cmd, forked from a thread that entered the jail, start in
// the jail's root and run as the jail's ids. cmd.Path must name the
// program as the jail shows it (a path under /usr).
func (j *Jail) Apply(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Credential = &syscall.Credential{Uid: j.UID, Gid: j.GID, Groups: append([]uint32{}, j.Groups...)}
	cmd.Dir = "/"
}

// Shows reports whether a host program path is visible at the same path
// in every jail.
func Shows(p string) bool {
	return filepath.IsAbs(p) && underDir(filepath.Clean(p), "/usr")
}
