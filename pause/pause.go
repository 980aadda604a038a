// Package pause is the body of a VM pod sandbox's process, which
// cmd/vmshim-pause runs and the shim binary runs when started under that
// name: it holds the pod's namespaces for the CRI, as an unprivileged id
// of its own, until SIGTERM or SIGINT, and reaps the processes orphaned
// in the pod's pid namespace, whose PID 1 it is. It imports only the
// runtime's own packages, so a pause program costs a few hundred KiB of
// memory where the shim would cost megabytes.
package pause

import (
	"errors"
	"os"
	"os/signal"
	"strconv"
	"syscall"
)

// Name is argv[0] of a pause process, and the name of its program.
const Name = "vmshim-pause"

// IDEnv is the environment variable that tells a pause process the uid
// and gid it waits as (see Env).
const IDEnv = "VMSHIM_PAUSE_ID"

// Env is the whole environment of a pause process that waits as id.
func Env(id uint32) []string {
	return []string{IDEnv + "=" + strconv.FormatUint(uint64(id), 10)}
}

// Run is a pause process: started as root with the environment Env made,
// it sets no_new_privs, drops to that id with no groups and no
// capabilities left (the kernel clears them when root's ids go), and
// waits for SIGTERM or SIGINT. Meanwhile it reaps every child that ends:
// as PID 1 of a pid namespace, it is the parent of each process orphaned
// there. args[0] names what it holds (the pod's network namespace), for
// ps. It returns the exit code.
func Run(args []string) int {
	id, err := parseID(os.Getenv(IDEnv))
	if err == nil {
		err = drop(id)
	}
	if err != nil {
		os.Stderr.WriteString(Name + ": drop privileges: " + err.Error() + "\n")
		return 1
	}
	// Two channels, so that no flood of SIGCHLD can crowd out SIGTERM
	// (os/signal drops what a full channel cannot take). SIGCHLDs that
	// come together may arrive as one: reap takes every child that ended.
	stop, child := make(chan os.Signal, 1), make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	signal.Notify(child, syscall.SIGCHLD)
	reap() // any child that ended before SIGCHLD was caught
	for {
		select {
		case <-stop:
			return 0
		case <-child:
			reap()
		}
	}
}

// reap waits for every child that has ended, without blocking.
func reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
	}
}

// parseID reads the id IDEnv names: a number above 0 and below 2^31.
func parseID(s string) (uint32, error) {
	id, err := strconv.ParseUint(s, 10, 31)
	if err != nil || id == 0 {
		return 0, errors.New(IDEnv + "=" + strconv.Quote(s) + " names no id other than root's")
	}
	return uint32(id), nil
}

// drop makes the calling process id's, uid and gid, with no groups. The
// runtime applies set*id calls to every thread of the process.
func drop(id uint32) error {
	const prSetNoNewPrivs = 38
	if _, _, errno := syscall.RawSyscall6(syscall.SYS_PRCTL, prSetNoNewPrivs, 1, 0, 0, 0, 0); errno != 0 {
		return errno
	}
	if err := syscall.Setgroups(nil); err != nil {
		return err
	}
	if err := syscall.Setresgid(int(id), int(id), int(id)); err != nil {
		return err
	}
	return syscall.Setresuid(int(id), int(id), int(id))
}
