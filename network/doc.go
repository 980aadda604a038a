// Package network turns the pod's network namespace into NICs for the VM:
// taps wired to the CNI interfaces, a DHCP responder that hands the VM the
// pod's IPv4 addresses, and a router advertiser and DHCPv6 server that
// hand it the pod's IPv6 addresses, the netns routing its IPv6 traffic.
package network
