// Command vmshim-pause is the process of a VM pod's sandbox container: it
// holds the pod's namespaces for the CRI, drops every privilege and waits
// for SIGTERM or SIGINT. The shim starts it in the pod's network
// namespace; its first argument names that namespace, for ps. It imports
// nothing but the runtime's own packages, so it costs a few hundred KiB
// of memory where the shim would cost megabytes.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

// nobody is the uid and gid the process waits as.
const nobody = 65534

func main() {
	if err := dropToNobody(); err != nil {
		os.Stderr.WriteString("vmshim-pause: drop privileges: " + err.Error() + "\n")
		os.Exit(1)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
}

// dropToNobody makes the process nobody's, with no groups and no
// capabilities left (the kernel clears them when root's ids go), and sets
// no_new_privs first.
func dropToNobody() error {
	const prSetNoNewPrivs = 38
	if _, _, errno := syscall.RawSyscall6(syscall.SYS_PRCTL, prSetNoNewPrivs, 1, 0, 0, 0, 0); errno != 0 {
		return errno
	}
	if err := syscall.Setgroups(nil); err != nil {
		return err
	}
	if err := syscall.Setresgid(nobody, nobody, nobody); err != nil {
		return err
	}
	return syscall.Setresuid(nobody, nobody, nobody)
}
