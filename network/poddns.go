package network

import (
	"net/netip"
)

// PodDNS returns the name servers and the search list of the pod's
// resolv.conf at path, for lookups made on the pod's behalf (disks by
// URL); none when path is empty or the file is missing.
func PodDNS(path string) (servers []netip.Addr, search []string, err error) {
	dns, dns6, search, err := readResolvConf(path)
	if err != nil {
		return nil, nil, err
	}
	for _, ip := range append(dns, dns6...) {
		if a, ok := netip.AddrFromSlice(ip); ok {
			servers = append(servers, a.Unmap())
		}
	}
	return servers, search, nil
}
