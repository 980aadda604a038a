// Package network turns the pod's network namespace into NICs for the VM:
// taps wired to the CNI interfaces and a DHCP responder that hands the VM
// the pod's addresses.
package network
