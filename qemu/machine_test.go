package qemu

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

// microSpec is a direct kernel boot on microvm with an agent, a disk, a
// NIC and a share.
func microSpec() Spec {
	s := baseSpec()
	s.Machine = MachineMicroVM
	s.Kernel, s.Initrd, s.Append = "/vm/kernel", "/vm/initrd", "console=ttyS0"
	s.AgentSocket = "/run/vmshim/pod-1/agent.sock"
	s.Drives = []Drive{{ID: "seed", Path: "/dev/fdset/0", Format: FormatRaw, ReadOnly: true}}
	s.NICs = []NIC{{ID: "eth0", TapFD: 3, MAC: "02:00:00:00:00:01"}}
	s.Shares = []Share{{ID: "data", Tag: "data", Path: "/srv/data"}}
	return s
}

func TestBuildArgsMicroVM(t *testing.T) {
	got, err := BuildArgs(microSpec())
	if err != nil {
		t.Fatal(err)
	}
	wantRuns(t, got, [][]string{
		{"-machine", "microvm,isa-serial=on,rtc=on,pcie=off"},
		{"-device", "virtio-serial-device,id=vser0"},
		{"-device", "pvpanic"},
		{"-kernel", "/vm/kernel", "-initrd", "/vm/initrd", "-append", "console=ttyS0"},
		{"-device", "virtio-blk-device,id=dev-seed,drive=disk-seed"},
		{"-netdev", "tap,id=net-eth0,fd=3", "-device", "virtio-net-device,id=nic-eth0,netdev=net-eth0,mac=02:00:00:00:00:01"},
		{"-device", "virtio-9p-device,id=share-data,fsdev=fs-data,mount_tag=data"},
	})
	for _, a := range []string{"-pci", "romfile", "maxcpus"} {
		if slices.ContainsFunc(got, func(g string) bool { return strings.Contains(g, a) }) {
			t.Errorf("argv has %q:\n%q", a, got)
		}
	}

	s := microSpec()
	s.Drives[0].Driver = DriverVirtioSCSI
	if got, err = BuildArgs(s); err != nil {
		t.Fatal(err)
	}
	if indexRun(got, []string{"-device", "virtio-scsi-device,id=scsi0"}) < 0 {
		t.Errorf("no virtio-scsi-device controller:\n%q", got)
	}
}

// A microvm refuses, in one line naming the machine, whatever needs what
// it lacks.
func TestValidateMicroVM(t *testing.T) {
	for _, tc := range []struct {
		name   string
		modify func(*Spec)
		want   string
	}{
		{"unknown machine", func(s *Spec) { s.Machine = "pc" }, `"pc" is not q35 or microvm`},
		{"disk boot", func(s *Spec) { s.Kernel, s.Initrd, s.Append = "", "", "" }, "microvm boots a kernel directly, and this VM boots a disk"},
		{"screen", func(s *Spec) { s.VNC = true }, "microvm has no display"},
		{"windows", func(s *Spec) { s.Windows = true }, "microvm has no devices for Windows"},
		{"tpm", func(s *Spec) { s.TPMFD = 5 }, "microvm has no TPM"},
		{"host device", func(s *Spec) { s.VFIO = []string{"0000:01:00.0"} }, "microvm has no PCI bus for passed-through host devices"},
		{"memory resize", func(s *Spec) { s.ResizeMiB = 1024 }, "microvm has no virtio-mem"},
		{"vcpu hot-plug", func(s *Spec) { s.MaxCPUs = 4 }, "microvm has no vCPU hot-plug"},
		{"plugged vcpus", func(s *Spec) { s.PluggedCPUs, s.MaxCPUs = 2, 2 }, "microvm has no vCPU hot-plug"},
		{"numa", func(s *Spec) {
			s.CPUs, s.MaxCPUs = 2, 2
			s.NUMA = []NUMANode{{HostNode: 0, VCPUs: []int{0}, MemMiB: 256}, {HostNode: 0, VCPUs: []int{1}, MemMiB: 256}}
		}, "microvm has no NUMA nodes"},
		{"e1000", func(s *Spec) { s.NICs[0].Model = NICE1000 }, "microvm has no e1000 NIC"},
		{"nvme", func(s *Spec) { s.Drives[0].Driver = DriverNVMe }, "microvm has no nvme disk controller"},
		{"sata", func(s *Spec) { s.Drives[0].Driver = DriverSATA }, "microvm has no sata disk controller"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := microSpec()
			tc.modify(&s)
			err := s.Validate()
			if err == nil || !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("got %v, want one invalid-argument line with %q", err, tc.want)
			}
		})
	}
}
