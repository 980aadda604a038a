// Package qemu turns a VM description into a QEMU command line, launches
// QEMU with the file descriptors it needs, and supervises it over QMP.
package qemu
