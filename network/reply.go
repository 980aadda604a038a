package network

import (
	"fmt"
	"net"

	"github.com/insomniacslk/dhcp/dhcpv4"
)

// dhcpExchange is a DHCP frame received from the VM and what answers it.
type dhcpExchange struct {
	req   *dhcpv4.DHCPv4 // the request the frame carries
	reply *dhcpv4.DHCPv4 // nil: nothing is sent
	dst   dhcpDest       // where frame goes
	frame []byte         // the Ethernet frame that carries reply
}

// replyFrame parses an Ethernet frame received from the VM and builds the
// frame that answers it, from srcMAC, for lease. It is pure: no I/O.
func replyFrame(srcMAC net.HardwareAddr, lease *Lease, frame []byte) (dhcpExchange, error) {
	src, payload, err := parseDHCPFrame(frame)
	if err != nil {
		return dhcpExchange{}, err
	}
	req, err := dhcpv4.FromBytes(payload)
	if err != nil {
		return dhcpExchange{}, fmt.Errorf("parse dhcp message from %s: %w", src, err)
	}
	x := dhcpExchange{req: req}
	if x.reply, err = Handle(req, lease); err != nil || x.reply == nil {
		return x, err
	}
	x.dst = replyDest(req, x.reply, src)
	if x.frame, err = buildDHCPFrame(srcMAC, lease.ServerID, x.dst, x.reply.ToBytes()); err != nil {
		return x, err
	}
	return x, nil
}
