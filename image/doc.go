// Package image finds, opens and checks the VM disk (or kernel and initrd)
// in a container's root filesystem, never following it out of the rootfs,
// and prepares the qcow2 overlay the VM boots from, so the image layer is
// never written. The overlay and the seed live in a files directory the
// package makes itself; qemu-img, which reads the untrusted image, runs
// jailed, confined (seccomp, its own network and PID namespaces, the VM's
// cgroup) and under limits.
package image
