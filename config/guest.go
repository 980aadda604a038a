package config

import "strings"

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
)

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

// Guest OSes.
const (
	OSLinux   = "linux"
	OSWindows = "windows"
)

// guestAnnotations are the parsed annotations of this file; "" is unset.
type guestAnnotations struct {
	firmware, graphics, nicModel, os string
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
