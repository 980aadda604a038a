package network

import (
	"bytes"
	"fmt"
	"net"
	"reflect"
	"strings"
	"testing"

	"github.com/insomniacslk/dhcp/dhcpv4"
)

// resolvConfSeeds are resolv.conf files as the kubelet writes them for
// each DNS policy, and some it never would.
func resolvConfSeeds() []string {
	return []string{
		"search default.svc.cluster.local svc.cluster.local cluster.local\nnameserver 10.96.0.10\noptions ndots:5\n",
		"nameserver 1.1.1.1\nnameserver 2606:4700:4700::1111\nnameserver 1.1.1.1\ndomain example.com\n",
		"# comment\n; comment\nsearch a b # trailing\ndomain c\nsearch\nnameserver\n",
		"search example.com. corp.example.\nnameserver ::ffff:192.0.2.53\n",
		"search " + strings.Repeat("a", 64) + ".example\n",
		"search a..b .c d.\nnameserver 192.0.2.1 extra\n",
		"search " + strings.Repeat("x.", 130) + "\n",
		"search caf\u00e9.example \xff.example\r\nnameserver\t192.0.2.2\r\n",
		"nameserver 999.1.1.1\nnameserver 0.0.0.0\nnameserver 255.255.255.255\n",
		"",
	}
}

// FuzzResolvConf parses the pod's resolv.conf, which the pod spec's DNS
// settings shape, and checks that the DHCP reply built from it hands the
// guest exactly the name servers and search domains it holds.
func FuzzResolvConf(f *testing.F) {
	for _, s := range resolvConfSeeds() {
		f.Add([]byte(s))
	}
	lease := testLease(f)
	discover := testMessage(f, lease.MAC, dhcpv4.MessageTypeDiscover)
	f.Fuzz(func(t *testing.T, data []byte) {
		dns, _, search, err := parseResolvConf(bytes.NewReader(data))
		if err != nil {
			return
		}
		for i, ip := range dns {
			if len(ip) != net.IPv4len || indexIP(dns[:i], ip) >= 0 {
				t.Fatalf("name servers %v", dns)
			}
		}
		for _, s := range search {
			if s == "" || strings.ContainsAny(s, " \t\r\n#;") {
				t.Fatalf("search domain %q", s)
			}
		}
		l := cloneDHCPLease(*lease)
		l.DNS, l.Search = dns, search
		reply, err := Handle(discover, &l)
		if err != nil || reply == nil {
			t.Fatalf("Handle = %v, %v", reply, err)
		}
		got := wire(t, reply)
		if gotDNS := got.DNS(); len(dns) > 0 && !reflect.DeepEqual(gotDNS, dns) || len(dns) == 0 && gotDNS != nil {
			t.Fatalf("reply names servers %v, resolv.conf %v", gotDNS, dns)
		}
		if len(search) == 0 {
			if got.Options.Has(dhcpv4.OptionDNSDomainSearchList) || got.Options.Has(dhcpv4.OptionDomainName) {
				t.Fatal("reply has search domains, resolv.conf none")
			}
			return
		}
		gotSearch, err := strictNames(got.Options.Get(dhcpv4.OptionDNSDomainSearchList))
		if err != nil {
			t.Fatalf("search option for %q: %v", search, err)
		}
		if !reflect.DeepEqual(gotSearch, search) || got.DomainName() != search[0] {
			t.Fatalf("reply has domain %q and search %q, resolv.conf search %q", got.DomainName(), gotSearch, search)
		}
	})
}

// strictNames decodes uncompressed DNS names as RFC 1035 has them: labels
// of 1 to 63 bytes, each name at most 255 bytes on the wire and ended by
// the empty label. Clients refuse anything else.
func strictNames(b []byte) ([]string, error) {
	var names []string
	for len(b) > 0 {
		var labels []string
		wire := 0
		for {
			if len(b) == 0 {
				return nil, fmt.Errorf("name %q is not terminated", labels)
			}
			n := int(b[0])
			wire += 1 + n
			if n == 0 {
				b = b[1:]
				break
			}
			if n > 63 || len(b) < 1+n {
				return nil, fmt.Errorf("label of %d bytes after %q", n, labels)
			}
			labels, b = append(labels, string(b[1:1+n])), b[1+n:]
		}
		if len(labels) == 0 || wire > 255 {
			return nil, fmt.Errorf("name %q of %d bytes", labels, wire)
		}
		names = append(names, strings.Join(labels, "."))
	}
	return names, nil
}

func indexIP(ips []net.IP, ip net.IP) int {
	for i, x := range ips {
		if x.Equal(ip) {
			return i
		}
	}
	return -1
}
