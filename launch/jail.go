package launch

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/vmshim/vmshim/jail"
	"github.com/vmshim/vmshim/qemu"
)

// newJail describes a jail of the VM's ids rooted at name in the runtime
// directory.
func (c *build) newJail(name string) *jail.Jail {
	return &jail.Jail{Root: filepath.Join(c.rec.RuntimeDir, name), UID: c.rec.JailID, GID: c.rec.JailID}
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

// accel chooses the accelerator (once per shim), which the jail needs to
// know: KVM wants /dev/kvm in it.
func (c *build) accel(ctx context.Context) (err error) {
	c.qs.Accel, err = c.launcher.accel(ctx, c.cfg.Accel, c.binary)
	return err
}

// jail describes QEMU's jail, unless config jail is off: the VM's ids and
// the container's non-zero groups (so volumes shared with the pod's group
// work), the shares bound in, and the device nodes QEMU opens itself
// (/dev/kvm, VFIO).
func (c *build) jail(context.Context) error {
	if c.cfg.Jail {
		c.j = c.newJail("root")
		c.j.Groups = containerGroups(c.spec)
		if err := os.Mkdir(c.j.Root, 0o700); err != nil {
			return fmt.Errorf("jail: %w", err)
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

// kernel gives QEMU the kernel and initrd of a kernel boot: bound into
// its jail, or passed as fds with none.
func (c *build) kernel(context.Context) error {
	if c.boot.KernelFile == nil {
		return nil
	}
	c.qs.Kernel = c.inJail(c.boot.KernelFile, jail.VMDir+"/kernel")
	if c.boot.InitrdFile != nil {
		c.qs.Initrd = c.inJail(c.boot.InitrdFile, jail.VMDir+"/initrd")
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
