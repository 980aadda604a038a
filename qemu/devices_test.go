package qemu

import (
	"slices"
	"strings"
	"testing"
)

// TestBuildArgsGuestsWithoutVirtio checks the argv of SATA and IDE disks,
// CD-ROMs, NIC models, UEFI firmware, VNC and Windows, and what q35 goes
// without (its AHCI controller, kept for SATA; VMware's port, kept with
// a screen): each expected run
// of arguments appears, in order, and the forbidden ones do not.
func TestBuildArgsGuestsWithoutVirtio(t *testing.T) {
	raw := func(id, driver string) Drive {
		return Drive{ID: id, Path: "/dev/fdset/0", Format: FormatRaw, Driver: driver}
	}
	cd := func(id, driver string) Drive {
		d := raw(id, driver)
		d.CDROM, d.ReadOnly = true, true
		return d
	}
	tests := []struct {
		name   string
		modify func(*Spec)
		want   [][]string // runs of arguments, each in argv
		absent []string
	}{
		{
			name: "sata disk and cdrom on one ahci controller",
			modify: func(s *Spec) {
				s.Drives = []Drive{raw("root", DriverSATA), cd("iso", DriverSATA)}
				s.Drives[1].BootIndex = 1
			},
			want: [][]string{
				{"-machine", "q35,smbus=off,vmport=off"}, // the built-in AHCI controller kept
				{"-device", "ahci,id=sata0"},
				{"-device", "ide-hd,bus=sata0.0,id=dev-root,drive=disk-root"},
				{"-device", "ide-cd,bus=sata0.1,id=dev-iso,drive=disk-iso,bootindex=1"},
			},
		},
		{
			name:   "ide disks: two buses, master and slave",
			modify: func(s *Spec) { s.Drives = []Drive{raw("a", DriverIDE), raw("b", DriverIDE), raw("c", DriverIDE)} },
			want: [][]string{
				{"-device", "piix3-ide,id=ide0"},
				{"-device", "ide-hd,bus=ide0.0,unit=0,id=dev-a,drive=disk-a"},
				{"-device", "ide-hd,bus=ide0.0,unit=1,id=dev-b,drive=disk-b"},
				{"-device", "ide-hd,bus=ide0.1,unit=0,id=dev-c,drive=disk-c"},
			},
		},
		{
			name:   "cdrom on virtio-scsi",
			modify: func(s *Spec) { s.Drives = []Drive{cd("iso", DriverVirtioSCSI)} },
			want:   [][]string{{"-device", "virtio-scsi-pci,id=scsi0"}, {"-device", "scsi-cd,bus=scsi0.0,id=dev-iso,drive=disk-iso"}},
		},
		{
			name: "nic models",
			modify: func(s *Spec) {
				s.NICs = []NIC{{ID: "a", TapFD: 3, MAC: "02:00:00:00:00:01", Model: NICE1000}, {ID: "b", TapFD: 4, MAC: "02:00:00:00:00:02", Model: NICRTL8139}}
			},
			want: [][]string{
				{"-device", "e1000,id=nic-a,netdev=net-a,mac=02:00:00:00:00:01,romfile="},
				{"-device", "rtl8139,id=nic-b,netdev=net-b,mac=02:00:00:00:00:02,romfile="},
			},
		},
		{
			name:   "q35 named",
			modify: func(s *Spec) { s.Machine = MachineQ35 },
			want:   [][]string{{"-machine", "q35,smbus=off,vmport=off,sata=off"}},
		},
		{
			name:   "uefi",
			modify: func(s *Spec) { s.Firmware = &Firmware{Code: "/vm/OVMF_CODE.fd", Vars: "/dev/fdset/2"} },
			want: [][]string{
				{"-machine", "q35,smbus=off,vmport=off,sata=off,pflash0=fw-code,pflash1=fw-vars"},
				{"-blockdev", `{"driver":"file","node-name":"fw-code-file","filename":"/vm/OVMF_CODE.fd","read-only":true}`},
				{"-blockdev", `{"driver":"raw","node-name":"fw-code","file":"fw-code-file","read-only":true}`},
				{"-blockdev", `{"driver":"file","node-name":"fw-vars-file","filename":"/dev/fdset/2"}`},
				{"-blockdev", `{"driver":"raw","node-name":"fw-vars","file":"fw-vars-file"}`},
			},
			absent: []string{"smm=on", "driver=cfi.pflash01,property=secure,value=on"},
		},
		{
			name:   "uefi secure boot",
			modify: func(s *Spec) { s.Firmware = &Firmware{Code: "/vm/code.fd", Vars: "/vm/vars.fd", SecureBoot: true} },
			want: [][]string{
				{"-machine", "q35,smbus=off,vmport=off,sata=off,smm=on,pflash0=fw-code,pflash1=fw-vars"},
				{"-global", "driver=cfi.pflash01,property=secure,value=on"},
			},
		},
		{
			name:   "vnc",
			modify: func(s *Spec) { s.VNC = true },
			want:   [][]string{{"-display", "none", "-vnc", "none", "-device", "VGA,id=video0"}, {"-machine", "q35,smbus=off,sata=off"}},
		},
		{
			name:   "windows under tcg",
			modify: func(s *Spec) { s.Windows = true },
			want:   [][]string{{"-cpu", "max,hv-relaxed,hv-vapic,hv-spinlocks=0x1fff"}, {"-rtc", "base=localtime"}},
			absent: []string{"hv-time"},
		},
		{
			name:   "windows under kvm",
			modify: func(s *Spec) { s.Windows, s.Accel = true, AccelKVM },
			want:   [][]string{{"-cpu", "host,hv-relaxed,hv-vapic,hv-spinlocks=0x1fff,hv-vpindex,hv-runtime,hv-time,hv-synic,hv-stimer,hv-frequencies"}},
		},
		{
			// What docs/images.md's Windows 11 example asks for.
			name: "windows 11",
			modify: func(s *Spec) {
				s.Windows, s.VNC, s.TPMFD = true, true, 5
				s.CPUs, s.MemoryMiB = 2, 4096
				s.Firmware = &Firmware{Code: "/dev/fdset/0", Vars: "/dev/fdset/1", SecureBoot: true}
				s.Drives = []Drive{raw("root", DriverSATA)}
				s.NICs = []NIC{{ID: "eth0", TapFD: 3, MAC: "02:00:00:00:00:01", Model: NICE1000E}}
			},
			want: [][]string{
				{"-display", "none", "-vnc", "none", "-device", "VGA,id=video0"},
				{"-machine", "q35,smbus=off,smm=on,pflash0=fw-code,pflash1=fw-vars"},
				{"-cpu", "max,hv-relaxed,hv-vapic,hv-spinlocks=0x1fff"},
				{"-rtc", "base=localtime"},
				{"-global", "driver=cfi.pflash01,property=secure,value=on"},
				{"-chardev", "socket,id=tpm0-ctrl,fd=5", "-tpmdev", "emulator,id=tpm0,chardev=tpm0-ctrl", "-device", "tpm-crb,tpmdev=tpm0"},
				{"-device", "ide-hd,bus=sata0.0,id=dev-root,drive=disk-root"},
				{"-device", "e1000e,id=nic-eth0,netdev=net-eth0,mac=02:00:00:00:00:01,romfile="},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := baseSpec()
			tc.modify(&s)
			got, err := BuildArgs(s)
			if err != nil {
				t.Fatal(err)
			}
			wantRuns(t, got, tc.want)
			for _, a := range tc.absent {
				if slices.ContainsFunc(got, func(g string) bool { return strings.Contains(g, a) }) {
					t.Errorf("argv has %q:\n%q", a, got)
				}
			}
		})
	}
}

// wantRuns fails t unless each run of arguments is in got, in order.
func wantRuns(t *testing.T, got []string, runs [][]string) {
	t.Helper()
	at := 0
	for _, run := range runs {
		i := indexRun(got[at:], run)
		if i < 0 {
			t.Fatalf("argv lacks %q after position %d:\n%q", run, at, got)
		}
		at += i + len(run)
	}
}

// indexRun returns where run starts in args, or -1.
func indexRun(args, run []string) int {
	for i := 0; i+len(run) <= len(args); i++ {
		if slices.Equal(args[i:i+len(run)], run) {
			return i
		}
	}
	return -1
}

func TestValidateGuestsWithoutVirtio(t *testing.T) {
	sata := func(n int) []Drive {
		var ds []Drive
		for i := range n {
			ds = append(ds, Drive{ID: "d" + string(rune('a'+i)), Path: "/x", Format: FormatRaw, Driver: DriverSATA})
		}
		return ds
	}
	tests := []struct {
		name   string
		modify func(*Spec)
		want   string
	}{
		{"seven sata drives", func(s *Spec) { s.Drives = sata(7) }, "more than its 6 ports"},
		{"five ide drives", func(s *Spec) {
			s.Drives = sata(5)
			for i := range s.Drives {
				s.Drives[i].Driver = DriverIDE
			}
		}, "more than its 4 places"},
		{"cdrom on virtio-blk", func(s *Spec) {
			s.Drives = []Drive{{ID: "iso", Path: "/x", Format: FormatRaw, ReadOnly: true, CDROM: true}}
		}, "a CD-ROM goes on sata"},
		{"writable cdrom", func(s *Spec) {
			s.Drives = []Drive{{ID: "iso", Path: "/x", Format: FormatRaw, CDROM: true, Driver: DriverSATA}}
		}, "read-only raw"},
		{"unknown driver", func(s *Spec) { s.Drives = []Drive{{ID: "d", Path: "/x", Format: FormatRaw, Driver: "floppy"}} }, `"floppy" is not`},
		{"unknown nic model", func(s *Spec) { s.NICs = []NIC{{ID: "n", TapFD: 3, MAC: "02:00:00:00:00:01", Model: "ne2k_pci"}} }, `"ne2k_pci" is not`},
		{"firmware without vars", func(s *Spec) { s.Firmware = &Firmware{Code: "/vm/code.fd"} }, "firmware vars"},
		{"firmware and kernel", func(s *Spec) {
			s.Firmware = &Firmware{Code: "/vm/code.fd", Vars: "/vm/vars.fd"}
			s.Kernel = "/vm/vmlinuz"
		}, "a direct kernel boot takes no firmware"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := baseSpec()
			tc.modify(&s)
			if err := s.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate() = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}
