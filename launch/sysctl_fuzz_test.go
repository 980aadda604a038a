package launch

import (
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// FuzzCheckSysctls: a sysctl name the check lets through becomes a path
// under /proc/sys that stays in the part of the tree its namespace
// holds, whatever the name.
func FuzzCheckSysctls(f *testing.F) {
	for _, s := range []string{"net.ipv4.ip_forward", "kernel.shm_rmid_forced", "fs.mqueue.msg_max", "kernel.hostname",
		"net.x/../../kernel/core_pattern", "net..x", "net/ipv4/ip_forward", "kernel.panic", "", "net.ipv4.conf.eth0-1.rp_filter"} {
		f.Add(s)
	}
	ns := podNamespaces{netns: "/run/netns/pod", clone: unix.CLONE_NEWIPC, newUTS: true}
	f.Fuzz(func(t *testing.T, name string) {
		if ns.checkSysctls(map[string]string{name: "1"}) != nil {
			return
		}
		p := "/proc/sys/" + strings.ReplaceAll(name, ".", "/")
		if filepath.Clean(p) != p {
			t.Fatalf("accepted %q: path %s is not clean", name, p)
		}
		ok := false
		for _, under := range []string{"/proc/sys/net/", "/proc/sys/fs/mqueue/", "/proc/sys/kernel/"} {
			ok = ok || strings.HasPrefix(p, under)
		}
		if !ok {
			t.Fatalf("accepted %q: path %s is outside the namespaced sysctls", name, p)
		}
	})
}
