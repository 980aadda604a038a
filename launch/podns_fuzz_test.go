package launch

import (
	"path/filepath"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// fuzzNamespaceTypes are the types FuzzSandboxNamespaces lists, by bit of
// its list mask; the bit above them lists a type of its own.
var fuzzNamespaceTypes = []specs.LinuxNamespaceType{
	specs.NetworkNamespace, specs.IPCNamespace, specs.UTSNamespace, specs.PIDNamespace, specs.MountNamespace, specs.UserNamespace,
}

// FuzzSandboxNamespaces feeds sandboxNamespaces a sandbox spec's host
// name and namespaces, from the CRI: listed by the bits of list, given
// path when the same bit of withPath is set, other listed once more. What
// it accepts must be safe to act on: a host name the kernel takes, set
// only in a new UTS namespace, absolute paths, no clone flag but ipc and
// pid; what it refuses, it refuses in one line.
func FuzzSandboxNamespaces(f *testing.F) {
	f.Add("web-0", uint8(0b001111), uint8(0b000001), "/proc/7/ns/net", "")
	f.Add("", uint8(0b010001), uint8(0b000001), "/run/netns/cni-1", "")
	f.Add("db.ns.svc", uint8(0b001110), uint8(0b001110), "/proc/7/ns/x", "")
	f.Add("a_b", uint8(0b000100), uint8(0), "", "")
	f.Add("x", uint8(0b1000010), uint8(0), "", "ipc")
	f.Add("x", uint8(0b1000000), uint8(0b1000000), "rel\npath", "bad\ntype")
	f.Fuzz(func(t *testing.T, hostname string, list, withPath uint8, path, other string) {
		spec := &specs.Spec{Hostname: hostname, Linux: &specs.Linux{}}
		add := func(typ specs.LinuxNamespaceType, bit int) {
			if list&(1<<bit) == 0 {
				return
			}
			n := specs.LinuxNamespace{Type: typ}
			if withPath&(1<<bit) != 0 {
				n.Path = path
			}
			spec.Linux.Namespaces = append(spec.Linux.Namespaces, n)
		}
		for i, typ := range fuzzNamespaceTypes {
			add(typ, i)
		}
		add(specs.LinuxNamespaceType(other), len(fuzzNamespaceTypes))
		ns, err := sandboxNamespaces(spec)
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("refusal of more than one line: %q", err)
			}
			return
		}
		if ns.clone&^uintptr(unix.CLONE_NEWIPC|unix.CLONE_NEWPID) != 0 {
			t.Fatalf("clone flags %#x", ns.clone)
		}
		if ns.hostname != "" {
			if !ns.newUTS || ns.hostname != hostname || len(hostname) > maxHostname ||
				strings.IndexFunc(hostname, func(r rune) bool { return r < 0x20 || r == 0x7f }) >= 0 {
				t.Fatalf("host name %q accepted for %+v", hostname, ns)
			}
		}
		for _, j := range ns.join {
			if !filepath.IsAbs(j.path) {
				t.Fatalf("relative path %q accepted", j.path)
			}
		}
		if ns.netns != "" && !filepath.IsAbs(ns.netns) {
			t.Fatalf("relative netns %q accepted", ns.netns)
		}
	})
}
