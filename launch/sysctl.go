package launch

import (
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/vmshim/vmshim/thread"
)

// sysctlNamespace is the namespace a sysctl belongs to, as runc classes
// them: the IPC namespace's (System V IPC and POSIX message queues), the
// network namespace's (net.*) and the UTS namespace's (the host and
// domain names). Any other is the node's own.
func sysctlNamespace(name string) (specs.LinuxNamespaceType, bool) {
	switch {
	case name == "kernel.msgmax", name == "kernel.msgmnb", name == "kernel.msgmni", name == "kernel.sem",
		name == "kernel.shmall", name == "kernel.shmmax", name == "kernel.shmmni", name == "kernel.shm_rmid_forced",
		strings.HasPrefix(name, "fs.mqueue."):
		return specs.IPCNamespace, true
	case strings.HasPrefix(name, "net."):
		return specs.NetworkNamespace, true
	case name == "kernel.hostname", name == "kernel.domainname":
		return specs.UTSNamespace, true
	}
	return "", false
}

// owns reports whether the pod has a namespace of type t apart from the
// host's: a new one, or one the spec names by path.
func (ns podNamespaces) owns(t specs.LinuxNamespaceType) bool {
	flag := 0
	switch t {
	case specs.NetworkNamespace:
		return ns.netns != ""
	case specs.UTSNamespace:
		if ns.newUTS {
			return true
		}
		flag = unix.CLONE_NEWUTS
	case specs.IPCNamespace:
		if ns.clone&unix.CLONE_NEWIPC != 0 {
			return true
		}
		flag = unix.CLONE_NEWIPC
	}
	for _, j := range ns.join {
		if flag != 0 && j.nstype == flag {
			return true
		}
	}
	return false
}

// sysctlName is a sysctl's name in its dotted form: components of
// letters, digits, '_' and '-', joined by single dots. Nothing else may
// reach the path under /proc/sys it becomes: a '/' or an empty component
// would let "net.x/../../kernel/core_pattern" pass as a network sysctl
// and write the node's.
var sysctlName = regexp.MustCompile(`^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$`)

// maxSysctls bounds how many sysctls a sandbox may set, and
// maxSysctlName the length of a name.
const (
	maxSysctls    = 256
	maxSysctlName = 256
)

// checkSysctls refuses a sysctl of the sandbox spec that is not in a
// namespace the pod has of its own, as runc refuses it: setting it would
// change the node's. A name that is not a plain dotted name is refused
// before it is classed.
func (ns podNamespaces) checkSysctls(sysctls map[string]string) error {
	if len(sysctls) > maxSysctls {
		return fmt.Errorf("%d sysctls, more than %d: %w", len(sysctls), maxSysctls, errdefs.ErrInvalidArgument)
	}
	for name := range sysctls {
		if len(name) > maxSysctlName || !sysctlName.MatchString(name) {
			return fmt.Errorf("sysctl %q is not a dotted sysctl name (letters, digits, _ and - between single dots): %w", name, errdefs.ErrInvalidArgument)
		}
		t, ok := sysctlNamespace(name)
		if !ok || !ns.owns(t) {
			return fmt.Errorf("sysctl %q is not in a namespace of the pod's own: %w", name, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// setSysctls sets the sandbox spec's sysctls (checked by checkSysctls)
// in the namespaces of the pod's pause process pid, which the pod's
// containers join, as runc sets them in the CRI's own sandbox container:
// from a thread in those namespaces, through /proc/sys.
func setSysctls(pid int, sysctls map[string]string) error {
	if len(sysctls) == 0 {
		return nil
	}
	steps := []thread.Step{thread.JoinNetns(fmt.Sprintf("/proc/%d/ns/net", pid))}
	for file, flag := range map[string]int{"ipc": unix.CLONE_NEWIPC, "uts": unix.CLONE_NEWUTS} {
		steps = append(steps, thread.JoinNamespace(fmt.Sprintf("/proc/%d/ns/%s", pid, file), flag))
	}
	names := make([]string, 0, len(sysctls))
	for n := range sysctls {
		names = append(names, n)
	}
	sort.Strings(names)
	return thread.Run(func() error {
		for _, n := range names {
			if err := os.WriteFile("/proc/sys/"+strings.ReplaceAll(n, ".", "/"), []byte(sysctls[n]), 0); err != nil {
				return fmt.Errorf("sysctl %s=%s: %w", n, sysctls[n], err)
			}
		}
		return nil
	}, steps...)
}
