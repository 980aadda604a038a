package network

import (
	"bytes"
	"fmt"
	"net"

	"github.com/containerd/errdefs"
	"github.com/vishvananda/netlink"
)

// AdoptMACs gives the CNI interfaces of the netns at nsPath, in the order
// Inspect wires them (ifindex order), the MACs macs names: those of a
// guest resumed from a saved state, whose NICs keep the MACs they had.
// Inspect then reads them, and the taps, the tc datapath and the DHCP and
// IPv6 responders serve the guest as one booted in this pod. The
// interfaces keep the MACs for as long as they exist. A count that
// differs from the netns's CNI interfaces, or a MAC that is not a
// unicast Ethernet address, is refused before anything changes.
func AdoptMACs(nsPath string, macs []string) error {
	want := make([]net.HardwareAddr, len(macs))
	for i, s := range macs {
		mac, err := net.ParseMAC(s)
		if err != nil || len(mac) != 6 || mac[0]&1 != 0 || bytes.Equal(mac, make(net.HardwareAddr, 6)) {
			return fmt.Errorf("MAC %q of NIC %d is not a unicast Ethernet address: %w", s, i, errdefs.ErrInvalidArgument)
		}
		want[i] = mac
	}
	p, err := openNS(nsPath)
	if err != nil {
		return err
	}
	defer p.Close()
	all, err := linksInOrder(p)
	if err != nil {
		return err
	}
	var links []netlink.Link
	for _, l := range all {
		if isCNILink(l) {
			links = append(links, l)
		}
	}
	if len(links) != len(want) {
		return fmt.Errorf("netns %s has %d network interfaces, and the guest has %d NICs: %w",
			nsPath, len(links), len(want), errdefs.ErrFailedPrecondition)
	}
	for i, l := range links {
		if bytes.Equal(l.Attrs().HardwareAddr, want[i]) {
			continue
		}
		if err := p.h.LinkSetHardwareAddr(l, want[i]); err != nil {
			return fmt.Errorf("give %s in netns %s the guest's MAC %s: %w", l.Attrs().Name, nsPath, want[i], err)
		}
	}
	return nil
}
