package hostdev

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// fakeSysfs builds a sysfs tree under a temporary directory.
type fakeSysfs struct {
	t    *testing.T
	root string
}

func (s fakeSysfs) write(rel, content string) {
	s.t.Helper()
	p := filepath.Join(s.root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		s.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		s.t.Fatal(err)
	}
}

// dev adds a device's uevent; kind is "block" or "char".
func (s fakeSysfs) dev(kind, majMin, name string) {
	maj, min, _ := strings.Cut(majMin, ":")
	s.write(filepath.Join("dev", kind, majMin, "uevent"), "MAJOR="+maj+"\nMINOR="+min+"\nDEVNAME="+name+"\n")
}

// group adds an IOMMU group whose functions have the given PCI classes.
func (s fakeSysfs) group(n string, classes map[string]string) {
	for addr, class := range classes {
		s.write(filepath.Join("kernel", "iommu_groups", n, "devices", addr, "class"), class+"\n")
	}
}

func dev(path, typ string, major, minor int64) specs.LinuxDevice {
	return specs.LinuxDevice{Path: path, Type: typ, Major: major, Minor: minor}
}

// defaultDevices are the devices oci.WithDefaultUnixDevices-era specs list.
var defaultDevices = []specs.LinuxDevice{
	dev("/dev/null", "c", 1, 3), dev("/dev/zero", "c", 1, 5), dev("/dev/full", "c", 1, 7),
	dev("/dev/random", "c", 1, 8), dev("/dev/urandom", "c", 1, 9), dev("/dev/tty", "c", 5, 0),
	dev("/dev/console", "c", 5, 1), dev("/dev/ptmx", "c", 5, 2), dev("/dev/pts/0", "c", 136, 0),
}

func ptr[T any](v T) *T { return &v }

// rule allows access to one device.
func rule(typ string, major, minor int64, access string) specs.LinuxDeviceCgroup {
	return specs.LinuxDeviceCgroup{Allow: true, Type: typ, Major: &major, Minor: &minor, Access: access}
}

func TestResolveDevices(t *testing.T) {
	const gpu, audio, bridge = "0000:01:00.0", "0000:01:00.1", "0000:00:01.0"
	tests := []struct {
		name    string
		sysfs   func(fakeSysfs)
		devices []specs.LinuxDevice
		rules   []specs.LinuxDeviceCgroup // the device cgroup
		allowed bool                      // config privileged_devices
		want    HostDevices
		errIs   error  // nil = success
		errHas  string // part of the error message
	}{
		{name: "no devices"},
		{
			name: "access from the device cgroup, last rule wins",
			sysfs: func(s fakeSysfs) {
				s.dev("block", "8:16", "sdb")
				s.dev("block", "8:32", "sdc")
				s.dev("block", "8:48", "sdd")
			},
			devices: []specs.LinuxDevice{
				dev("/dev/ro", "b", 8, 16), dev("/dev/rw", "b", 8, 32), dev("/dev/none", "b", 8, 48),
			},
			rules: []specs.LinuxDeviceCgroup{
				{Allow: false, Access: "rwm"},
				rule("b", 8, 16, "r"),
				rule("b", 8, 32, "rwm"),
				rule("b", 8, 48, "rw"), {Allow: false, Type: "b", Major: ptr(int64(8)), Minor: ptr(int64(48)), Access: "r"},
			},
			want: HostDevices{
				Block: []BlockDevice{
					{HostPath: "/dev/sdb", ContainerPath: "/dev/ro", Major: 8, Minor: 16, ReadOnly: true},
					{HostPath: "/dev/sdc", ContainerPath: "/dev/rw", Major: 8, Minor: 32},
				},
				Ignored: []string{"/dev/none"},
			},
		},
		{
			name:    "a privileged container gets no host block device or vfio group",
			sysfs:   func(s fakeSysfs) { s.dev("block", "253:0", "vda") },
			devices: append([]specs.LinuxDevice{dev("/dev/vda", "b", 253, 0), dev("/dev/vfio/7", "c", 243, 7)}, defaultDevices...),
			rules:   []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}, {Allow: true, Access: "rwm"}},
			want:    HostDevices{Ignored: []string{"/dev/vda", "/dev/vfio/7"}, Privileged: true},
		},
		{
			name:    "privileged_devices lets them through",
			sysfs:   func(s fakeSysfs) { s.dev("block", "253:0", "vda") },
			devices: []specs.LinuxDevice{dev("/dev/vda", "b", 253, 0)},
			rules:   []specs.LinuxDeviceCgroup{{Allow: true, Type: "a", Access: "rwm"}},
			allowed: true,
			want:    HostDevices{Block: []BlockDevice{{HostPath: "/dev/vda", ContainerPath: "/dev/vda", Major: 253, Minor: 0}}},
		},
		{
			name:    "default devices are dropped quietly",
			devices: defaultDevices,
		},
		{
			name:  "block devices by sysfs name",
			sysfs: func(s fakeSysfs) { s.dev("block", "8:16", "sdb"); s.dev("block", "253:3", "dm-3") },
			devices: []specs.LinuxDevice{
				dev("/dev/xvda", "b", 8, 16), dev("/dev/null", "c", 1, 3), dev("/dev/data", "b", 253, 3),
			},
			want: HostDevices{Block: []BlockDevice{
				{HostPath: "/dev/sdb", ContainerPath: "/dev/xvda", Major: 8, Minor: 16},
				{HostPath: "/dev/dm-3", ContainerPath: "/dev/data", Major: 253, Minor: 3},
			}},
		},
		{
			name:    "block device in a subdirectory",
			sysfs:   func(s fakeSysfs) { s.dev("block", "259:1", "nvme/disk1") },
			devices: []specs.LinuxDevice{dev("/dev/vol", "b", 259, 1)},
			want:    HostDevices{Block: []BlockDevice{{HostPath: "/dev/nvme/disk1", ContainerPath: "/dev/vol", Major: 259, Minor: 1}}},
		},
		{
			name:    "block device missing from sysfs",
			devices: []specs.LinuxDevice{dev("/dev/xvdb", "b", 8, 32)},
			errIs:   errdefs.ErrNotFound, errHas: "device /dev/xvdb: no block device 8:32",
		},
		{
			name:    "block device without a name",
			sysfs:   func(s fakeSysfs) { s.write("dev/block/8:32/uevent", "MAJOR=8\nMINOR=32\n") },
			devices: []specs.LinuxDevice{dev("/dev/xvdb", "b", 8, 32)},
			errIs:   errdefs.ErrNotFound, errHas: "device /dev/xvdb:",
		},
		{
			name:    "block device name escaping /dev",
			sysfs:   func(s fakeSysfs) { s.dev("block", "8:32", "../etc/shadow") },
			devices: []specs.LinuxDevice{dev("/dev/xvdb", "b", 8, 32)},
			errIs:   errdefs.ErrInvalidArgument, errHas: "device /dev/xvdb:",
		},
		{
			name:    "block device name with a comma and space",
			sysfs:   func(s fakeSysfs) { s.dev("block", "8:32", "sdc, x") },
			devices: []specs.LinuxDevice{dev("/dev/xvdb", "b", 8, 32)},
			errIs:   errdefs.ErrInvalidArgument, errHas: "device /dev/xvdb:",
		},
		{
			name:    "one block device under two paths",
			sysfs:   func(s fakeSysfs) { s.dev("block", "8:16", "sdb") },
			devices: []specs.LinuxDevice{dev("/dev/a", "b", 8, 16), dev("/dev/b", "b", 8, 16)},
			errIs:   errdefs.ErrInvalidArgument, errHas: "/dev/a and /dev/b",
		},
		{
			name: "vfio groups, bridges left out, sorted and unique",
			sysfs: func(s fakeSysfs) {
				s.dev("char", "243:7", "vfio/7")
				s.group("7", map[string]string{audio: "0x040300", gpu: "0x030000", bridge: "0x060400"})
				s.group("9", map[string]string{"0000:00:1f.6": "0x020000"})
			},
			devices: []specs.LinuxDevice{
				dev("/dev/vfio/vfio", "c", 10, 196),
				dev("/dev/vfio/9", "c", 243, 9), // not in sysfs: the path names the group
				dev("/dev/vfio/7", "c", 243, 7),
				dev("/dev/vfio/7", "c", 243, 7),
			},
			want: HostDevices{VFIO: []string{"0000:00:1f.6", gpu, audio},
				VFIOGroups: []Node{{Path: "/dev/vfio/9", Major: 243, Minor: 9}, {Path: "/dev/vfio/7", Major: 243, Minor: 7}}},
		},
		{
			name: "vfio group renamed in the container: sysfs names the host group",
			sysfs: func(s fakeSysfs) {
				s.dev("char", "243:0", "vfio/12")
				s.group("12", map[string]string{gpu: "0x030000"})
			},
			devices: []specs.LinuxDevice{dev("/dev/vfio/0", "c", 243, 0)},
			want:    HostDevices{VFIO: []string{gpu}, VFIOGroups: []Node{{Path: "/dev/vfio/12", Major: 243, Minor: 0}}},
		},
		{
			name:    "vfio path on a device that is not a group",
			sysfs:   func(s fakeSysfs) { s.dev("char", "10:200", "net/tun") },
			devices: []specs.LinuxDevice{dev("/dev/vfio/3", "c", 10, 200)},
			errIs:   errdefs.ErrInvalidArgument, errHas: "device /dev/vfio/3:",
		},
		{
			name:    "vfio group missing",
			devices: []specs.LinuxDevice{dev("/dev/vfio/4", "c", 243, 4)},
			errIs:   errdefs.ErrNotFound, errHas: "device /dev/vfio/4: no iommu group 4",
		},
		{
			name:    "vfio group empty",
			sysfs:   func(s fakeSysfs) { _ = os.MkdirAll(filepath.Join(s.root, "kernel/iommu_groups/4/devices"), 0o755) },
			devices: []specs.LinuxDevice{dev("/dev/vfio/4", "c", 243, 4)},
			errIs:   errdefs.ErrInvalidArgument, errHas: "device /dev/vfio/4: iommu group 4 has no pci function",
		},
		{
			name:    "vfio group of bridges only",
			sysfs:   func(s fakeSysfs) { s.group("4", map[string]string{bridge: "0x060400"}) },
			devices: []specs.LinuxDevice{dev("/dev/vfio/4", "c", 243, 4)},
			errIs:   errdefs.ErrInvalidArgument, errHas: "device /dev/vfio/4:",
		},
		{
			name:    "vfio group with an entry that is not a pci address",
			sysfs:   func(s fakeSysfs) { s.group("4", map[string]string{"0000:01:00.0,romfile=x": "0x030000"}) },
			devices: []specs.LinuxDevice{dev("/dev/vfio/4", "c", 243, 4)},
			errIs:   errdefs.ErrInvalidArgument, errHas: "device /dev/vfio/4:",
		},
		{
			name: "other devices are ignored, never disks",
			devices: []specs.LinuxDevice{
				dev("/dev/fuse", "c", 10, 229), dev("/dev/qat_adf_ctl", "c", 240, 0),
				dev("/dev/vfio/devices/vfio0", "c", 511, 0), dev("/dev/vfio/x1", "c", 243, 1),
				dev("/dev/fifo", "p", 0, 0), dev("/dev/null", "b", 1, 3),
			},
			sysfs: func(s fakeSysfs) { s.dev("block", "1:3", "ram3") },
			want: HostDevices{
				Block:   []BlockDevice{{HostPath: "/dev/ram3", ContainerPath: "/dev/null", Major: 1, Minor: 3}},
				Ignored: []string{"/dev/fuse", "/dev/qat_adf_ctl", "/dev/vfio/devices/vfio0", "/dev/vfio/x1", "/dev/fifo"},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := fakeSysfs{t: t, root: t.TempDir()}
			if tt.sysfs != nil {
				tt.sysfs(s)
			}
			spec := &specs.Spec{Linux: &specs.Linux{Devices: tt.devices}}
			if tt.rules != nil {
				spec.Linux.Resources = &specs.LinuxResources{Devices: tt.rules}
			}
			got, err := ResolveDevices(spec, s.root, tt.allowed)
			if tt.errIs != nil {
				if err == nil {
					t.Fatalf("no error; got %+v", got)
				}
				if !errors.Is(err, tt.errIs) || !strings.Contains(err.Error(), tt.errHas) {
					t.Fatalf("error %q, want %v containing %q", err, tt.errIs, tt.errHas)
				}
				if strings.Contains(err.Error(), "\n") {
					t.Errorf("error %q spans lines", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func TestResolveDevicesNoLinux(t *testing.T) {
	for _, spec := range []*specs.Spec{nil, {}} {
		got, err := ResolveDevices(spec, t.TempDir(), false)
		if err != nil || !reflect.DeepEqual(got, HostDevices{}) {
			t.Errorf("ResolveDevices(%+v) = %+v, %v", spec, got, err)
		}
	}
}

// TestResolveDevicesHostSysfs resolves a block device of this machine
// through the real sysfs.
func TestResolveDevicesHostSysfs(t *testing.T) {
	entries, err := os.ReadDir("/sys/dev/block")
	if err != nil || len(entries) == 0 {
		t.Skip("no block devices in /sys/dev/block")
	}
	var d specs.LinuxDevice
	d.Path, d.Type = "/dev/vol", "b"
	if _, err := fmt.Sscanf(entries[0].Name(), "%d:%d", &d.Major, &d.Minor); err != nil {
		t.Fatal(err)
	}
	got, err := ResolveDevices(&specs.Spec{Linux: &specs.Linux{Devices: []specs.LinuxDevice{d}}}, "", false)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Block) != 1 {
		t.Fatalf("got %+v", got)
	}
	fi, err := os.Stat(got.Block[0].HostPath)
	if err != nil {
		t.Skipf("host node not present: %v", err)
	}
	if fi.Mode()&os.ModeDevice == 0 || fi.Mode()&os.ModeCharDevice != 0 {
		t.Errorf("%s is not a block device: %v", got.Block[0].HostPath, fi.Mode())
	}
}
