package config

import (
	"strings"

	"github.com/vmshim/vmshim/topology"
)

// Annotations that fit the VM to its guest.
const (
	// AnnotationFirmware picks the firmware: FirmwareBIOS, FirmwareUEFI
	// or FirmwareUEFISecure.
	AnnotationFirmware = AnnotationPrefix + "firmware"
	// AnnotationGraphics gives the VM a display: GraphicsNone or
	// GraphicsVNC.
	AnnotationGraphics = AnnotationPrefix + "graphics"
	// AnnotationNICModel picks the NICs' model: NICVirtio, NICE1000,
	// NICE1000E or NICRTL8139.
	AnnotationNICModel = AnnotationPrefix + "nic-model"
	// AnnotationOS names the guest's OS when it wants more than a Linux
	// guest: OSWindows.
	AnnotationOS = AnnotationPrefix + "os"
	// AnnotationMachine picks QEMU's machine: MachineQ35 or, for a
	// kernel that has virtio-mmio, MachineMicroVM.
	AnnotationMachine = AnnotationPrefix + "machine"
	// AnnotationMesh says what becomes of a VM in a pod whose network
	// namespace steers traffic through a proxy with netfilter rules, as
	// a service mesh's init container installs them, which the VM's
	// traffic bypasses: MeshRefuse or MeshBypass.
	AnnotationMesh = AnnotationPrefix + "mesh"
	// AnnotationOnStop says what a stop (SIGTERM, SIGINT, SIGPWR) does
	// to the VM: OnStopPoweroff or, with a root-disk volume,
	// OnStopSuspend.
	AnnotationOnStop = AnnotationPrefix + "on-stop"
	// AnnotationOnResumeError says what becomes of a VM whose root-disk
	// volume holds a saved state it cannot resume (saved from a VM of
	// another shape, cut short, or refused by QEMU):
	// OnResumeErrorRefuse or OnResumeErrorBoot.
	AnnotationOnResumeError = AnnotationPrefix + "on-resume-error"
	// AnnotationBalloon turns the VM's balloon (free page reporting and
	// the guest's memory statistics) BalloonOn or BalloonOff, whatever
	// the config's balloon says.
	AnnotationBalloon = AnnotationPrefix + "balloon"
	// AnnotationTPM gives the VM a TPM (TPM20, a TPM 2.0 that swtpm
	// emulates), or none (TPMNone), whatever the config's tpm says.
	AnnotationTPM = AnnotationPrefix + "tpm"
)

// TPM choices (AnnotationTPM, the config's tpm).
const (
	TPMNone = "none"
	TPM20   = "2.0"
)

// Balloon choices (AnnotationBalloon).
const (
	BalloonOn  = "on"
	BalloonOff = "off"
)

// AnnotationTerminationGracePeriod is the pod's
// terminationGracePeriodSeconds, which the kubelet gives each container
// as this annotation (containerd passes it on when its runtime's
// container_annotations list it). A VM that suspends on stop bounds its
// save by it.
const AnnotationTerminationGracePeriod = "io.kubernetes.pod.terminationGracePeriod"

// LabelFirmware is the image label that picks the firmware, as
// AnnotationFirmware does (which wins over it).
const LabelFirmware = "io.vmshim.firmware"

// Firmware choices.
const (
	FirmwareBIOS       = "bios"
	FirmwareUEFI       = "uefi"
	FirmwareUEFISecure = "uefi-secure"
)

// Displays.
const (
	GraphicsNone = "none"
	GraphicsVNC  = "vnc"
)

// NIC models.
const (
	NICVirtio  = "virtio"
	NICE1000   = "e1000"
	NICE1000E  = "e1000e"
	NICRTL8139 = "rtl8139"
)

// Disk drivers for guests without virtio.
const (
	DiskDriverSATA = "sata"
	DiskDriverIDE  = "ide"
)

// Machines.
const (
	MachineQ35     = "q35"
	MachineMicroVM = "microvm"
)

// What a VM does in a pod that steers traffic (AnnotationMesh).
const (
	// MeshRefuse refuses the VM in one line: its traffic would bypass
	// the pod's proxy and the mesh's policies with it.
	MeshRefuse = "refuse"
	// MeshBypass runs the VM, its traffic outside the mesh.
	MeshBypass = "bypass"
)

// What a stop does to the VM (AnnotationOnStop).
const (
	// OnStopPoweroff presses the ACPI power button.
	OnStopPoweroff = "poweroff"
	// OnStopSuspend saves the VM's state onto its root-disk volume, for
	// the next container on the volume to resume.
	OnStopSuspend = "suspend"
)

// What becomes of a VM whose saved state cannot be resumed
// (AnnotationOnResumeError).
const (
	// OnResumeErrorRefuse refuses the VM in one line and leaves the
	// state on the volume, for the operator to fix the pod, or to
	// remove it.
	OnResumeErrorRefuse = "refuse"
	// OnResumeErrorBoot removes the state, says so in the container's
	// log, and boots the disk: the guest's memory is lost.
	OnResumeErrorBoot = "boot"
)

// Guest OSes.
const (
	OSLinux   = "linux"
	OSWindows = "windows"
)

// guestAnnotations are the parsed annotations of this file; "" is unset.
type guestAnnotations struct {
	firmware, graphics, nicModel, os, machine, mesh, onStop, onResumeError, balloon, tpm string
}

// parseGuestAnnotations reads the annotations that fit the VM to its guest.
func parseGuestAnnotations(in map[string]string) (guestAnnotations, error) {
	var g guestAnnotations
	for _, a := range []struct {
		key     string
		to      *string
		allowed []string
	}{
		{AnnotationFirmware, &g.firmware, []string{FirmwareBIOS, FirmwareUEFI, FirmwareUEFISecure}},
		{AnnotationGraphics, &g.graphics, []string{GraphicsNone, GraphicsVNC}},
		{AnnotationNICModel, &g.nicModel, []string{NICVirtio, NICE1000, NICE1000E, NICRTL8139}},
		{AnnotationOS, &g.os, []string{OSLinux, OSWindows}},
		{AnnotationMachine, &g.machine, []string{MachineQ35, MachineMicroVM}},
		{AnnotationMesh, &g.mesh, []string{MeshRefuse, MeshBypass}},
		{AnnotationOnStop, &g.onStop, []string{OnStopPoweroff, OnStopSuspend}},
		{AnnotationOnResumeError, &g.onResumeError, []string{OnResumeErrorRefuse, OnResumeErrorBoot}},
		{AnnotationBalloon, &g.balloon, []string{BalloonOn, BalloonOff}},
		{AnnotationTPM, &g.tpm, []string{TPM20, TPMNone}},
	} {
		v, ok := in[a.key]
		if !ok {
			continue
		}
		if !oneOf(v, a.allowed...) {
			return g, annotationErr(a.key, "%s is not one of %s", quoteValue(v), strings.Join(a.allowed, ", "))
		}
		*a.to = v
	}
	return g, nil
}

// CheckFirmware checks a firmware choice from another source than an
// annotation (the image's label); what names the source.
func CheckFirmware(what, v string) error {
	if !oneOf(v, FirmwareBIOS, FirmwareUEFI, FirmwareUEFISecure) {
		return invalidf("%s: %s is not one of %s, %s, %s", what, quoteValue(v), FirmwareBIOS, FirmwareUEFI, FirmwareUEFISecure)
	}
	return nil
}

// resolveMachine applies vmshim.io/machine once the rest of vm is
// resolved. A microvm has no firmware, screen, Windows devices, NIC or
// disk controller but virtio's, and no hot-plug: it keeps the vCPUs and
// guest RAM it boots with, and a resize changes only its CPU quota.
func resolveMachine(vm *VM, ann annotations, in map[string]string) error {
	vm.Machine = ann.guest.machine
	if vm.Machine != MachineMicroVM {
		return nil
	}
	lacks := func(what, because string) error {
		return annotationErr(AnnotationMachine, "%s has no %s, which %s asks for", MachineMicroVM, what, because)
	}
	_, topo := in[AnnotationCPUTopology]
	r := &vm.Resources
	switch {
	case vm.Firmware != "":
		return lacks("firmware", "annotation "+AnnotationFirmware)
	case vm.VNC:
		return lacks("display", "annotation "+AnnotationGraphics)
	case vm.TPM != "":
		source := "config tpm"
		if ann.guest.tpm != "" {
			source = "annotation " + AnnotationTPM
		}
		return lacks("TPM", source)
	case vm.Windows:
		return lacks("devices for Windows", "annotation "+AnnotationOS)
	case vm.NICModel != "" && vm.NICModel != NICVirtio:
		return lacks(vm.NICModel+" NIC", "annotation "+AnnotationNICModel)
	case vm.DiskDriver != DiskDriverVirtioBlk && vm.DiskDriver != DiskDriverVirtioSCSI:
		source := "config disk_driver"
		if ann.diskDriver != "" {
			source = "annotation " + AnnotationDiskDriver
		}
		return lacks(vm.DiskDriver+" disk controller", source)
	case ann.maxMemoryBytes > 0:
		return lacks("virtio-mem to resize guest RAM", "annotation "+AnnotationMaxMemory)
	case topo && r.Topology.CPUs() > vm.VCPUs:
		return lacks("vCPU hot-plug", "annotation "+AnnotationCPUTopology+" beyond the vCPUs it boots with")
	}
	if !topo {
		r.Topology = topology.DefaultTopology(vm.VCPUs)
	}
	r.MaxVCPUs, r.VCPUsFixed = vm.VCPUs, true
	// Whatever else fixes guest RAM, the machine is what a user would
	// have to change.
	r.MaxMemoryMiB, r.MemoryFixedBy = vm.MemoryMiB, "machine "+MachineMicroVM+" cannot resize guest RAM"
	return nil
}
