// Package shim is containerd's side of a VM task: the shim binary's start
// and delete actions (manager), which group a pod's tasks into one shim
// process and start it in the pod's cgroup; the ttrpc task service
// (service), with the task and exec state machines, console and exec IO
// (fifos, logging binaries, terminals) and the events containerd hears;
// and it gives back the memory the shim used only to set a VM up.
// It sees the VM a task runs only through package launch's interfaces,
// and knows nothing of QEMU, networks, images or disks.
package shim
