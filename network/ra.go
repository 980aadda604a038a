package network

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/mdlayher/ndp"
	"golang.org/x/net/idna"
)

// raInterval is the period of unsolicited router advertisements. Every
// lifetime an advertisement gives with no lease behind it (the default
// route's, the name servers' and search list's) is three of them, so
// that the guest keeps them across two lost advertisements (RFC 8106
// §5.1 asks for at least that).
const raInterval = 10 * time.Minute

// raLifetime is the router lifetime and the RDNSS and DNSSL lifetimes.
const raLifetime = 3 * raInterval

// ndp v1.1.0 computes an option's length in bytes in a uint8 and so
// cannot marshal an option of 256 bytes or more: these bounds keep every
// option below that.
const (
	maxRDNSSServers = 15  // 8 + 15*16 = 248 bytes
	maxDNSSLNames   = 240 // encoded names in one option of 248 bytes
)

// routerAdvertisement is the router advertisement the tap sends the guest
// from the link-local address that has routerMAC. It sends the guest to
// DHCPv6 for its address and other configuration (M and O set): the
// prefixes it announces are on-link only, never for SLAAC (L=1, A=0). It
// offers a default route when lease.Router, and carries the MTU and the
// name servers and search list (RFC 8106) for guests without a DHCPv6
// client for them.
//
// Name servers are split into RDNSS options of at most 15 and names into
// DNSSL options of at most 240 bytes; a name that cannot be encoded there
// (too long once in punycode) is left to DHCPv6 option 24. The result
// marshals with ndp.MarshalMessage; its size is the lease's business.
func routerAdvertisement(lease *Lease6, routerMAC net.HardwareAddr) (*ndp.RouterAdvertisement, error) {
	if lease == nil {
		return nil, fmt.Errorf("router advertisement: nil lease: %w", errdefs.ErrInvalidArgument)
	}
	if err := checkLease6(lease); err != nil {
		return nil, err
	}
	if len(routerMAC) != 6 {
		return nil, fmt.Errorf("router advertisement for %s: invalid router mac %v: %w", lease.MAC, routerMAC, errdefs.ErrInvalidArgument)
	}
	ra := &ndp.RouterAdvertisement{
		CurrentHopLimit:      64,
		ManagedConfiguration: true,
		OtherConfiguration:   true,
		Options: []ndp.Option{&ndp.LinkLayerAddress{
			Direction: ndp.Source,
			Addr:      append(net.HardwareAddr(nil), routerMAC...),
		}},
	}
	if lease.Router {
		ra.RouterLifetime = raLifetime
	}
	if lease.MTU > 0 {
		ra.Options = append(ra.Options, ndp.NewMTU(uint32(lease.MTU)))
	}
	life := lifetime6(lease)
	for _, p := range lease.OnLink {
		addr, _ := netip.AddrFromSlice(p.IP.To16())
		ones, _ := p.Mask.Size()
		prefix := netip.PrefixFrom(addr, ones).Masked()
		ra.Options = append(ra.Options, &ndp.PrefixInformation{
			PrefixLength:      uint8(ones),
			OnLink:            true,
			ValidLifetime:     life,
			PreferredLifetime: life,
			Prefix:            prefix.Addr(),
		})
	}
	for servers := lease.DNS; len(servers) > 0; {
		n := min(len(servers), maxRDNSSServers)
		rdnss := &ndp.RecursiveDNSServer{Lifetime: raLifetime}
		for _, s := range servers[:n] {
			a, _ := netip.AddrFromSlice(s.To16())
			rdnss.Servers = append(rdnss.Servers, a)
		}
		ra.Options = append(ra.Options, rdnss)
		servers = servers[n:]
	}
	for _, names := range dnsslGroups(searchList6(lease)) {
		ra.Options = append(ra.Options, &ndp.DNSSearchList{Lifetime: raLifetime, DomainNames: names})
	}
	if _, err := ndp.MarshalMessage(ra); err != nil {
		return nil, fmt.Errorf("router advertisement for %s: %w: %w", lease.MAC, err, errdefs.ErrInvalidArgument)
	}
	return ra, nil
}

// dnsslGroups splits names into the DomainNames of DNSSL options ndp can
// marshal, in order, leaving out the names that fit none: those idna
// refuses, and those with a label over 63 bytes or over 238 bytes in all
// once in punycode.
func dnsslGroups(names []string) [][]string {
	var groups [][]string
	var cur []string
	size := 0
	for _, n := range names {
		a, err := idna.ToASCII(n)
		if err != nil || len(a)+2 > maxDNSSLNames || slices.ContainsFunc(strings.Split(a, "."), func(l string) bool { return len(l) > 63 }) {
			continue
		}
		// A name is its labels with a length byte each, and a final 0.
		enc := len(a) + 2
		if size+enc > maxDNSSLNames {
			groups = append(groups, cur)
			cur, size = nil, 0
		}
		cur = append(cur, n)
		size += enc
	}
	if len(cur) > 0 {
		groups = append(groups, cur)
	}
	return groups
}
