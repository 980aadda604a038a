// Package pause is the body of a VM pod sandbox's process, which
// cmd/vmshim-pause runs and the shim binary runs when started under that
// name: it holds the pod's namespaces for the CRI, as an unprivileged id
// of its own, until SIGTERM or SIGINT. It imports only the runtime's own
// packages, so a pause program costs a few hundred KiB of memory where
// the shim would cost megabytes.
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
// waits for SIGTERM or SIGINT. args[0] names what it holds (the pod's
// network namespace), for ps. It returns the exit code.
func Run(args []string) int {
	id, err := parseID(os.Getenv(IDEnv))
	if err == nil {
		err = drop(id)
	}
	if err != nil {
		os.Stderr.WriteString(Name + ": drop privileges: " + err.Error() + "\n")
		return 1
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	return 0
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
