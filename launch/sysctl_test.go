package launch

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

func TestCheckSysctls(t *testing.T) {
	podOwn := podNamespaces{netns: "/run/netns/pod", clone: unix.CLONE_NEWIPC, newUTS: true}
	hostAll := podNamespaces{}
	joined := podNamespaces{join: []nsJoin{{nstype: unix.CLONE_NEWIPC, path: "/proc/1/ns/ipc"}, {nstype: unix.CLONE_NEWUTS, path: "/proc/1/ns/uts"}}}
	for _, tc := range []struct {
		name   string
		ns     podNamespaces
		sysctl string
		ok     bool
	}{
		{"ipc shm, pod's ipc", podOwn, "kernel.shm_rmid_forced", true},
		{"mqueue, pod's ipc", podOwn, "fs.mqueue.msg_max", true},
		{"net, pod's netns", podOwn, "net.ipv4.ip_unprivileged_port_start", true},
		{"uts, pod's uts", podOwn, "kernel.domainname", true},
		{"ipc, joined ipc", joined, "kernel.sem", true},
		{"uts, joined uts", joined, "kernel.hostname", true},
		{"ipc, host ipc", hostAll, "kernel.shm_rmid_forced", false},
		{"net, host network", hostAll, "net.ipv4.ip_forward", false},
		{"uts, host uts", hostAll, "kernel.hostname", false},
		{"node-wide", podOwn, "kernel.panic", false},
		{"node-wide vm", podOwn, "vm.overcommit_memory", false},
		{"net with a path out of net", podOwn, "net.x/../../kernel/core_pattern", false},
		{"net with dot-dot", podOwn, "net..ipv4", false},
		{"net, slash form", podOwn, "net/ipv4/ip_forward", false},
		{"trailing dot", podOwn, "net.ipv4.", false},
		{"empty", podOwn, "", false},
		{"nul", podOwn, "net.ipv4\x00", false},
		{"long", podOwn, "net." + strings.Repeat("a", 300), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.ns.checkSysctls(map[string]string{tc.sysctl: "1"})
			if tc.ok && err != nil {
				t.Fatalf("checkSysctls(%s): %v", tc.sysctl, err)
			}
			if !tc.ok && !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("checkSysctls(%s) = %v, want an invalid argument", tc.sysctl, err)
			}
		})
	}
}

func TestCheckSysctlsCount(t *testing.T) {
	ns := podNamespaces{netns: "/run/netns/pod"}
	many := map[string]string{}
	for i := range maxSysctls + 1 {
		many[fmt.Sprintf("net.ipv4.conf.eth%d.forwarding", i)] = "0"
	}
	if err := ns.checkSysctls(many); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("checkSysctls of %d sysctls = %v, want an invalid argument", len(many), err)
	}
}
