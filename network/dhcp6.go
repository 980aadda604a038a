package network

import (
	"bytes"
	"fmt"
	"net"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/insomniacslk/dhcp/dhcpv6"
	"github.com/insomniacslk/dhcp/iana"
	"github.com/insomniacslk/dhcp/rfc1035label"
)

// Bounds on what a reply repeats of a request. A client has no reason to
// exceed them, and they keep every reply well within the IPv6 minimum MTU
// whatever the client sends: the lease's own options aside, a reply is at
// most a few hundred bytes.
const (
	// maxDUIDLen is the longest DUID, type code included (RFC 8415 §11.1);
	// a message with a longer Client Identifier is ignored.
	maxDUIDLen = 2 + 128
	// maxIAs6 is the number of IA options a reply answers: the first
	// IA_NA, which holds the lease's address, and the first few others.
	maxIAs6 = 4
	// maxDropped6 is the number of foreign addresses of one IA_NA a reply
	// hands back with lifetimes 0.
	maxDropped6 = 4
)

// dhcp6PreferenceMax is the Preference of every Advertise: the client
// requests at once instead of waiting a second for other servers'
// (RFC 8415 §18.2.1). The responder is the only server on the tap.
const dhcp6PreferenceMax = 255

// Handle6 returns the reply to a DHCPv6 message from the VM, or nil when
// it must be ignored. It is the stateful server of RFC 8415 for one
// client, which only ever gets the lease's address; it is pure: no I/O.
//
// The caller answers only frames from lease.MAC: a DUID need not carry
// the client's MAC. Message validation follows RFC 8415 §16: messages
// without a Client Identifier (but Information-request), Solicit, Confirm
// and Rebind with any Server Identifier, Request, Renew, Release and
// Decline without ours, Information-request with another server's or with
// an IA, and anything that is not a client message are ignored.
//
// Solicit gets an Advertise, or a Reply when it carries Rapid Commit;
// Request, Renew and Rebind get a Reply. The first IA_NA gets the lease's
// address; in a Reply, the other addresses the client listed in it come
// back with lifetimes 0, so that the client drops them (§18.3.4, §18.3.5;
// a Request gets the same, where §18.3.2 would answer an off-link hint
// with NotOnLink and cost a second exchange). Other IA_NAs and IA_TAs get
// NoAddrsAvail, IA_PDs NoPrefixAvail, each inside the IA, as §18.3.2 and
// §18.3.9 want of IAs a server will not serve. A Solicit
// without IA_NA gets an Advertise with a NoAddrsAvail status alone
// (§18.3.9), a Request without IA_NA a Reply with that status. Confirm
// gets Success when every address in its IA_NAs and IA_TAs is the lease's
// and NotOnLink otherwise, and is ignored without addresses (§18.3.3).
// Release and Decline get Success; the caller logs them (dhcp6Addrs
// names the addresses). Every reply carries the transaction ID, serverID,
// the client's Client Identifier and, but for that NoAddrsAvail
// Advertise, the lease's name servers and search list.
func Handle6(req *dhcpv6.Message, lease *Lease6, serverID dhcpv6.DUID) (*dhcpv6.Message, error) {
	if req == nil || lease == nil || isNilDUID(serverID) {
		return nil, fmt.Errorf("dhcpv6 handle: nil message, lease or server id: %w", errdefs.ErrInvalidArgument)
	}
	if err := checkLease6(lease); err != nil {
		return nil, err
	}
	var clientID dhcpv6.DUID
	if o := req.Options.GetOne(dhcpv6.OptionClientID); o != nil {
		b := o.ToBytes()
		if len(b) > maxDUIDLen {
			return nil, nil
		}
		d, err := dhcpv6.DUIDFromBytes(b)
		if err != nil {
			return nil, nil
		}
		clientID = d
	}
	sid := req.Options.GetOne(dhcpv6.OptionServerID)
	ours := sid != nil && bytes.Equal(sid.ToBytes(), serverID.ToBytes())

	mt := req.MessageType
	switch mt {
	case dhcpv6.MessageTypeSolicit, dhcpv6.MessageTypeConfirm, dhcpv6.MessageTypeRebind:
		if clientID == nil || sid != nil {
			return nil, nil
		}
	case dhcpv6.MessageTypeRequest, dhcpv6.MessageTypeRenew, dhcpv6.MessageTypeRelease, dhcpv6.MessageTypeDecline:
		if clientID == nil || !ours {
			return nil, nil
		}
	case dhcpv6.MessageTypeInformationRequest:
		if (sid != nil && !ours) || hasIA6(req) {
			return nil, nil
		}
	default:
		// Server and relay messages, and types this server does not know.
		return nil, nil
	}

	reply := &dhcpv6.Message{MessageType: dhcpv6.MessageTypeReply, TransactionID: req.TransactionID}
	reply.AddOption(dhcpv6.OptServerID(serverID))
	if clientID != nil {
		reply.AddOption(dhcpv6.OptClientID(clientID))
	}
	switch mt {
	case dhcpv6.MessageTypeSolicit:
		rapid := req.Options.GetOne(dhcpv6.OptionRapidCommit) != nil
		ias, served := answerIAs(req, lease, rapid)
		if !served {
			reply.MessageType = dhcpv6.MessageTypeAdvertise
			reply.AddOption(status6(iana.StatusNoAddrsAvail, "no address without an IA_NA"))
			return reply, nil
		}
		if rapid {
			reply.AddOption(&dhcpv6.OptionGeneric{OptionCode: dhcpv6.OptionRapidCommit})
		} else {
			reply.MessageType = dhcpv6.MessageTypeAdvertise
			reply.AddOption(dhcpv6.OptPreference(dhcp6PreferenceMax))
		}
		addOptions6(reply, ias)
	case dhcpv6.MessageTypeRequest, dhcpv6.MessageTypeRenew, dhcpv6.MessageTypeRebind:
		ias, served := answerIAs(req, lease, true)
		if !served && mt == dhcpv6.MessageTypeRequest {
			reply.AddOption(status6(iana.StatusNoAddrsAvail, "no address without an IA_NA"))
		}
		addOptions6(reply, ias)
	case dhcpv6.MessageTypeConfirm:
		addrs := dhcp6Addrs(req)
		if len(addrs) == 0 {
			return nil, nil
		}
		if slices.ContainsFunc(addrs, func(ip net.IP) bool { return !ip.Equal(lease.IP) }) {
			reply.AddOption(status6(iana.StatusNotOnLink, "not this link's address"))
		} else {
			reply.AddOption(status6(iana.StatusSuccess, ""))
		}
	case dhcpv6.MessageTypeRelease, dhcpv6.MessageTypeDecline:
		reply.AddOption(status6(iana.StatusSuccess, ""))
	}
	addConfig6(reply, lease)
	return reply, nil
}

// answerIAs returns the IA options of the reply to req, in the request's
// order, and whether an IA_NA got the lease's address. With commit (a
// Reply rather than an Advertise), the other addresses the client listed
// in that IA_NA come back with lifetimes 0 (RFC 8415 §18.3.2, §18.3.4,
// §18.3.5).
func answerIAs(req *dhcpv6.Message, lease *Lease6, commit bool) (ias []dhcpv6.Option, served bool) {
	others := 0
	for _, o := range req.Options.Options {
		var ia dhcpv6.Option
		switch in := o.(type) {
		case *dhcpv6.OptIANA:
			if !served {
				served = true
				ias = append(ias, leaseIA(in, lease, commit))
				continue
			}
			ia = &dhcpv6.OptIANA{IaId: in.IaId, Options: dhcpv6.IdentityOptions{Options: dhcpv6.Options{
				status6(iana.StatusNoAddrsAvail, "one address per client")}}}
		case *dhcpv6.OptIATA:
			ia = &dhcpv6.OptIATA{IaId: in.IaId, Options: dhcpv6.IdentityOptions{Options: dhcpv6.Options{
				status6(iana.StatusNoAddrsAvail, "no temporary addresses")}}}
		case *dhcpv6.OptIAPD:
			ia = &dhcpv6.OptIAPD{IaId: in.IaId, Options: dhcpv6.PDOptions{Options: dhcpv6.Options{
				status6(iana.StatusNoPrefixAvail, "no prefix delegation")}}}
		default:
			continue
		}
		if others < maxIAs6-1 {
			others++
			ias = append(ias, ia)
		}
	}
	return ias, served
}

// leaseIA is the answer to the IA_NA in: the lease's address, valid and
// preferred for the lease's lifetime, with T1 and T2 at 0.5 and 0.8 of it
// (RFC 8415 §21.4), and with commit the client's other addresses with
// lifetimes 0.
func leaseIA(in *dhcpv6.OptIANA, lease *Lease6, commit bool) *dhcpv6.OptIANA {
	life := lifetime6(lease)
	secs := int64(life / time.Second)
	ia := &dhcpv6.OptIANA{
		IaId: in.IaId,
		T1:   time.Duration(secs/2) * time.Second,
		T2:   time.Duration(secs*4/5) * time.Second,
	}
	ia.Options.Add(&dhcpv6.OptIAAddress{
		IPv6Addr:          append(net.IP(nil), lease.IP.To16()...),
		PreferredLifetime: life,
		ValidLifetime:     life,
	})
	if !commit {
		return ia
	}
	var dropped []net.IP
	for _, o := range in.Options.Options {
		a, ok := o.(*dhcpv6.OptIAAddress)
		if !ok || len(dropped) == maxDropped6 {
			continue
		}
		ip := a.IPv6Addr.To16()
		if ip == nil || ip.Equal(lease.IP) || slices.ContainsFunc(dropped, ip.Equal) {
			continue
		}
		dropped = append(dropped, ip)
		ia.Options.Add(&dhcpv6.OptIAAddress{IPv6Addr: append(net.IP(nil), ip...)})
	}
	return ia
}

// addOptions6 adds opts to m.
func addOptions6(m *dhcpv6.Message, opts []dhcpv6.Option) {
	for _, o := range opts {
		m.AddOption(o)
	}
}

// addConfig6 adds the lease's name servers (option 23) and search list
// (option 24, RFC 3646).
func addConfig6(m *dhcpv6.Message, lease *Lease6) {
	if len(lease.DNS) > 0 {
		dns := make([]net.IP, 0, len(lease.DNS))
		for _, s := range lease.DNS {
			dns = append(dns, append(net.IP(nil), s.To16()...))
		}
		m.AddOption(dhcpv6.OptDNS(dns...))
	}
	if search := searchList6(lease); len(search) > 0 {
		m.AddOption(dhcpv6.OptDomainSearchList(&rfc1035label.Labels{Labels: search}))
	}
}

// status6 is a Status Code option.
func status6(code iana.StatusCode, msg string) *dhcpv6.OptStatusCode {
	return &dhcpv6.OptStatusCode{StatusCode: code, StatusMessage: msg}
}

// hasIA6 reports whether m carries an IA_NA, IA_TA or IA_PD.
func hasIA6(m *dhcpv6.Message) bool {
	return slices.ContainsFunc(m.Options.Options, func(o dhcpv6.Option) bool {
		c := o.Code()
		return c == dhcpv6.OptionIANA || c == dhcpv6.OptionIATA || c == dhcpv6.OptionIAPD
	})
}

// dhcp6Addrs returns the addresses in the IA_NAs and IA_TAs of m: the
// ones a Confirm asks about, a Release gives up, or a Decline reports in
// use by another node on the link.
func dhcp6Addrs(m *dhcpv6.Message) []net.IP {
	var out []net.IP
	for _, so := range iaOptions(m, false) {
		if a, ok := so.(*dhcpv6.OptIAAddress); ok {
			out = append(out, a.IPv6Addr)
		}
	}
	return out
}

// iaOptions returns the options inside m's IA_NAs and IA_TAs, and its
// IA_PDs too when pd is set.
func iaOptions(m *dhcpv6.Message, pd bool) []dhcpv6.Option {
	var out []dhcpv6.Option
	for _, o := range m.Options.Options {
		switch ia := o.(type) {
		case *dhcpv6.OptIANA:
			out = append(out, ia.Options.Options...)
		case *dhcpv6.OptIATA:
			out = append(out, ia.Options.Options...)
		case *dhcpv6.OptIAPD:
			if pd {
				out = append(out, ia.Options.Options...)
			}
		}
	}
	return out
}

// dhcp6Name names a message type in logs: "solicit", "information-request".
func dhcp6Name(mt dhcpv6.MessageType) string {
	return strings.ToLower(mt.String())
}

// lifetime6 is the lifetime of the lease's address, in whole seconds.
func lifetime6(lease *Lease6) time.Duration {
	d := lease.LeaseTime
	if d == 0 {
		d = DefaultLeaseTime
	}
	return d.Truncate(time.Second)
}

// searchList6 is the lease's search list as DNS names on the wire: a
// fully qualified name loses its final dot, which would encode an empty
// name of its own.
func searchList6(lease *Lease6) []string {
	return searchDomains(lease.Search)
}

// isNilDUID reports whether d is nil or a nil pointer.
func isNilDUID(d dhcpv6.DUID) bool {
	if d == nil {
		return true
	}
	v := reflect.ValueOf(d)
	return v.Kind() == reflect.Pointer && v.IsNil()
}

// checkLease6 reports a lease the IPv6 responder cannot hand out.
func checkLease6(l *Lease6) error {
	bad := func(what string, v any) error {
		return fmt.Errorf("dhcpv6 lease for %s: %s %v: %w", l.MAC, what, v, errdefs.ErrInvalidArgument)
	}
	switch {
	case len(l.MAC) != 6:
		return bad("invalid mac", l.MAC)
	case !isIPv6(l.IP) || !l.IP.IsGlobalUnicast():
		return bad("ip is not a global unicast ipv6 address", l.IP)
	case l.MTU != 0 && (l.MTU < 1280 || l.MTU > 65535):
		return bad("mtu out of range", l.MTU)
	case l.LeaseTime != 0 && (l.LeaseTime < time.Second || l.LeaseTime > time.Duration(1<<32-2)*time.Second):
		// 0xffffffff seconds would be an infinite lifetime.
		return bad("lease time out of range", l.LeaseTime)
	}
	for _, p := range l.OnLink {
		if p == nil {
			return bad("on-link prefix is nil", p)
		}
		if _, bits := p.Mask.Size(); !isIPv6(p.IP) || bits != 8*net.IPv6len || p.IP.IsLinkLocalUnicast() || p.IP.IsMulticast() {
			return bad("on-link prefix is not an ipv6 unicast prefix", p)
		}
	}
	for _, s := range l.DNS {
		if !isIPv6(s) || s.IsUnspecified() || s.IsMulticast() {
			return bad("dns server is not an ipv6 unicast address", s)
		}
	}
	for _, n := range l.Search {
		if len(searchDomains([]string{n})) != 1 {
			return bad("search domain is not a dns name", fmt.Sprintf("%q", n))
		}
	}
	return nil
}

// isIPv6 reports whether ip is an IPv6 address, not an IPv4 one in either
// form.
func isIPv6(ip net.IP) bool {
	return len(ip) == net.IPv6len && ip.To4() == nil
}
