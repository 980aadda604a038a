package network

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestSteering writes rules with the real iptables (both of its
// backends) in netns of the test's own and reads them back: what steers
// a pod's traffic is named, what does not is not, and reading makes no
// table.
func TestSteering(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces")
	}
	for _, cmd := range []string{"iptables-nft", "iptables-legacy", "ip6tables-nft", "ip6tables-legacy"} {
		if _, err := exec.LookPath(cmd); err != nil {
			t.Skipf("%s: %v (make setup installs Debian's iptables)", cmd, err)
		}
	}
	const redirect = "-p tcp -j REDIRECT --to-ports 15006"
	for i, tc := range []struct {
		name  string
		rules []string // iptables command lines
		want  []string
	}{
		{"none", nil, nil},
		{"istio's inbound, nf_tables", []string{
			"iptables-nft -t nat -N ISTIO_INBOUND",
			"iptables-nft -t nat -A ISTIO_INBOUND -p tcp --dport 15008 -j RETURN",
			"iptables-nft -t nat -A ISTIO_INBOUND " + redirect,
			"iptables-nft -t nat -A PREROUTING -p tcp -j ISTIO_INBOUND",
		}, []string{"nf_tables ip table nat chain PREROUTING"}},
		{"a redirect, x_tables", []string{"iptables-legacy -t nat -A PREROUTING " + redirect},
			[]string{"iptables-legacy table nat chain PREROUTING"}},
		{"outbound, ipv6, x_tables", []string{"ip6tables-legacy -t nat -A OUTPUT -p tcp -j REDIRECT --to-ports 15001"},
			[]string{"ip6tables-legacy table nat chain OUTPUT"}},
		{"mangle prerouting, ipv6, nf_tables", []string{"ip6tables-nft -t mangle -A PREROUTING -p tcp -j MARK --set-mark 1"},
			[]string{"nf_tables ip6 table mangle chain PREROUTING"}},
		{"both backends", []string{"iptables-nft -t nat -A OUTPUT " + redirect, "iptables-legacy -t mangle -A PREROUTING -p tcp -j MARK --set-mark 1"},
			[]string{"nf_tables ip table nat chain OUTPUT", "iptables-legacy table mangle chain PREROUTING"}},
		{"tables listed, no rules", []string{"iptables-legacy -t nat -L", "iptables-nft -t nat -L", "ip6tables-legacy -t mangle -L"}, nil},
		{"a chain nothing jumps to", []string{"iptables-legacy -t nat -N MESH", "iptables-legacy -t nat -A MESH " + redirect}, nil},
		{"filter and postrouting", []string{
			"iptables-nft -A INPUT -p tcp -j ACCEPT",
			"iptables-legacy -A OUTPUT -p tcp -j ACCEPT",
			"iptables-nft -t nat -A POSTROUTING -j MASQUERADE",
			"ip6tables-legacy -t mangle -A OUTPUT -j MARK --set-mark 2",
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := fmt.Sprintf("vmshimt-nf-%d-%d", os.Getpid(), i)
			newNamedNS(t, name)
			for _, r := range tc.rules {
				args := append([]string{"netns", "exec", name}, strings.Fields(r)...)
				if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
					t.Fatalf("%s: %v: %s", r, err, out)
				}
			}
			path := "/run/netns/" + name
			got, err := Steering(path)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("Steering = %q, want %q", got, tc.want)
			}
			// Reading instantiated no x_tables table.
			out, err := exec.Command("ip", "netns", "exec", name, "cat", "/proc/net/ip_tables_names", "/proc/net/ip6_tables_names").Output()
			if err != nil {
				t.Fatal(err)
			}
			for _, used := range strings.Fields(string(out)) {
				if !slices.ContainsFunc(tc.rules, func(r string) bool { return strings.Contains(r, "-legacy") && tableOf(r) == used }) {
					t.Errorf("the netns has x_tables table %s, which no rule made", used)
				}
			}
		})
	}
	if _, err := Steering("/run/netns/vmshimt-nf-none"); err == nil {
		t.Errorf("Steering of a missing netns: no error")
	}
}

// tableOf is the table an iptables command line names.
func tableOf(cmd string) string {
	f := strings.Fields(cmd)
	if i := slices.Index(f, "-t"); i >= 0 && i+1 < len(f) {
		return f[i+1]
	}
	return "filter"
}
