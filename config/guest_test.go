package config

import (
	"strings"
	"testing"

	"github.com/containerd/errdefs"
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
