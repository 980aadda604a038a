package qemu

import "strings"

// Firmware is UEFI firmware on the machine's two flash devices: OVMF's
// code, read-only, and the VM's own copy of its variables store.
type Firmware struct {
	Code string // the code image, opened read-only (a path or FDSetPath)
	Vars string // the VM's variables store, read-write (a path or FDSetPath)
	// SecureBoot turns on SMM and makes the variables flash writable only
	// from SMM, which OVMF's Secure Boot build needs.
	SecureBoot bool
}

// Node names of the firmware's flash images.
const (
	FirmwareCodeNode = "fw-code"
	FirmwareVarsNode = "fw-vars"
)

// VideoDevice is the id of the display adapter a VM with VNC gets.
const VideoDevice = "video0"

// firmwareArgs renders the firmware's flash nodes (raw images over files)
// and, for Secure Boot, the flash that only SMM may write.
func firmwareArgs(fw *Firmware) []string {
	if fw == nil {
		return nil
	}
	code := blockdev{Driver: FormatRaw, NodeName: FirmwareCodeNode, File: FirmwareCodeNode + "-file", ReadOnly: true}
	vars := blockdev{Driver: FormatRaw, NodeName: FirmwareVarsNode, File: FirmwareVarsNode + "-file"}
	args := []string{
		"-blockdev", blockdev{Driver: "file", NodeName: code.File, Filename: fw.Code, ReadOnly: true}.String(),
		"-blockdev", code.String(),
		"-blockdev", blockdev{Driver: "file", NodeName: vars.File, Filename: fw.Vars}.String(),
		"-blockdev", vars.String(),
	}
	if fw.SecureBoot {
		args = append(args, "-global", "driver=cfi.pflash01,property=secure,value=on")
	}
	return args
}

// cpuArgs renders -cpu for the accelerator, with the Hyper-V
// enlightenments Windows guests use when hyperv is set (the ones that
// need KVM only under KVM).
func cpuArgs(accel Accel, hyperv bool) []string {
	model := "max"
	if accel == AccelKVM {
		model = "host"
	}
	if hyperv {
		flags := []string{model, "hv-relaxed", "hv-vapic", "hv-spinlocks=0x1fff"}
		if accel == AccelKVM {
			flags = append(flags, "hv-vpindex", "hv-runtime", "hv-time", "hv-synic", "hv-stimer", "hv-frequencies")
		}
		model = strings.Join(flags, ",")
	}
	return []string{"-cpu", model}
}

// displayArgs renders the display: none, or a standard VGA adapter and a
// VNC server that listens nowhere; clients are handed to it over QMP (see
// VM.AddVNCClient).
func displayArgs(vnc bool) []string {
	if !vnc {
		return []string{"-display", "none"}
	}
	return []string{"-display", "none", "-vnc", "none", "-device", "VGA,id=" + VideoDevice}
}

// validateFirmware checks the firmware's paths.
func validateFirmware(fw *Firmware) error {
	if fw == nil {
		return nil
	}
	if err := checkPath("firmware code", fw.Code, true); err != nil {
		return err
	}
	return checkPath("firmware vars", fw.Vars, true)
}
