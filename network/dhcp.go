package network

import (
	"bytes"
	"fmt"
	"net"
	"time"

	"github.com/containerd/errdefs"
	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/rfc1035label"
)

// DefaultLeaseTime is the lease time offered when Lease.LeaseTime is 0.
const DefaultLeaseTime = 24 * time.Hour

// Handle returns the reply to a DHCPv4 message from the VM, or nil when it must be ignored.
//
// It is pure: no I/O. DISCOVER gets an OFFER; a REQUEST (selecting,
// init-reboot, renewing or rebinding) for the lease's IP gets an ACK and one
// for another IP (requested-IP option or ciaddr) a NAK; INFORM gets an ACK
// without yiaddr or lease times; RELEASE and DECLINE get nothing (the VM
// can only ever have the pod's address). Messages from a MAC other than
// lease.MAC, replies, and REQUESTs naming another server are ignored.
func Handle(req *dhcpv4.DHCPv4, lease *Lease) (*dhcpv4.DHCPv4, error) {
	if req == nil || lease == nil {
		return nil, fmt.Errorf("dhcp handle: nil message or lease: %w", errdefs.ErrInvalidArgument)
	}
	if err := checkDHCPLease(lease); err != nil {
		return nil, err
	}
	if req.OpCode != dhcpv4.OpcodeBootRequest || !bytes.Equal(req.ClientHWAddr, lease.MAC) {
		return nil, nil
	}
	switch mt := req.MessageType(); mt {
	case dhcpv4.MessageTypeDiscover:
		reply := newDHCPReply(req, lease, dhcpv4.MessageTypeOffer)
		reply.YourIPAddr = lease.IP.To4()
		addConfigOptions(reply, lease)
		addLeaseOptions(reply, lease)
		return reply, nil
	case dhcpv4.MessageTypeRequest:
		return handleRequest(req, lease)
	case dhcpv4.MessageTypeInform:
		reply := newDHCPReply(req, lease, dhcpv4.MessageTypeAck)
		reply.ClientIPAddr = ipv4OrZero(req.ClientIPAddr)
		addConfigOptions(reply, lease)
		return reply, nil
	case dhcpv4.MessageTypeRelease, dhcpv4.MessageTypeDecline:
		return nil, nil
	default:
		return nil, nil
	}
}

// handleRequest answers a REQUEST in any of the states of RFC 2131 §4.3.2.
func handleRequest(req *dhcpv4.DHCPv4, lease *Lease) (*dhcpv4.DHCPv4, error) {
	if sid := req.ServerIdentifier(); sid != nil && !sid.Equal(lease.ServerID) {
		// SELECTING another server's offer.
		return nil, nil
	}
	requested := req.RequestedIPAddress()
	hasRequested := requested != nil && !requested.IsUnspecified()
	hasCiaddr := req.ClientIPAddr != nil && !req.ClientIPAddr.IsUnspecified()
	if !hasRequested && !hasCiaddr {
		return nil, fmt.Errorf("dhcp request from %s names no address: %w", req.ClientHWAddr, errdefs.ErrInvalidArgument)
	}
	if (hasRequested && !requested.Equal(lease.IP)) || (hasCiaddr && !req.ClientIPAddr.Equal(lease.IP)) {
		nak := newDHCPReply(req, lease, dhcpv4.MessageTypeNak)
		nak.Options.Update(dhcpv4.OptMessage("requested address is not this interface's address"))
		return nak, nil
	}
	reply := newDHCPReply(req, lease, dhcpv4.MessageTypeAck)
	reply.ClientIPAddr = ipv4OrZero(req.ClientIPAddr)
	reply.YourIPAddr = lease.IP.To4()
	addConfigOptions(reply, lease)
	addLeaseOptions(reply, lease)
	return reply, nil
}

// newDHCPReply returns a reply to req of type mt with the header fields of
// RFC 2131 table 3 that do not depend on the message type, the message type
// and server identifier, and the options a server must echo.
func newDHCPReply(req *dhcpv4.DHCPv4, lease *Lease, mt dhcpv4.MessageType) *dhcpv4.DHCPv4 {
	reply := &dhcpv4.DHCPv4{
		OpCode:        dhcpv4.OpcodeBootReply,
		HWType:        req.HWType,
		TransactionID: req.TransactionID,
		Flags:         req.Flags,
		ClientIPAddr:  net.IPv4zero.To4(),
		YourIPAddr:    net.IPv4zero.To4(),
		ServerIPAddr:  net.IPv4zero.To4(),
		GatewayIPAddr: ipv4OrZero(req.GatewayIPAddr),
		ClientHWAddr:  append(net.HardwareAddr(nil), req.ClientHWAddr...),
		Options:       make(dhcpv4.Options),
	}
	reply.Options.Update(dhcpv4.OptMessageType(mt))
	reply.Options.Update(dhcpv4.OptServerIdentifier(lease.ServerID.To4()))
	// RFC 6842 (client identifier) and RFC 3046 (relay agent information).
	for _, code := range []dhcpv4.OptionCode{dhcpv4.OptionClientIdentifier, dhcpv4.OptionRelayAgentInformation} {
		if v := req.Options.Get(code); v != nil {
			reply.Options.Update(dhcpv4.OptGeneric(code, v))
		}
	}
	return reply
}

// addConfigOptions adds the interface configuration: mask, broadcast,
// router, classless routes, MTU, DNS, domain and hostname.
func addConfigOptions(reply *dhcpv4.DHCPv4, lease *Lease) {
	mask := ipv4MaskOf(lease.Mask)
	ip := lease.IP.To4()
	bcast := make(net.IP, net.IPv4len)
	for i := range bcast {
		bcast[i] = ip[i] | ^mask[i]
	}
	reply.Options.Update(dhcpv4.OptSubnetMask(mask))
	reply.Options.Update(dhcpv4.OptBroadcastAddress(bcast))
	if lease.Gateway != nil {
		reply.Options.Update(dhcpv4.OptRouter(lease.Gateway.To4()))
	}
	if routes := classlessRoutes(lease); len(routes) > 0 {
		reply.Options.Update(dhcpv4.OptClasslessStaticRoute(routes...))
	}
	if lease.MTU > 0 {
		reply.Options.Update(dhcpv4.OptGeneric(dhcpv4.OptionInterfaceMTU, []byte{byte(lease.MTU >> 8), byte(lease.MTU)}))
	}
	if len(lease.DNS) > 0 {
		dns := make([]net.IP, 0, len(lease.DNS))
		for _, s := range lease.DNS {
			dns = append(dns, s.To4())
		}
		reply.Options.Update(dhcpv4.OptDNS(dns...))
	}
	if len(lease.Search) > 0 {
		reply.Options.Update(dhcpv4.OptDomainName(lease.Search[0]))
		reply.Options.Update(dhcpv4.OptDomainSearch(&rfc1035label.Labels{Labels: append([]string(nil), lease.Search...)}))
	}
	if lease.Hostname != "" {
		reply.Options.Update(dhcpv4.OptHostName(lease.Hostname))
	}
}

// addLeaseOptions adds the lease time with T1 = lease/2 and T2 = lease*7/8.
func addLeaseOptions(reply *dhcpv4.DHCPv4, lease *Lease) {
	d := leaseDuration(lease)
	reply.Options.Update(dhcpv4.OptIPAddressLeaseTime(d))
	reply.Options.Update(dhcpv4.OptRenewTimeValue(d / 2))
	reply.Options.Update(dhcpv4.OptRebindingTimeValue(d / 8 * 7))
}

// leaseDuration is the lease time to offer, in whole seconds.
func leaseDuration(lease *Lease) time.Duration {
	d := lease.LeaseTime
	if d == 0 {
		d = DefaultLeaseTime
	}
	return d.Truncate(time.Second)
}

// classlessRoutes returns option 121's routes: every route of the lease,
// plus a default route through the gateway when the lease has a gateway but
// no default route, because clients ignore option 3 when 121 is present
// (RFC 3442). On-link routes use router 0.0.0.0.
func classlessRoutes(lease *Lease) []*dhcpv4.Route {
	if len(lease.Routes) == 0 {
		return nil
	}
	out := make([]*dhcpv4.Route, 0, len(lease.Routes)+1)
	hasDefault := false
	for _, r := range lease.Routes {
		dst := &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}
		if r.Dst != nil {
			mask := ipv4MaskOf(r.Dst.Mask)
			dst = &net.IPNet{IP: r.Dst.IP.To4().Mask(mask), Mask: mask}
		}
		if ones, _ := dst.Mask.Size(); ones == 0 {
			hasDefault = true
		}
		out = append(out, &dhcpv4.Route{Dest: dst, Router: ipv4OrZero(r.Gw)})
	}
	if !hasDefault && lease.Gateway != nil {
		out = append(out, &dhcpv4.Route{
			Dest:   &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)},
			Router: lease.Gateway.To4(),
		})
	}
	return out
}

// checkDHCPLease reports a lease the responder cannot hand out.
func checkDHCPLease(l *Lease) error {
	bad := func(what string, v any) error {
		return fmt.Errorf("dhcp lease for %s: %s %v: %w", l.MAC, what, v, errdefs.ErrInvalidArgument)
	}
	switch {
	case len(l.MAC) != 6:
		return bad("invalid mac", l.MAC)
	case l.IP.To4() == nil:
		return bad("ip is not ipv4", l.IP)
	case ipv4MaskOf(l.Mask) == nil:
		return bad("invalid ipv4 mask", l.Mask)
	case l.ServerID.To4() == nil:
		return bad("server id is not ipv4", l.ServerID)
	case l.Gateway != nil && l.Gateway.To4() == nil:
		return bad("gateway is not ipv4", l.Gateway)
	case l.MTU != 0 && (l.MTU < 68 || l.MTU > 65535):
		return bad("mtu out of range", l.MTU)
	case l.LeaseTime != 0 && (l.LeaseTime < time.Second || l.LeaseTime > time.Duration(1<<32-1)*time.Second):
		return bad("lease time out of range", l.LeaseTime)
	}
	for _, s := range l.DNS {
		if s.To4() == nil {
			return bad("dns server is not ipv4", s)
		}
	}
	for _, r := range l.Routes {
		if r.Dst != nil && (r.Dst.IP.To4() == nil || ipv4MaskOf(r.Dst.Mask) == nil) {
			return bad("route destination is not ipv4", r.Dst)
		}
		if r.Gw != nil && r.Gw.To4() == nil {
			return bad("route gateway is not ipv4", r.Gw)
		}
	}
	return nil
}

// ipv4MaskOf returns m as a 4-byte mask, or nil when it is not a valid IPv4
// mask.
func ipv4MaskOf(m net.IPMask) net.IPMask {
	switch len(m) {
	case net.IPv4len:
	case net.IPv6len:
		if ones, bits := m.Size(); bits != 128 || ones < 96 {
			return nil
		}
		m = m[12:]
	default:
		return nil
	}
	if _, bits := m.Size(); bits != 32 {
		return nil
	}
	return append(net.IPMask(nil), m...)
}

// ipv4OrZero returns ip in 4-byte form, or 0.0.0.0 when it is not IPv4.
func ipv4OrZero(ip net.IP) net.IP {
	if v4 := ip.To4(); v4 != nil {
		return v4
	}
	return net.IPv4zero.To4()
}
