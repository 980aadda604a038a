package qemu

import (
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

func baseSpec() Spec {
	return Spec{
		Name:      "pod-1",
		Accel:     AccelTCG,
		CPUs:      1,
		MemoryMiB: 512,
		QMPSocket: "/run/vmshim/pod-1/qmp.sock",
	}
}

var baseArgs = []string{
	"-name", "guest=pod-1,debug-threads=on",
	"-nodefaults", "-no-user-config",
	"-display", "none",
	"-machine", "q35,smbus=off,vmport=off,sata=off",
	"-accel", "tcg,thread=multi,tb-size=32", "-cpu", "max",
	"-smp", "1",
	"-m", "512M",
	"-chardev", "socket,id=qmp,path=/run/vmshim/pod-1/qmp.sock,server=on,wait=off",
	"-mon", "chardev=qmp,mode=control",
	"-device", "pvpanic", "-action", "panic=exit-failure",
}

func TestBuildArgsDefaults(t *testing.T) {
	got, err := BuildArgs(baseSpec())
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, baseArgs) {
		t.Fatalf("argv mismatch\n got: %q\nwant: %q", got, baseArgs)
	}
}

// TestBuildArgs checks that each spec produces the given argv after the
// defaults (tail) and never produces the forbidden options.
func TestBuildArgs(t *testing.T) {
	tests := []struct {
		name   string
		modify func(*Spec)
		tail   []string
	}{
		{
			name:   "kvm",
			modify: func(s *Spec) { s.Accel = AccelKVM; s.CPUs = 4; s.MemoryMiB = 2048 },
		},
		{
			name: "virtio-blk boot disk",
			modify: func(s *Spec) {
				s.Drives = []Drive{{ID: "root", Path: "/b/root.raw", Format: "raw", BootIndex: 1}}
			},
			tail: []string{
				"-blockdev", `{"driver":"file","node-name":"file-root","filename":"/b/root.raw","discard":"unmap"}`,
				"-blockdev", `{"driver":"raw","node-name":"disk-root","file":"file-root","discard":"unmap"}`,
				"-device", "virtio-blk-pci,id=dev-root,drive=disk-root,bootindex=1",
			},
		},
		{
			name: "virtio-scsi controller created once",
			modify: func(s *Spec) {
				s.Drives = []Drive{
					{ID: "a", Path: "/b/a.raw", Format: "raw", Driver: "virtio-scsi", Serial: "SER-A"},
					{ID: "b", Path: "/b/b.raw", Format: "raw", Driver: "virtio-scsi"},
				}
			},
			tail: []string{
				"-blockdev", `{"driver":"file","node-name":"file-a","filename":"/b/a.raw","discard":"unmap"}`,
				"-blockdev", `{"driver":"raw","node-name":"disk-a","file":"file-a","discard":"unmap"}`,
				"-device", "virtio-scsi-pci,id=scsi0",
				"-device", "scsi-hd,bus=scsi0.0,id=dev-a,drive=disk-a,serial=SER-A",
				"-blockdev", `{"driver":"file","node-name":"file-b","filename":"/b/b.raw","discard":"unmap"}`,
				"-blockdev", `{"driver":"raw","node-name":"disk-b","file":"file-b","discard":"unmap"}`,
				"-device", "scsi-hd,bus=scsi0.0,id=dev-b,drive=disk-b",
			},
		},
		{
			name: "nvme gets a serial",
			modify: func(s *Spec) {
				s.Drives = []Drive{{ID: "root", Path: "/b/r.qcow2", Format: "qcow2", Driver: "nvme", BootIndex: 2}}
			},
			tail: []string{
				"-blockdev", `{"driver":"file","node-name":"file-root","filename":"/b/r.qcow2","discard":"unmap"}`,
				"-blockdev", `{"driver":"qcow2","node-name":"disk-root","file":"file-root","backing":null,"discard":"unmap"}`,
				"-device", "nvme,id=dev-root,drive=disk-root,serial=root,bootindex=2",
			},
		},
		{
			name: "backing chain",
			modify: func(s *Spec) {
				s.Drives = []Drive{{ID: "root", Path: "/c/overlay.qcow2", Format: "qcow2",
					BackingPath: "/img/disk/disk.img", BackingFormat: "qcow2", BootIndex: 1}}
			},
			tail: []string{
				"-blockdev", `{"driver":"file","node-name":"bfile-root","filename":"/img/disk/disk.img","read-only":true}`,
				"-blockdev", `{"driver":"qcow2","node-name":"base-root","file":"bfile-root","backing":null,"read-only":true}`,
				"-blockdev", `{"driver":"file","node-name":"file-root","filename":"/c/overlay.qcow2","discard":"unmap"}`,
				"-blockdev", `{"driver":"qcow2","node-name":"disk-root","file":"file-root","backing":"base-root","discard":"unmap"}`,
				"-device", "virtio-blk-pci,id=dev-root,drive=disk-root,bootindex=1",
			},
		},
		{
			name: "read-only raw seed",
			modify: func(s *Spec) {
				s.Drives = []Drive{{ID: "seed", Path: "/c/seed.img", Format: "raw", ReadOnly: true, Serial: "cidata"}}
			},
			tail: []string{
				"-blockdev", `{"driver":"file","node-name":"file-seed","filename":"/c/seed.img","read-only":true}`,
				"-blockdev", `{"driver":"raw","node-name":"disk-seed","file":"file-seed","read-only":true}`,
				"-device", "virtio-blk-pci,id=dev-seed,drive=disk-seed,serial=cidata",
			},
		},
		{
			name: "comma in option values is doubled, blockdev json is quoted",
			modify: func(s *Spec) {
				s.Drives = []Drive{{ID: "d", Path: "/p,q/top.qcow2", Format: "qcow2",
					BackingPath: `/p,q/base,file=/etc/shadow"}`, BackingFormat: "raw", Serial: "s,n"}}
			},
			tail: []string{
				"-blockdev", `{"driver":"file","node-name":"bfile-d","filename":"/p,q/base,file=/etc/shadow\"}","read-only":true}`,
				"-blockdev", `{"driver":"raw","node-name":"base-d","file":"bfile-d","read-only":true}`,
				"-blockdev", `{"driver":"file","node-name":"file-d","filename":"/p,q/top.qcow2","discard":"unmap"}`,
				"-blockdev", `{"driver":"qcow2","node-name":"disk-d","file":"file-d","backing":"base-d","discard":"unmap"}`,
				"-device", "virtio-blk-pci,id=dev-d,drive=disk-d,serial=s,,n",
			},
		},
		{
			name: "kernel boot passes values verbatim",
			modify: func(s *Spec) {
				s.Kernel = "/img/boot/vmlinuz"
				s.Initrd = "/img/boot/initrd,1.img"
				s.Append = "console=ttyS0,115200 root=/dev/vda"
			},
			tail: []string{
				"-kernel", "/img/boot/vmlinuz",
				"-initrd", "/img/boot/initrd,1.img",
				"-append", "console=ttyS0,115200 root=/dev/vda",
			},
		},
		{
			name: "nics",
			modify: func(s *Spec) {
				s.NICs = []NIC{{ID: "eth0", TapFD: 5, MAC: "0A:58:0A:F4:00:07"}, {ID: "eth1", TapFD: 6, MAC: "02:00:00:00:00:01"}}
			},
			tail: []string{
				"-netdev", "tap,id=net-eth0,fd=5",
				"-device", "virtio-net-pci,id=nic-eth0,netdev=net-eth0,mac=0a:58:0a:f4:00:07,romfile=",
				"-netdev", "tap,id=net-eth1,fd=6",
				"-device", "virtio-net-pci,id=nic-eth1,netdev=net-eth1,mac=02:00:00:00:00:01,romfile=",
			},
		},
		{
			name: "host block device",
			modify: func(s *Spec) {
				s.Drives = []Drive{
					{ID: "vol", Path: "/dev/sdb", Format: "raw", HostDevice: true},
					{ID: "rovol", Path: "/dev/mapper/a,b", Format: "raw", HostDevice: true, ReadOnly: true},
				}
			},
			tail: []string{
				"-blockdev", `{"driver":"host_device","node-name":"file-vol","filename":"/dev/sdb","discard":"unmap"}`,
				"-blockdev", `{"driver":"raw","node-name":"disk-vol","file":"file-vol","discard":"unmap"}`,
				"-device", "virtio-blk-pci,id=dev-vol,drive=disk-vol",
				"-blockdev", `{"driver":"host_device","node-name":"file-rovol","filename":"/dev/mapper/a,b","read-only":true}`,
				"-blockdev", `{"driver":"raw","node-name":"disk-rovol","file":"file-rovol","read-only":true}`,
				"-device", "virtio-blk-pci,id=dev-rovol,drive=disk-rovol",
			},
		},
		{
			name: "host block device cut to a size",
			modify: func(s *Spec) {
				s.Drives = []Drive{{ID: "root", Path: "/dev/fdset/0", Format: "raw", HostDevice: true, Size: 66060288, BootIndex: 1}}
			},
			tail: []string{
				"-blockdev", `{"driver":"host_device","node-name":"file-root","filename":"/dev/fdset/0","discard":"unmap"}`,
				"-blockdev", `{"driver":"raw","node-name":"disk-root","file":"file-root","discard":"unmap","size":66060288}`,
				"-device", "virtio-blk-pci,id=dev-root,drive=disk-root,bootindex=1",
			},
		},
		{
			name: "shares",
			modify: func(s *Spec) {
				s.Shares = []Share{
					{ID: "s0", Tag: "vmshim0", Path: "/var/lib/kubelet/pods/x/volumes/data"},
					{ID: "s1", Tag: "vmshim1", Path: "/run/secrets", ReadOnly: true},
				}
			},
			tail: []string{
				"-fsdev", "local,id=fs-s0,path=/var/lib/kubelet/pods/x/volumes/data,security_model=none",
				"-device", "virtio-9p-pci,id=share-s0,fsdev=fs-s0,mount_tag=vmshim0",
				"-fsdev", "local,id=fs-s1,path=/run/secrets,security_model=none,readonly=on",
				"-device", "virtio-9p-pci,id=share-s1,fsdev=fs-s1,mount_tag=vmshim1",
			},
		},
		{
			name: "share path with commas and = cannot add options",
			modify: func(s *Spec) {
				s.Shares = []Share{{ID: "s", Tag: "t", Path: "/srv/a,readonly=off,path=/etc", ReadOnly: true}}
			},
			tail: []string{
				"-fsdev", "local,id=fs-s,path=/srv/a,,readonly=off,,path=/etc,security_model=none,readonly=on",
				"-device", "virtio-9p-pci,id=share-s,fsdev=fs-s,mount_tag=t",
			},
		},
		{
			name: "vfio",
			modify: func(s *Spec) {
				s.VFIO = []string{"0000:01:00.0", "0000:01:00.1", "abcd:ff:1f.7"}
			},
			tail: []string{
				"-device", "vfio-pci,host=0000:01:00.0,id=hostdev0",
				"-device", "vfio-pci,host=0000:01:00.1,id=hostdev1",
				"-device", "vfio-pci,host=abcd:ff:1f.7,id=hostdev2",
			},
		},
		{
			name: "shares and vfio follow disks and nics",
			modify: func(s *Spec) {
				s.VFIO = []string{"0000:65:00.0"}
				s.Shares = []Share{{ID: "s0", Tag: "vmshim0", Path: "/srv"}}
				s.NICs = []NIC{{ID: "eth0", TapFD: 3, MAC: "02:00:00:00:00:01"}}
				s.Drives = []Drive{{ID: "seed", Path: "/c/seed.img", Format: "raw", ReadOnly: true}}
			},
			tail: []string{
				"-blockdev", `{"driver":"file","node-name":"file-seed","filename":"/c/seed.img","read-only":true}`,
				"-blockdev", `{"driver":"raw","node-name":"disk-seed","file":"file-seed","read-only":true}`,
				"-device", "virtio-blk-pci,id=dev-seed,drive=disk-seed",
				"-netdev", "tap,id=net-eth0,fd=3",
				"-device", "virtio-net-pci,id=nic-eth0,netdev=net-eth0,mac=02:00:00:00:00:01,romfile=",
				"-fsdev", "local,id=fs-s0,path=/srv,security_model=none",
				"-device", "virtio-9p-pci,id=share-s0,fsdev=fs-s0,mount_tag=vmshim0",
				"-device", "vfio-pci,host=0000:65:00.0,id=hostdev0",
			},
		},
		{
			name:   "guest agent port",
			modify: func(s *Spec) { s.AgentSocket = "/run/vmshim/pod-1/agent,1.sock" },
			tail: []string{
				"-device", "virtio-serial-pci,id=vser0",
				"-chardev", "socket,id=agent,path=/run/vmshim/pod-1/agent,,1.sock,server=on,wait=off",
				"-device", "virtserialport,bus=vser0.0,id=agent-port,chardev=agent,name=org.qemu.guest_agent.0",
				"-device", "pvpanic", "-action", "panic=exit-failure",
			},
		},
		{
			name:   "tpm",
			modify: func(s *Spec) { s.TPMFD = 5 },
			tail: []string{
				"-chardev", "socket,id=tpm0-ctrl,fd=5",
				"-tpmdev", "emulator,id=tpm0,chardev=tpm0-ctrl",
				"-device", "tpm-crb,tpmdev=tpm0",
				"-device", "pvpanic", "-action", "panic=exit-failure",
			},
		},
		{
			name:   "console, sandbox, paused",
			modify: func(s *Spec) { s.ConsoleFD = 3; s.Sandbox = true; s.Paused = true },
		},
		{
			name: "sockets and files as fds",
			modify: func(s *Spec) {
				s.QMPFD, s.AgentSocket, s.AgentFD = 4, "/run/vmshim/pod-1/agent.sock", 5
				s.FDSets = []AddFD{{Set: 0, FD: 6}, {Set: 1, FD: 7}}
				s.Drives = []Drive{{ID: "root", Path: FDSetPath(0), Format: "qcow2", BackingPath: FDSetPath(1), BackingFormat: "raw"}}
			},
			tail: []string{
				"-device", "virtio-serial-pci,id=vser0",
				"-chardev", "socket,id=agent,fd=5,server=on,wait=off",
				"-device", "virtserialport,bus=vser0.0,id=agent-port,chardev=agent,name=org.qemu.guest_agent.0",
				"-device", "pvpanic", "-action", "panic=exit-failure",
				"-blockdev", `{"driver":"file","node-name":"bfile-root","filename":"/dev/fdset/1","read-only":true}`,
				"-blockdev", `{"driver":"raw","node-name":"base-root","file":"bfile-root","read-only":true}`,
				"-blockdev", `{"driver":"file","node-name":"file-root","filename":"/dev/fdset/0","discard":"unmap"}`,
				"-blockdev", `{"driver":"qcow2","node-name":"disk-root","file":"file-root","backing":"base-root","discard":"unmap"}`,
				"-device", "virtio-blk-pci,id=dev-root,drive=disk-root",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := baseSpec()
			tt.modify(&s)
			got, err := BuildArgs(s)
			if err != nil {
				t.Fatal(err)
			}
			if len(tt.tail) > 0 && !reflect.DeepEqual(got[len(got)-len(tt.tail):], tt.tail) {
				t.Fatalf("argv tail mismatch\n got: %q\nwant: %q", got, tt.tail)
			}
			for _, bad := range []string{"-drive", "-hda", "-nographic", "-no-shutdown", "-monitor", "-vga"} {
				for _, a := range got {
					if a == bad {
						t.Errorf("argv contains %s: %q", bad, got)
					}
				}
			}
		})
	}
}

func TestBuildArgsFlags(t *testing.T) {
	s := baseSpec()
	s.Accel, s.CPUs, s.MemoryMiB = AccelKVM, 4, 2048
	s.ConsoleFD, s.Sandbox, s.Paused = 3, true, true
	s.Name = "a,guest=evil"
	s.QMPSocket = "/run/x,y/qmp.sock"
	got, err := BuildArgs(s)
	if err != nil {
		t.Fatal(err)
	}
	for _, pair := range [][2]string{
		{"-name", "guest=a,,guest=evil,debug-threads=on"},
		{"-chardev", "socket,id=qmp,path=/run/x,,y/qmp.sock,server=on,wait=off"},
		{"-accel", "kvm"}, {"-cpu", "host"}, {"-smp", "4"}, {"-m", "2048M"},
		{"-chardev", "socket,id=console,fd=3"}, {"-serial", "chardev:console"},
		{"-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"},
	} {
		if !hasPair(got, pair[0], pair[1]) {
			t.Errorf("argv lacks %s %s: %q", pair[0], pair[1], got)
		}
	}
	if !hasFlag(got, "-S") {
		t.Errorf("argv lacks -S: %q", got)
	}
	if hasFlag(baseArgs, "-S") || hasFlag(baseArgs, "-serial") || hasFlag(baseArgs, "-sandbox") || hasFlag(baseArgs, "-add-fd") {
		t.Errorf("defaults have -S, -serial, -sandbox or -add-fd: %q", baseArgs)
	}
}

func hasPair(args []string, flag, value string) bool {
	for i := 0; i+1 < len(args); i++ {
		if args[i] == flag && args[i+1] == value {
			return true
		}
	}
	return false
}

func hasFlag(args []string, flag string) bool {
	for _, a := range args {
		if a == flag {
			return true
		}
	}
	return false
}

func TestBuildArgsInvalid(t *testing.T) {
	drive := func(f func(*Drive)) func(*Spec) {
		return func(s *Spec) {
			d := Drive{ID: "root", Path: "/b/root.qcow2", Format: "qcow2"}
			f(&d)
			s.Drives = append(s.Drives, d)
		}
	}
	nic := func(f func(*NIC)) func(*Spec) {
		return func(s *Spec) {
			n := NIC{ID: "eth0", TapFD: 3, MAC: "02:00:00:00:00:01"}
			f(&n)
			s.NICs = append(s.NICs, n)
		}
	}
	tests := []struct {
		name   string
		modify func(*Spec)
		field  string
	}{
		{"empty name", func(s *Spec) { s.Name = "" }, "invalid name"},
		{"newline in name", func(s *Spec) { s.Name = "a\nb" }, "invalid name"},
		{"long name", func(s *Spec) { s.Name = strings.Repeat("a", 254) }, "invalid name"},
		{"accel", func(s *Spec) { s.Accel = "hvf" }, "invalid accel"},
		{"zero cpus", func(s *Spec) { s.CPUs = 0 }, "invalid cpus"},
		{"too many cpus", func(s *Spec) { s.CPUs = 1000 }, "invalid cpus"},
		{"little memory", func(s *Spec) { s.MemoryMiB = 15 }, "invalid memory"},
		{"no qmp socket", func(s *Spec) { s.QMPSocket = "" }, "invalid qmp socket"},
		{"relative qmp socket", func(s *Spec) { s.QMPSocket = "qmp.sock" }, "invalid qmp socket"},
		{"long qmp socket", func(s *Spec) { s.QMPSocket = "/" + strings.Repeat("a", 200) }, "invalid qmp socket"},
		{"relative agent socket", func(s *Spec) { s.AgentSocket = "agent.sock" }, "invalid agent socket"},
		{"agent socket is qmp socket", func(s *Spec) { s.AgentSocket = s.QMPSocket }, "invalid agent socket"},
		{"console on stdout", func(s *Spec) { s.ConsoleFD = 1 }, "invalid console fd"},
		{"relative kernel", func(s *Spec) { s.Kernel = "vmlinuz" }, "invalid kernel"},
		{"initrd without kernel", func(s *Spec) { s.Initrd = "/initrd" }, "invalid initrd"},
		{"append without kernel", func(s *Spec) { s.Append = "quiet" }, "invalid append"},
		{"NUL in append", func(s *Spec) { s.Kernel = "/k"; s.Append = "a\x00b" }, "invalid append"},
		{"drive id charset", drive(func(d *Drive) { d.ID = "Root" }), `invalid drive[0] id`},
		{"drive id comma", drive(func(d *Drive) { d.ID = "a,b" }), `invalid drive[0] id`},
		{"drive id empty", drive(func(d *Drive) { d.ID = "" }), `invalid drive[0] id`},
		{"drive id long", drive(func(d *Drive) { d.ID = strings.Repeat("a", 21) }), `invalid drive[0] id`},
		{"duplicate drive id", func(s *Spec) {
			drive(func(*Drive) {})(s)
			drive(func(*Drive) {})(s)
		}, `invalid drive "root" id`},
		{"relative drive path", drive(func(d *Drive) { d.Path = "root.qcow2" }), `invalid drive "root" path`},
		{"unclean drive path", drive(func(d *Drive) { d.Path = "/b/../root.qcow2" }), `invalid drive "root" path`},
		{"newline in drive path", drive(func(d *Drive) { d.Path = "/b/x\n.qcow2" }), `invalid drive "root" path`},
		{"format", drive(func(d *Drive) { d.Format = "vmdk" }), `invalid drive "root" format`},
		{"empty format", drive(func(d *Drive) { d.Format = "" }), `invalid drive "root" format`},
		{"raw with backing", drive(func(d *Drive) {
			d.Format, d.BackingPath, d.BackingFormat = "raw", "/b/base", "raw"
		}), `invalid drive "root" backing path`},
		{"backing format", drive(func(d *Drive) { d.BackingPath, d.BackingFormat = "/b/base", "" }), `invalid drive "root" backing format`},
		{"backing format alone", drive(func(d *Drive) { d.BackingFormat = "raw" }), `invalid drive "root" backing format`},
		{"relative backing", drive(func(d *Drive) { d.BackingPath, d.BackingFormat = "base", "raw" }), `invalid drive "root" backing path`},
		{"driver", drive(func(d *Drive) { d.Driver = "ide-hd" }), `invalid drive "root" driver`},
		{"boot index", drive(func(d *Drive) { d.BootIndex = -1 }), `invalid drive "root" boot index`},
		{"duplicate boot index", func(s *Spec) {
			drive(func(d *Drive) { d.BootIndex = 1 })(s)
			drive(func(d *Drive) { d.ID, d.BootIndex = "two", 1 })(s)
		}, `invalid drive "two" boot index`},
		{"serial space", drive(func(d *Drive) { d.Serial = "a b" }), `invalid drive "root" serial`},
		{"serial long", drive(func(d *Drive) { d.Serial = strings.Repeat("s", 21) }), `invalid drive "root" serial`},
		{"nic id", nic(func(n *NIC) { n.ID = "eth_0" }), "invalid nic[0] id"},
		{"duplicate nic id", func(s *Spec) {
			nic(func(*NIC) {})(s)
			nic(func(n *NIC) { n.TapFD = 4 })(s)
		}, `invalid nic "eth0" id`},
		{"tap fd", nic(func(n *NIC) { n.TapFD = 2 }), `invalid nic "eth0" tap fd`},
		{"shared tap fd", func(s *Spec) {
			nic(func(*NIC) {})(s)
			nic(func(n *NIC) { n.ID = "eth1" })(s)
		}, `invalid nic "eth1" tap fd`},
		{"mac", nic(func(n *NIC) { n.MAC = "02:00:00:00:00" }), `invalid nic "eth0" mac`},
		{"mac injection", nic(func(n *NIC) { n.MAC = "02:00:00:00:00:01,romfile=/x" }), `invalid nic "eth0" mac`},
		{"multicast mac", nic(func(n *NIC) { n.MAC = "01:00:5e:00:00:01" }), `invalid nic "eth0" mac`},
		{"qmp fd", func(s *Spec) { s.QMPFD = 1 }, "invalid qmp fd"},
		{"agent fd without socket", func(s *Spec) { s.AgentFD = 4 }, "invalid agent fd"},
		{"fd set fd", func(s *Spec) { s.FDSets = []AddFD{{Set: 0, FD: 2}} }, "invalid fd set entry 0"},
		{"fd set negative", func(s *Spec) { s.FDSets = []AddFD{{Set: -1, FD: 3}} }, "invalid fd set entry 0"},
		{"fd filed twice", func(s *Spec) { s.FDSets = []AddFD{{Set: 0, FD: 3}, {Set: 1, FD: 3}} }, "invalid fd set entry 1"},
		{"long mac", nic(func(n *NIC) { n.MAC = "02:00:00:00:00:00:00:01" }), `invalid nic "eth0" mac`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := baseSpec()
			tt.modify(&s)
			_, err := BuildArgs(s)
			checkInvalid(t, err, tt.field)
		})
	}
}

// checkInvalid checks that err is a one-line ErrInvalidArgument naming
// field first.
func checkInvalid(t *testing.T, err error, field string) {
	t.Helper()
	if err == nil {
		t.Fatal("no error")
	}
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("error %q does not wrap ErrInvalidArgument", err)
	}
	if !strings.HasPrefix(err.Error(), field+":") {
		t.Errorf("error %q does not start with %q", err, field+":")
	}
	if strings.Contains(err.Error(), "\n") {
		t.Errorf("error %q spans lines", err)
	}
}

func TestEscapeOpt(t *testing.T) {
	for in, want := range map[string]string{
		"":         "",
		"/a/b":     "/a/b",
		"/a,b":     "/a,,b",
		",,":       ",,,,",
		"x,id=foo": "x,,id=foo",
	} {
		if got := escapeOpt(in); got != want {
			t.Errorf("escapeOpt(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestFDSet(t *testing.T) {
	var s FDSet
	r1, w1, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	r2, w2, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer w1.Close()
	defer w2.Close()
	if fd := s.Add(r1); fd != 3 {
		t.Errorf("first fd = %d, want 3", fd)
	}
	if fd := s.Add(r2); fd != 4 {
		t.Errorf("second fd = %d, want 4", fd)
	}
	files := s.Files()
	if len(files) != 2 || files[0] != r1 || files[1] != r2 {
		t.Fatalf("Files() = %v", files)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if len(s.Files()) != 0 {
		t.Error("files remain after Close")
	}
	if _, err := r1.Read(make([]byte, 1)); !errors.Is(err, os.ErrClosed) {
		t.Errorf("read after Close: %v, want ErrClosed", err)
	}
}
