package jail

import (
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The seccomp filter a confined program runs under (see Confine), close
// to QEMU's -sandbox on,elevateprivileges=deny,spawn=deny,resourcecontrol=deny:
// it may not execute another program, change its ids, open a socket of
// any family but AF_UNIX, trace or read other processes, make or enter
// namespaces, mount, or reach the kernel's module, keyring, BPF, clock
// and reboot calls. A denied call fails with EPERM; any arch but x86-64,
// and the x32 calls, kill the process.

// seccomp_data offsets (linux/seccomp.h): nr, arch, then args[6] from 16;
// each argument's low 32 bits come first on a little-endian machine.
const (
	offNr   = 0
	offArch = 4
	offArg0 = 16
)

// x32Bit marks an x32 system call number on x86-64.
const x32Bit = 0x40000000

// cloneNewFlags are the clone flags that make a namespace.
const cloneNewFlags = unix.CLONE_NEWNS | unix.CLONE_NEWCGROUP | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC |
	unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET | unix.CLONE_NEWTIME

// deniedSyscalls fail with EPERM.
var deniedSyscalls = []uint32{
	// ids and privileges
	unix.SYS_SETUID, unix.SYS_SETGID, unix.SYS_SETREUID, unix.SYS_SETREGID,
	unix.SYS_SETRESUID, unix.SYS_SETRESGID, unix.SYS_SETFSUID, unix.SYS_SETFSGID,
	unix.SYS_SETGROUPS, unix.SYS_CAPSET, unix.SYS_PERSONALITY,
	// other processes
	unix.SYS_PTRACE, unix.SYS_PROCESS_VM_READV, unix.SYS_PROCESS_VM_WRITEV,
	unix.SYS_KCMP, unix.SYS_PIDFD_GETFD,
	// namespaces and mounts
	unix.SYS_UNSHARE, unix.SYS_SETNS, unix.SYS_MOUNT, unix.SYS_UMOUNT2, unix.SYS_PIVOT_ROOT,
	unix.SYS_CHROOT, unix.SYS_OPEN_TREE, unix.SYS_MOVE_MOUNT, unix.SYS_FSOPEN,
	unix.SYS_FSCONFIG, unix.SYS_FSMOUNT, unix.SYS_FSPICK, unix.SYS_MOUNT_SETATTR,
	unix.SYS_OPEN_BY_HANDLE_AT, unix.SYS_NAME_TO_HANDLE_AT, unix.SYS_QUOTACTL,
	// the kernel itself
	unix.SYS_KEXEC_LOAD, unix.SYS_KEXEC_FILE_LOAD, unix.SYS_INIT_MODULE, unix.SYS_FINIT_MODULE,
	unix.SYS_DELETE_MODULE, unix.SYS_BPF, unix.SYS_PERF_EVENT_OPEN, unix.SYS_USERFAULTFD,
	unix.SYS_KEYCTL, unix.SYS_ADD_KEY, unix.SYS_REQUEST_KEY, unix.SYS_REBOOT,
	unix.SYS_SWAPON, unix.SYS_SWAPOFF, unix.SYS_ACCT, unix.SYS_SYSLOG, unix.SYS_USELIB,
	unix.SYS_IOPL, unix.SYS_IOPERM, unix.SYS_VHANGUP, unix.SYS_LOOKUP_DCOOKIE,
	unix.SYS_SETTIMEOFDAY, unix.SYS_CLOCK_SETTIME, unix.SYS_CLOCK_ADJTIME, unix.SYS_ADJTIMEX,
	unix.SYS_SETHOSTNAME, unix.SYS_SETDOMAINNAME,
	// io_uring runs operations (sockets among them) that no filter sees
	unix.SYS_IO_URING_SETUP, unix.SYS_IO_URING_ENTER, unix.SYS_IO_URING_REGISTER,
}

// execSyscalls are handed to the supervisor (SECCOMP_RET_USER_NOTIF),
// which lets the first through and then closes its listener: every
// later one fails with ENOSYS.
var execSyscalls = []uint32{unix.SYS_EXECVE, unix.SYS_EXECVEAT}

// filter returns the seccomp program described above.
func filter() []unix.SockFilter {
	var p []unix.SockFilter
	stmt := func(code uint16, k uint32) { p = append(p, unix.SockFilter{Code: code, K: k}) }
	jump := func(code uint16, k uint32, jt, jf uint8) {
		p = append(p, unix.SockFilter{Code: code, Jt: jt, Jf: jf, K: k})
	}
	const (
		ld   = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
		jeq  = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
		jge  = unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K
		jset = unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K
		ret  = unix.BPF_RET | unix.BPF_K
	)
	eperm := uint32(unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM))
	// Only x86-64 calls; no x32 ones.
	stmt(ld, offArch)
	jump(jeq, unix.AUDIT_ARCH_X86_64, 1, 0)
	stmt(ret, unix.SECCOMP_RET_KILL_PROCESS)
	stmt(ld, offNr)
	jump(jge, x32Bit, 0, 1)
	stmt(ret, unix.SECCOMP_RET_KILL_PROCESS)
	// A holds nr from here on: each rule below either returns or is
	// jumped over whole.
	for _, nr := range execSyscalls {
		jump(jeq, nr, 0, 1)
		stmt(ret, unix.SECCOMP_RET_USER_NOTIF)
	}
	for _, nr := range deniedSyscalls {
		jump(jeq, nr, 0, 1)
		stmt(ret, eperm)
	}
	// socket and socketpair: AF_UNIX only (the family is an int: its low
	// 32 bits are all the kernel reads).
	for _, nr := range []uint32{unix.SYS_SOCKET, unix.SYS_SOCKETPAIR} {
		jump(jeq, nr, 0, 4)
		stmt(ld, offArg0)
		jump(jeq, unix.AF_UNIX, 0, 1)
		stmt(ret, unix.SECCOMP_RET_ALLOW)
		stmt(ret, eperm)
	}
	// clone may make threads and processes, not namespaces; clone3 hides
	// its flags behind a pointer, so it reports ENOSYS and the C library
	// falls back to clone.
	jump(jeq, unix.SYS_CLONE, 0, 4)
	stmt(ld, offArg0)
	jump(jset, cloneNewFlags, 0, 1)
	stmt(ret, eperm)
	stmt(ret, unix.SECCOMP_RET_ALLOW)
	jump(jeq, unix.SYS_CLONE3, 0, 1)
	stmt(ret, unix.SECCOMP_RET_ERRNO|uint32(unix.ENOSYS))
	stmt(ret, unix.SECCOMP_RET_ALLOW)
	return p
}

// installFilter sets no_new_privs and installs filter on the calling
// thread, which must be locked to its goroutine and is the one to exec;
// it returns the filter's notification listener.
func installFilter() (int, error) {
	if runtime.GOARCH != "amd64" {
		return -1, fmt.Errorf("seccomp filter: only amd64 is supported, not %s", runtime.GOARCH)
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return -1, fmt.Errorf("set no_new_privs: %w", err)
	}
	prog := filter()
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	fd, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER,
		unix.SECCOMP_FILTER_FLAG_NEW_LISTENER, uintptr(unsafe.Pointer(&fprog)))
	runtime.KeepAlive(prog)
	if errno != 0 {
		return -1, fmt.Errorf("install seccomp filter: %w", errno)
	}
	return int(fd), nil
}
