package diskcache

import (
	"net/netip"
	"testing"
)

// FuzzDenyControl feeds Control any address: what it lets through is an
// address outside the default deny list in every spelling.
func FuzzDenyControl(f *testing.F) {
	for _, s := range []string{"169.254.169.254:80", "[::ffff:169.254.169.254]:80", "[fe80::1%eth0]:80", "127.0.0.1:80", "[::1]:443", "[64:ff9b::a9fe:a9fe]:80", "x:1"} {
		f.Add(s)
	}
	deny, err := ParseDeny(DefaultDeny)
	if err != nil {
		f.Fatal(err)
	}
	n := &Netns{Deny: deny}
	f.Fuzz(func(t *testing.T, addr string) {
		if n.control("tcp", addr, nil) != nil {
			return
		}
		ap, err := netip.ParseAddrPort(addr)
		if err != nil {
			t.Fatalf("%q let through but is no address", addr)
		}
		a := ap.Addr().Unmap().WithZone("")
		for _, p := range deny {
			if p.Contains(a) {
				t.Fatalf("%q let through but %s holds it", addr, p)
			}
		}
	})
}
