package config

import (
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func TestResolveGuest(t *testing.T) {
	tests := []struct {
		name    string
		ann     map[string]string
		want    func(*VM) bool
		wantErr string
	}{
		{name: "defaults", want: func(vm *VM) bool {
			return vm.Firmware == "" && !vm.VNC && vm.NICModel == "" && !vm.Windows && vm.DiskDriver == DiskDriverVirtioBlk
		}},
		{name: "uefi, vnc, e1000, sata", ann: map[string]string{AnnotationFirmware: "uefi", AnnotationGraphics: "vnc", AnnotationNICModel: "e1000", AnnotationDiskDriver: "sata"},
			want: func(vm *VM) bool {
				return vm.Firmware == FirmwareUEFI && vm.VNC && vm.NICModel == NICE1000 && vm.DiskDriver == DiskDriverSATA
			}},
		{name: "windows defaults", ann: map[string]string{AnnotationOS: "windows"}, want: func(vm *VM) bool {
			return vm.Windows && vm.NICModel == NICE1000E && vm.DiskDriver == DiskDriverSATA
		}},
		{name: "windows with virtio drivers", ann: map[string]string{AnnotationOS: "windows", AnnotationNICModel: "virtio", AnnotationDiskDriver: "virtio-blk"},
			want: func(vm *VM) bool {
				return vm.Windows && vm.NICModel == NICVirtio && vm.DiskDriver == DiskDriverVirtioBlk
			}},
		{name: "graphics none", ann: map[string]string{AnnotationGraphics: "none"}, want: func(vm *VM) bool { return !vm.VNC }},
		{name: "bad firmware", ann: map[string]string{AnnotationFirmware: "efi"}, wantErr: `annotation vmshim.io/firmware: "efi" is not one of bios, uefi, uefi-secure`},
		{name: "bad graphics", ann: map[string]string{AnnotationGraphics: "spice"}, wantErr: `annotation vmshim.io/graphics: "spice" is not one of none, vnc`},
		{name: "bad nic", ann: map[string]string{AnnotationNICModel: "ne2k\n"}, wantErr: `annotation vmshim.io/nic-model: "ne2k\n" is not one of`},
		{name: "bad os", ann: map[string]string{AnnotationOS: "macos"}, wantErr: `annotation vmshim.io/os: "macos" is not one of linux, windows`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			vm, err := Resolve(Default(), "c1", diskSpec(tc.ann))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errdefs.IsInvalidArgument(err) {
					t.Fatalf("Resolve() = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || !tc.want(vm) {
				t.Fatalf("Resolve() = %+v, %v", vm, err)
			}
		})
	}
}

func TestCheckFirmware(t *testing.T) {
	if err := CheckFirmware("label "+LabelFirmware, "uefi-secure"); err != nil {
		t.Fatal(err)
	}
	if err := CheckFirmware("label "+LabelFirmware, "UEFI"); err == nil || !strings.Contains(err.Error(), `label io.vmshim.firmware: "UEFI" is not one of`) {
		t.Fatalf("CheckFirmware(UEFI) = %v", err)
	}
}

// vmshim.io/machine: a microvm keeps the vCPUs and guest RAM it boots
// with, and refuses in one line what it has no device for.
func TestResolveMachine(t *testing.T) {
	limited := func(ann map[string]string) *specs.Spec {
		s := diskSpec(ann)
		quota, period, mem := int64(300000), uint64(100000), int64(1<<30)
		s.Linux.Resources = &specs.LinuxResources{CPU: &specs.LinuxCPU{Quota: &quota, Period: &period}, Memory: &specs.LinuxMemory{Limit: &mem}}
		return s
	}
	micro := map[string]string{AnnotationMachine: "microvm"}
	with := func(k, v string) map[string]string {
		m := map[string]string{AnnotationMachine: "microvm"}
		m[k] = v
		return m
	}
	cfg := Default()
	cfg.DefaultMaxMemory = "4Gi"
	for _, tc := range []struct {
		name    string
		spec    *specs.Spec
		want    func(*VM) bool
		wantErr string
	}{
		{name: "q35 by default", spec: limited(nil), want: func(vm *VM) bool {
			return vm.Machine == "" && vm.Resources.MaxMemoryMiB == 4096 && vm.Resources.MaxVCPUs > vm.VCPUs
		}},
		{name: "q35 named", spec: limited(map[string]string{AnnotationMachine: "q35"}), want: func(vm *VM) bool { return vm.Machine == MachineQ35 }},
		{name: "microvm is not resized", spec: limited(micro), want: func(vm *VM) bool {
			r := vm.Resources
			return vm.Machine == MachineMicroVM && vm.VCPUs == 3 && r.MaxVCPUs == 3 && r.VCPUsFixed && r.Topology.CPUs() == 3 &&
				r.MaxMemoryMiB == 1024 && r.MemoryFixedBy == "machine microvm cannot resize guest RAM"
		}},
		{name: "microvm names itself", spec: diskSpec(micro), want: func(vm *VM) bool {
			return vm.Resources.MemoryFixedBy == "machine microvm cannot resize guest RAM"
		}},
		{name: "microvm with virtio-scsi", spec: diskSpec(with(AnnotationDiskDriver, "virtio-scsi")), want: func(vm *VM) bool { return vm.DiskDriver == DiskDriverVirtioSCSI }},
		{name: "microvm with its own topology", spec: diskSpec(map[string]string{AnnotationMachine: "microvm", AnnotationVCPUs: "2", AnnotationCPUTopology: "sockets=1,cores=2,threads=1"}),
			want: func(vm *VM) bool { return vm.Resources.Topology.CPUs() == 2 }},
		{name: "bad machine", spec: diskSpec(map[string]string{AnnotationMachine: "pc"}), wantErr: `annotation vmshim.io/machine: "pc" is not one of q35, microvm`},
		{name: "firmware", spec: diskSpec(with(AnnotationFirmware, "uefi")), wantErr: "annotation vmshim.io/machine: microvm has no firmware, which annotation vmshim.io/firmware asks for"},
		{name: "screen", spec: diskSpec(with(AnnotationGraphics, "vnc")), wantErr: "microvm has no display, which annotation vmshim.io/graphics asks for"},
		{name: "windows", spec: diskSpec(with(AnnotationOS, "windows")), wantErr: "microvm has no devices for Windows"},
		{name: "nic model", spec: diskSpec(with(AnnotationNICModel, "rtl8139")), wantErr: "microvm has no rtl8139 NIC"},
		{name: "disk driver", spec: diskSpec(with(AnnotationDiskDriver, "nvme")), wantErr: "microvm has no nvme disk controller, which annotation vmshim.io/disk-driver asks for"},
		{name: "max memory", spec: limited(with(AnnotationMaxMemory, "2Gi")), wantErr: "microvm has no virtio-mem to resize guest RAM, which annotation vmshim.io/max-memory asks for"},
		{name: "topology beyond", spec: limited(with(AnnotationCPUTopology, "sockets=1,cores=8,threads=1")), wantErr: "microvm has no vCPU hot-plug"},
		{name: "tpm", spec: diskSpec(with(AnnotationTPM, "2.0")), wantErr: "annotation vmshim.io/machine: microvm has no TPM, which annotation vmshim.io/tpm asks for"},
		{name: "tpm none", spec: diskSpec(with(AnnotationTPM, "none")), want: func(vm *VM) bool { return vm.TPM == "" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vm, err := Resolve(cfg, "c1", tc.spec)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errdefs.IsInvalidArgument(err) || strings.Contains(err.Error(), "\n") {
					t.Fatalf("Resolve() = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || !tc.want(vm) {
				t.Fatalf("Resolve() = %+v, %v", vm, err)
			}
		})
	}
}

// vmshim.io/tpm over the config's tpm: "2.0" gives a TPM 2.0, "none"
// none, and anything else is refused in one line.
func TestResolveTPM(t *testing.T) {
	for _, tc := range []struct {
		name, cfg string
		ann       map[string]string
		want      string
		wantErr   string
	}{
		{name: "none by default", want: ""},
		{name: "asked", ann: map[string]string{AnnotationTPM: "2.0"}, want: TPM20},
		{name: "from the config", cfg: TPM20, want: TPM20},
		{name: "config none", cfg: TPMNone, want: ""},
		{name: "annotation none over the config", cfg: TPM20, ann: map[string]string{AnnotationTPM: "none"}, want: ""},
		{name: "annotation over config none", cfg: TPMNone, ann: map[string]string{AnnotationTPM: "2.0"}, want: TPM20},
		{name: "1.2", ann: map[string]string{AnnotationTPM: "1.2"}, wantErr: `annotation vmshim.io/tpm: "1.2" is not one of 2.0, none`},
		{name: "empty", ann: map[string]string{AnnotationTPM: ""}, wantErr: `annotation vmshim.io/tpm: "" is not one of 2.0, none`},
		{name: "microvm from the config", cfg: TPM20, ann: map[string]string{AnnotationMachine: "microvm"},
			wantErr: "annotation vmshim.io/machine: microvm has no TPM, which config tpm asks for"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Default()
			cfg.TPM = tc.cfg
			vm, err := Resolve(cfg, "c1", diskSpec(tc.ann))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errdefs.IsInvalidArgument(err) {
					t.Fatalf("Resolve() = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || vm.TPM != tc.want {
				t.Fatalf("Resolve() = TPM %q, %v; want %q", vm.TPM, err, tc.want)
			}
		})
	}
	cfg := Default()
	cfg.TPM = "1.2"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), `tpm: "1.2" is not one of 2.0, none`) {
		t.Errorf("config tpm 1.2: %v", err)
	}
}
