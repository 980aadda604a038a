package hostdev

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/vmshim/vmshim/pci"
)

// DefaultSysfs is where sysfs is mounted on the host.
const DefaultSysfs = "/sys"

// vfioContainerDevice is the VFIO container node, which every VFIO user
// opens next to its group nodes; it is not a group.
const vfioContainerDevice = "/dev/vfio/vfio"

// HostDevices are the host devices of a container's spec that the VM gets.
type HostDevices struct {
	Block []BlockDevice // extra disks, in spec order
	VFIO  []string      // PCI functions to pass through, sorted, unique
	// VFIOGroups are the group nodes QEMU opens for VFIO, as the host
	// names them (/dev/vfio/N, N the IOMMU group), in spec order.
	VFIOGroups []Node
	Ignored    []string // container paths of devices that are neither (for a log line)
	// Privileged is set when the spec is a privileged container's and its
	// devices were withheld (see ResolveDevices).
	Privileged bool
}

// Node is a character device node of the host.
type Node struct {
	Path         string // /dev/vfio/12
	Major, Minor int64
}

// BlockDevice is a host block device that becomes an extra disk.
type BlockDevice struct {
	HostPath      string // the node under /dev named by the kernel, e.g. /dev/sdb
	ContainerPath string // where the container would have seen it
	Major, Minor  int64  // the device's numbers, to check the node opened is it
	ReadOnly      bool   // the device cgroup lets the container read it, not write it
}

// ResolveDevices maps spec.Linux.Devices to VM devices, looking devices up
// in sysfs (DefaultSysfs when empty):
//   - a block device becomes a disk, its host node named by sysfs;
//   - a VFIO group node /dev/vfio/N becomes every PCI function of its IOMMU
//     group, except PCI bridges, which vfio-pci cannot take;
//   - every other device is listed in Ignored, except the VFIO container
//     node and the devices every container gets (/dev/null, /dev/tty,
//     /dev/pts/N...), which are dropped without a word.
//
// A block device gets the access the spec's device cgroup rules give the
// container: read-only without "w", none (it is ignored) without "r".
//
// A privileged container (its device cgroup allows every device, as
// `ctr run --privileged` and privileged CRI containers have it) comes with
// every device of the host, the node's own disks among them: unless
// allowPrivileged, it gets no block device and no VFIO group at all.
//
// A device whose sysfs entry is missing is an ErrNotFound error, one sysfs
// does not describe as expected an ErrInvalidArgument error; both name it.
func ResolveDevices(spec *specs.Spec, sysfs string, allowPrivileged bool) (HostDevices, error) {
	var out HostDevices
	if spec == nil || spec.Linux == nil {
		return out, nil
	}
	if sysfs == "" {
		sysfs = DefaultSysfs
	}
	if IsPrivileged(spec) && !allowPrivileged {
		for _, d := range spec.Linux.Devices {
			if d.Type == "b" || (isCharDevice(d) && isVFIOGroupPath(d.Path)) {
				out.Ignored = append(out.Ignored, d.Path)
				out.Privileged = true
			}
		}
		return out, nil
	}
	var rules []specs.LinuxDeviceCgroup
	if spec.Linux.Resources != nil {
		rules = spec.Linux.Resources.Devices
	}
	blocks := map[string]string{} // host path → container path
	vfio := map[string]bool{}
	for _, d := range spec.Linux.Devices {
		switch {
		case d.Type == "b":
			host, err := blockDevicePath(sysfs, d)
			if err != nil {
				return HostDevices{}, err
			}
			if other, ok := blocks[host]; ok {
				return HostDevices{}, invalidf("devices %s and %s are both host block device %s", other, d.Path, host)
			}
			access := deviceAccess(rules, d)
			if !strings.Contains(access, "r") {
				out.Ignored = append(out.Ignored, d.Path)
				continue
			}
			blocks[host] = d.Path
			out.Block = append(out.Block, BlockDevice{HostPath: host, ContainerPath: d.Path,
				Major: d.Major, Minor: d.Minor, ReadOnly: !strings.Contains(access, "w")})
		case isCharDevice(d) && (d.Path == vfioContainerDevice || isDefaultDevice(d.Path)):
			// Every container has these: nothing to say about them.
		case isCharDevice(d) && isVFIOGroupPath(d.Path):
			group, fns, err := vfioFunctions(sysfs, d)
			if err != nil {
				return HostDevices{}, err
			}
			if n := (Node{Path: "/dev/vfio/" + group, Major: d.Major, Minor: d.Minor}); !slices.Contains(out.VFIOGroups, n) {
				out.VFIOGroups = append(out.VFIOGroups, n)
			}
			for _, f := range fns {
				vfio[f] = true
			}
		default:
			out.Ignored = append(out.Ignored, d.Path)
		}
	}
	for f := range vfio {
		out.VFIO = append(out.VFIO, f)
	}
	sort.Strings(out.VFIO)
	return out, nil
}

// IsPrivileged reports whether spec is a privileged container's: its
// device cgroup has a rule that allows every device.
func IsPrivileged(spec *specs.Spec) bool {
	if spec == nil || spec.Linux == nil || spec.Linux.Resources == nil {
		return false
	}
	for _, r := range spec.Linux.Resources.Devices {
		if r.Allow && (r.Type == "" || r.Type == "a") && r.Major == nil && r.Minor == nil {
			return true
		}
	}
	return false
}

// deviceAccess is the access ("r", "w", "m" in that order, or less) the
// device cgroup rules give the container to d: the rules apply in order
// over a start with no access, the last that matches a letter decides it.
// A spec without rules gives full access, as it did before rules.
func deviceAccess(rules []specs.LinuxDeviceCgroup, d specs.LinuxDevice) string {
	if len(rules) == 0 {
		return "rwm"
	}
	allowed := map[rune]bool{}
	for _, r := range rules {
		if r.Type != "" && r.Type != "a" && r.Type != d.Type {
			continue
		}
		if (r.Major != nil && *r.Major != d.Major) || (r.Minor != nil && *r.Minor != d.Minor) {
			continue
		}
		access := r.Access
		if access == "" {
			access = "rwm"
		}
		for _, c := range access {
			allowed[c] = r.Allow
		}
	}
	var out string
	for _, c := range "rwm" {
		if allowed[c] {
			out += string(c)
		}
	}
	return out
}

func isCharDevice(d specs.LinuxDevice) bool { return d.Type == "c" || d.Type == "u" }

// isDefaultDevice reports whether p is a device runtimes give every
// container (runc's defaults, the console and the pty devices).
func isDefaultDevice(p string) bool {
	switch p {
	case "/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom",
		"/dev/tty", "/dev/console", "/dev/ptmx":
		return true
	}
	return strings.HasPrefix(p, "/dev/pts/")
}

// isVFIOGroupPath reports whether p is /dev/vfio/N with N decimal digits.
func isVFIOGroupPath(p string) bool {
	n, ok := strings.CutPrefix(p, "/dev/vfio/")
	return ok && isDigits(n)
}

func isDigits(s string) bool {
	return s != "" && strings.IndexFunc(s, func(r rune) bool { return r < '0' || r > '9' }) < 0
}

// devName reads DEVNAME from sysfs's uevent of a device; kind is "block" or
// "char". The error wraps fs.ErrNotExist when sysfs has no such device.
func devName(sysfs, kind string, d specs.LinuxDevice) (string, error) {
	uevent := filepath.Join(sysfs, "dev", kind, fmt.Sprintf("%d:%d", d.Major, d.Minor), "uevent")
	f, err := os.Open(uevent)
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if name, ok := strings.CutPrefix(sc.Text(), "DEVNAME="); ok {
			return name, nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("read %s: %w", uevent, err)
	}
	return "", nil
}

// blockDevicePath returns the host node of a block device, /dev/DEVNAME.
func blockDevicePath(sysfs string, d specs.LinuxDevice) (string, error) {
	name, err := devName(sysfs, "block", d)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "", fmt.Errorf("device %s: no block device %d:%d on the host: %w", d.Path, d.Major, d.Minor, errdefs.ErrNotFound)
	case err != nil:
		return "", fmt.Errorf("device %s: %w", d.Path, err)
	case name == "":
		return "", fmt.Errorf("device %s: block device %d:%d has no device name in sysfs: %w", d.Path, d.Major, d.Minor, errdefs.ErrNotFound)
	}
	if filepath.IsAbs(name) || filepath.Clean(name) != name || name == ".." || strings.HasPrefix(name, "../") ||
		strings.IndexFunc(name, func(r rune) bool { return r <= ' ' || r == 0x7f }) >= 0 {
		return "", invalidf("device %s: block device %d:%d has device name %q", d.Path, d.Major, d.Minor, name)
	}
	return "/dev/" + name, nil
}

// vfioFunctions returns the IOMMU group behind a VFIO group node and its
// PCI functions. The group is the one sysfs names for the node's numbers
// (DEVNAME=vfio/N) when sysfs knows the node, else the N of its container path.
func vfioFunctions(sysfs string, d specs.LinuxDevice) (string, []string, error) {
	group := strings.TrimPrefix(d.Path, "/dev/vfio/")
	name, err := devName(sysfs, "char", d)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return "", nil, fmt.Errorf("device %s: %w", d.Path, err)
	default:
		n, ok := strings.CutPrefix(name, "vfio/")
		if !ok || !isDigits(n) {
			return "", nil, invalidf("device %s: host device %d:%d is %q, not a vfio group", d.Path, d.Major, d.Minor, name)
		}
		group = n
	}
	dir := filepath.Join(sysfs, "kernel", "iommu_groups", group, "devices")
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil, fmt.Errorf("device %s: no iommu group %s on the host: %w", d.Path, group, errdefs.ErrNotFound)
	}
	if err != nil {
		return "", nil, fmt.Errorf("device %s: %w", d.Path, err)
	}
	var fns []string
	for _, e := range entries {
		addr := e.Name()
		if err := pci.CheckAddress(addr); err != nil {
			return "", nil, invalidf("device %s: iommu group %s holds %q, which is not a pci function", d.Path, group, addr)
		}
		bridge, err := isPCIBridge(filepath.Join(dir, addr))
		if err != nil {
			return "", nil, fmt.Errorf("device %s: %w", d.Path, err)
		}
		if !bridge {
			fns = append(fns, addr)
		}
	}
	if len(fns) == 0 {
		return "", nil, invalidf("device %s: iommu group %s has no pci function to pass through", d.Path, group)
	}
	return group, fns, nil
}

// isPCIBridge reports whether the PCI function in dir is a PCI-to-PCI or
// CardBus bridge (class 06 04, 06 07 or 06 09), by its class file when present.
func isPCIBridge(dir string) (bool, error) {
	b, err := os.ReadFile(filepath.Join(dir, "class"))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	class := strings.TrimSpace(string(b))
	for _, prefix := range []string{"0x0604", "0x0607", "0x0609"} {
		if strings.HasPrefix(class, prefix) {
			return true, nil
		}
	}
	return false, nil
}
