package network

import (
	"net"
	"time"
)

// Route is one IPv4 route the guest should have: Dst nil means the
// default route; Gw nil means the destination is on-link.
type Route struct {
	Dst *net.IPNet
	Gw  net.IP
}

// Lease is what the DHCP responder hands the VM on one NIC.
type Lease struct {
	MAC       net.HardwareAddr // the only client answered
	IP        net.IP           // the pod IP on this interface
	Mask      net.IPMask
	Gateway   net.IP  // option 3; nil when the interface has no default route
	Routes    []Route // option 121 (classless static routes), which clients prefer to option 3
	MTU       int     // option 26
	DNS       []net.IP
	Search    []string
	Hostname  string
	ServerID  net.IP // option 54: the address the responder speaks as
	LeaseTime time.Duration
}

// Lease6 is what the IPv6 responder hands the VM on one NIC: router
// advertisements from the tap's link-local address, and the pod's address
// through stateful DHCPv6.
type Lease6 struct {
	MAC       net.HardwareAddr // the only client answered
	IP        net.IP           // the pod's IPv6 address on this interface (IA_NA)
	OnLink    []*net.IPNet     // prefixes on-link for the guest (PIO, L=1 A=0)
	Router    bool             // advertise a default route through the tap's link-local address
	MTU       int              // RA MTU option; 0: none
	DNS       []net.IP         // IPv6 name servers (RDNSS, DHCPv6 option 23)
	Search    []string         // DNSSL, DHCPv6 option 24
	LeaseTime time.Duration    // valid and preferred lifetime of the address; 0: DefaultLeaseTime
}
