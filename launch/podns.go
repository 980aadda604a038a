package launch

import (
	"fmt"
	"path/filepath"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/vmshim/vmshim/thread"
)

// podNamespaces says where a pod sandbox's pause process holds each
// namespace that the CRI hands the pod's other containers through
// /proc/PID/ns/{net,ipc,uts,pid}. The network namespace is the pod's,
// joined as for a VM (see netnsSteps). For ipc, uts and pid the sandbox
// spec's linux.namespaces decide, as runc reads them for the CRI's own
// sandbox container: a type listed without a path is a new namespace, one
// listed with a path is joined, one not listed is the host's (a pod with
// hostIPC, hostPID or hostNetwork). The mount, user, cgroup and time
// namespaces stay the shim's: no container joins the sandbox's mount
// namespace, and the CRI pins a pod's user namespace itself.
type podNamespaces struct {
	netns    string  // the pod's network namespace; "" for the host's
	clone    uintptr // unix.CLONE_NEWIPC, CLONE_NEWPID: new with the process
	newUTS   bool    // a new UTS namespace, named hostname
	hostname string  // "" keeps the name the host has
	join     []nsJoin
}

// nsJoin is a namespace the spec names by path.
type nsJoin struct {
	nstype int // unix.CLONE_NEWIPC, CLONE_NEWUTS or CLONE_NEWPID
	path   string
}

// podNamespaceTypes are the namespace types a pause process holds for the
// pod beside its network namespace, with the clone flag of each.
var podNamespaceTypes = []struct {
	typ  specs.LinuxNamespaceType
	flag int
}{
	{specs.IPCNamespace, unix.CLONE_NEWIPC},
	{specs.UTSNamespace, unix.CLONE_NEWUTS},
	{specs.PIDNamespace, unix.CLONE_NEWPID},
}

// sandboxNamespaces reads where a pod sandbox's pause process holds the
// pod's namespaces from its spec. It refuses a type listed twice, a path
// that is not absolute, and a host name the new UTS namespace cannot
// take. The spec's host name is set only in a new UTS namespace: a pod in
// the host's, or another's, keeps that one's name.
func sandboxNamespaces(spec *specs.Spec) (podNamespaces, error) {
	var ns podNamespaces
	if spec.Linux == nil {
		return ns, nil
	}
	listed := map[specs.LinuxNamespaceType]specs.LinuxNamespace{}
	for _, n := range spec.Linux.Namespaces {
		if _, dup := listed[n.Type]; dup {
			return ns, fmt.Errorf("sandbox spec lists namespace %q twice: %w", n.Type, errdefs.ErrInvalidArgument)
		}
		if n.Path != "" && !filepath.IsAbs(n.Path) {
			return ns, fmt.Errorf("sandbox spec's %q namespace path %q is not absolute: %w", n.Type, n.Path, errdefs.ErrInvalidArgument)
		}
		listed[n.Type] = n
	}
	ns.netns = listed[specs.NetworkNamespace].Path
	for _, t := range podNamespaceTypes {
		n, ok := listed[t.typ]
		switch {
		case !ok:
		case n.Path != "":
			ns.join = append(ns.join, nsJoin{nstype: t.flag, path: n.Path})
		case t.typ == specs.UTSNamespace:
			ns.newUTS = true
		default:
			ns.clone |= uintptr(t.flag)
		}
	}
	if ns.newUTS && spec.Hostname != "" {
		if err := checkHostname(spec.Hostname); err != nil {
			return ns, err
		}
		ns.hostname = spec.Hostname
	}
	return ns, nil
}

// steps move the thread a pause process is forked from into the pod's
// network namespace, the namespaces the spec names by path, and a new
// UTS namespace named after the pod. (A pid namespace joined this way is
// the one the process starts in.)
func (ns podNamespaces) steps() []thread.Step {
	steps := netnsSteps(ns.netns)
	for _, j := range ns.join {
		steps = append(steps, thread.JoinNamespace(j.path, j.nstype))
	}
	if ns.newUTS {
		steps = append(steps, thread.NewUTS(ns.hostname))
	}
	return steps
}

// maxHostname is the longest host name Linux keeps (HOST_NAME_MAX).
const maxHostname = 64

// checkHostname refuses a host name the kernel would not keep whole (over
// 64 bytes) or that holds a control character (a NUL or a newline that
// would cut or forge the lines of whoever prints it). Others are set as
// given, as runc sets them: the kubelet gives RFC 1123 names, and the
// CRI's other callers may give any other, which the VM's DHCP and
// cloud-init carry as a value.
func checkHostname(name string) error {
	bad := func(why string) error {
		return fmt.Errorf("pod hostname %.80q %s: %w", name, why, errdefs.ErrInvalidArgument)
	}
	if name == "" || len(name) > maxHostname {
		return bad(fmt.Sprintf("is %d bytes, not 1 to %d", len(name), maxHostname))
	}
	for _, c := range []byte(name) {
		if c < 0x20 || c == 0x7f {
			return bad(fmt.Sprintf("holds the control character %q", []byte{c}))
		}
	}
	return nil
}
