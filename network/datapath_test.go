package network

import (
	"net"
	"regexp"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
)

// exerciseDataPath plays the guest on the tap fd, without QEMU.
func exerciseDataPath(t *testing.T, e *podEnv, nic NIC, pl podLink) {
	t.Helper()
	g := &guest{t: t, tap: nic.Tap, mac: nic.MAC, ip: pl.podIP}
	tapLink, err := e.podH.LinkByName("vmtap0")
	if err != nil {
		t.Fatal(err)
	}
	tapMAC := tapLink.Attrs().HardwareAddr
	linkLocal := mustIP("169.254.1.1")
	sniff := e.sniff(pl.hostName)

	// ARP for the gateway: the request reaches the host, the reply the guest.
	g.send(ethFrame(allOnesMAC, g.mac, etherARP, arpPacket(1, g.mac, g.ip, make(net.HardwareAddr, 6), pl.gw)))
	reply := g.expect("arp reply from the gateway", func(p parsed) bool {
		return p.typ == etherARP && p.arpOp == 2 && p.spa.Equal(pl.gw)
	})
	if reply.sha.String() != pl.hostMAC.String() {
		t.Errorf("gateway arp reply from %s, want host mac %s", reply.sha, pl.hostMAC)
	}

	// Guest to host: UDP arrives in the host netns.
	hostConn := e.udpIn(e.host, "udp4", &net.UDPAddr{IP: pl.gw, Port: 7001}, nil)
	g.send(ethFrame(pl.hostMAC, g.mac, etherIP, udpPacket(g.ip, pl.gw, 5000, 7001, []byte("hello host"))))
	readUDP(t, hostConn, "hello host", pl.podIP)

	// DHCP: answered from inside the netns, never seen on the host side.
	disc, err := dhcpv4.NewDiscovery(g.mac)
	if err != nil {
		t.Fatal(err)
	}
	g.send(ethFrame(allOnesMAC, g.mac, etherIP, udpPacket(net.IPv4zero, net.IPv4bcast, 68, 67, disc.ToBytes())))
	offer := g.expect("dhcp offer", func(p parsed) bool { return p.typ == etherIP && p.sport == 67 && p.dport == 68 })
	msg, err := dhcpv4.FromBytes(offer.payload)
	if err != nil {
		t.Fatalf("parse offer: %v", err)
	}
	if msg.MessageType() != dhcpv4.MessageTypeOffer || !msg.YourIPAddr.Equal(pl.podIP) {
		t.Errorf("offer: %s", msg.Summary())
	}

	// ARP for the link-local address: answered by the netns, kept off the host.
	g.send(ethFrame(allOnesMAC, g.mac, etherARP, arpPacket(1, g.mac, g.ip, make(net.HardwareAddr, 6), linkLocal)))
	ll := g.expect("arp reply for the link-local address", func(p parsed) bool {
		return p.typ == etherARP && p.arpOp == 2 && p.spa.Equal(linkLocal)
	})
	if ll.sha.String() != tapMAC.String() {
		t.Errorf("link-local arp reply from %s, want tap mac %s", ll.sha, tapMAC)
	}

	// Host to pod IP: readable from the tap fd.
	hostOut := e.udpIn(e.host, "udp4", nil, &net.UDPAddr{IP: pl.podIP, Port: 7002})
	if _, err := hostOut.Write([]byte("hello vm")); err != nil {
		t.Fatal(err)
	}
	g.expect("udp from the host", func(p parsed) bool {
		return p.dport == 7002 && p.ipDst.Equal(pl.podIP) && string(p.payload) == "hello vm"
	})

	// The netns's own stack to the pod IP: out the tap, from the link-local
	// address; and the guest's answer comes back to it.
	podConn := e.udpIn(e.pod, "udp4", nil, &net.UDPAddr{IP: pl.podIP, Port: 7003})
	if _, err := podConn.Write([]byte("hello from netns")); err != nil {
		t.Fatal(err)
	}
	in := g.expect("udp from the netns", func(p parsed) bool {
		return p.dport == 7003 && string(p.payload) == "hello from netns"
	})
	if !in.ipSrc.Equal(linkLocal) || in.dst.String() != g.mac.String() {
		t.Errorf("netns udp from %s to mac %s, want from %s to %s", in.ipSrc, in.dst, linkLocal, g.mac)
	}
	g.send(ethFrame(tapMAC, g.mac, etherIP, udpPacket(g.ip, linkLocal, 7003, in.sport, []byte("hello netns"))))
	readUDP(t, podConn, "hello netns", pl.podIP)

	sawGuestARP := false
	for _, f := range sniff.frames(300 * time.Millisecond) {
		p, _ := parseFrame(f)
		if p.typ == etherARP && p.arpOp == 1 && p.tpa.Equal(pl.gw) && p.src.String() == g.mac.String() {
			sawGuestARP = true
		}
		if p.typ == etherIP && (p.dport == 67 || p.sport == 67) {
			t.Errorf("dhcp frame left the pod netns: %x", f)
		}
		if p.typ == etherARP && (p.tpa.Equal(linkLocal) || p.spa.Equal(linkLocal)) {
			t.Errorf("arp for the link-local address left the pod netns: %x", f)
		}
	}
	if !sawGuestARP {
		t.Error("the host side never saw the guest's arp request for the gateway")
	}
}

func readUDP(t *testing.T, c *net.UDPConn, want string, from net.IP) {
	t.Helper()
	if err := c.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1500)
	n, addr, err := c.ReadFromUDP(buf)
	if err != nil {
		t.Fatalf("want %q: %v", want, err)
	}
	if string(buf[:n]) != want || !addr.IP.Equal(from) {
		t.Errorf("got %q from %s, want %q from %s", buf[:n], addr, want, from)
	}
}

var sentRe = regexp.MustCompile(`mirred \(Egress (Redirect|Mirror) to device (\S+)\)[^\n]*\n(?:[^\n]*\n)*?\s*Sent (\d+) bytes`)

// checkFilterHits makes sure tc's own counters saw the traffic.
func checkFilterHits(t *testing.T, e *podEnv) {
	t.Helper()
	for dev, want := range map[string]string{"eth0": "vmtap0", "vmtap0": "eth0"} {
		out := e.podCmd("tc", "-s", "filter", "show", "dev", dev, "ingress")
		t.Logf("tc -s filter show dev %s ingress:\n%s", dev, out)
		hit := false
		for _, m := range sentRe.FindAllStringSubmatch(out, -1) {
			if m[1] == "Redirect" && m[2] == want && m[3] != "0" {
				hit = true
			}
		}
		if !hit {
			t.Errorf("no packets counted by the redirect %s -> %s:\n%s", dev, want, out)
		}
	}
}
