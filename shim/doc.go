// Package shim implements containerd's runtime v2 shim for VM tasks: the
// manager behind the start and delete actions and the ttrpc task service.
package shim
