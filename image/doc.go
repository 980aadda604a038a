// Package image finds and checks the VM disk (or kernel and initrd) in a
// container's root filesystem and prepares the qcow2 overlay the VM boots
// from, so the image layer is never written.
package image
