package launch

import (
	"fmt"
	"os"
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

// checkSysctls refuses a sysctl of the sandbox spec that is not in a
// namespace the pod has of its own, as runc refuses it: setting it would
// change the node's.
func (ns podNamespaces) checkSysctls(sysctls map[string]string) error {
	for name := range sysctls {
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
