// Package topology plans how a VM's vCPUs and memory sit on the host: the
// guest's sockets, cores and threads, the host CPU each vCPU thread is
// pinned to, and guest NUMA nodes bound to the host's, from a container's
// cpuset; and it pins a running QEMU's threads.
package topology
