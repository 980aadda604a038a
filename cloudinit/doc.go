// Package cloudinit renders a VM's cloud-init NoCloud documents (meta-data,
// the user-data merged with what the shim adds, network-config) and writes
// the ISO9660 seed, labelled cidata, that carries them to the guest.
package cloudinit
