package network

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/mdlayher/ndp"
	"golang.org/x/sys/unix"
)

// labelled6 is a frame to send with the IPv6 flow label that names it.
type labelled6 struct {
	name   string
	label  uint32
	frame  []byte
	passes bool // whether it must cross to the other side
}

// withFlowLabel sets the flow label of an IPv6 frame.
func withFlowLabel(frame []byte, label uint32) []byte {
	v := binary.BigEndian.Uint32(frame[etherHeaderLen:]) &^ 0xfffff
	binary.BigEndian.PutUint32(frame[etherHeaderLen:], v|label&0xfffff)
	return frame
}

// flowLabels collects the flow labels of the IPv6 frames from src among
// frames.
func flowLabels(seen map[uint32]bool, src net.HardwareAddr, frames [][]byte) {
	for _, fr := range frames {
		if len(fr) < etherHeaderLen+ipv6HeaderLen || binary.BigEndian.Uint16(fr[12:14]) != unix.ETH_P_IPV6 ||
			net.HardwareAddr(fr[6:12]).String() != src.String() {
			continue
		}
		seen[binary.BigEndian.Uint32(fr[etherHeaderLen:])&0xfffff] = true
	}
}

// ctl6Frames are the test's frames from src (MAC mac, link-local ll),
// each to the all-nodes group: router advertisements and DHCPv6 replies
// behind extension headers, which must not cross, and ordinary UDP
// behind them, which must, marker last.
func ctl6Frames(t *testing.T, mac net.HardwareAddr, ll net.IP, marker uint32) []labelled6 {
	t.Helper()
	allNodes := net.ParseIP("ff02::1")
	src, _ := netip.AddrFromSlice(ll.To16())
	ra := &ndp.RouterAdvertisement{CurrentHopLimit: 64, RouterLifetime: 30 * time.Minute, Options: []ndp.Option{
		&ndp.PrefixInformation{PrefixLength: 64, OnLink: true, AutonomousAddressConfiguration: true,
			ValidLifetime: time.Hour, PreferredLifetime: time.Hour, Prefix: netip.MustParseAddr("fd00:bad::")},
		&ndp.LinkLayerAddress{Direction: ndp.Source, Addr: mac},
	}}
	raMsg, err := ndp.MarshalMessageChecksum(ra, src, netip.MustParseAddr("ff02::1"))
	if err != nil {
		t.Fatal(err)
	}
	const icmp, udp = unix.IPPROTO_ICMPV6, unix.IPPROTO_UDP
	frame := func(first byte, rest []byte) []byte {
		return ipv6Frame(multicastMAC(allNodes), mac, ll, allNodes, first, 255, rest)
	}
	nineFirst, nine := longChain(raMsg, icmp, 9)
	return []labelled6{
		{"ra behind destination options", 0x101, frame(ip6DestOpts, chain(raMsg, optsHdr(icmp, 0))), false},
		{"ra behind hop-by-hop and destination options", 0x102, frame(ip6HopByHop, chain(raMsg, optsHdr(icmp, 0), optsHdr(ip6DestOpts, 0))), false},
		{"ra in a first fragment", 0x103, frame(ip6Fragment, chain(raMsg, fragHdr(icmp, 0, true))), false},
		{"ra behind nine headers", 0x104, frame(nineFirst, nine), false},
		{"dhcpv6 reply behind destination options", 0x105, frame(ip6DestOpts, chain(udp6(547, 546, []byte{7, 0, 0, 1}), optsHdr(udp, 0))), false},
		{"non-first fragment of ordinary udp", 0x106, frame(ip6Fragment, chain(make([]byte, 32), fragHdr(udp, 4, false))), true},
		{"ordinary udp behind destination options", marker, frame(ip6DestOpts, chain(udp6(5000, 7000, []byte("marker")), optsHdr(udp, 0))), true},
	}
}

// checkCrossed says which of sent were seen, once the marker has been
// seen: read returns the frames of some time from src.
func checkCrossed(t *testing.T, sent []labelled6, src net.HardwareAddr, marker uint32, read func() [][]byte) {
	t.Helper()
	seen := map[uint32]bool{}
	for i := 0; i < 10 && !seen[marker]; i++ {
		flowLabels(seen, src, read())
	}
	if !seen[marker] {
		t.Fatalf("ordinary udp behind destination options did not cross")
	}
	// Anything sent before the marker has had as long to arrive.
	flowLabels(seen, src, read())
	for _, s := range sent {
		if seen[s.label] != s.passes {
			t.Errorf("%s: crossed = %v, want %v", s.name, seen[s.label], s.passes)
		}
	}
}

// tapFrames reads what the guest side of the tap gets for d.
func tapFrames(t *testing.T, tap *os.File, d time.Duration) [][]byte {
	t.Helper()
	if err := tap.SetReadDeadline(time.Now().Add(d)); err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	buf := make([]byte, 65536)
	for {
		n, err := tap.Read(buf)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return out
		}
		if err != nil {
			t.Fatalf("read tap: %v", err)
		}
		if n >= vnetHdrLen {
			out = append(out, append([]byte(nil), buf[vnetHdrLen:n]...))
		}
	}
}

// TestSetupIPv6ExtensionHeaders repeats the attack of a router
// advertisement or DHCPv6 reply behind IPv6 extension headers, which u32
// filters at fixed offsets take for ordinary traffic: sent from the pod
// network it does not reach the tap, and sent by the guest it does not
// leave the CNI interface; ordinary UDP behind the same headers, and a
// fragment other than the first, still cross both ways.
func TestSetupIPv6ExtensionHeaders(t *testing.T) {
	ctx := testCtx(t)
	e := newPodEnv(t)
	pl := e.addLink("eth0", 99, bridgeLike)
	e.addIPv6Gateway(pl, 99)
	e.settle()
	n := e.setup(ctx)
	nic := n.NICs()[0]
	if nic.Lease6 == nil {
		t.Fatal("no ipv6 lease")
	}

	t.Run("from the pod network", func(t *testing.T) {
		const marker = 0x1ff
		sent := ctl6Frames(t, pl.hostMAC, eui64LinkLocal(pl.hostMAC), marker)
		hl, err := e.hostH.LinkByName(pl.hostName)
		if err != nil {
			t.Fatal(err)
		}
		err = runInNS(e.host, func() error {
			fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				return err
			}
			defer unix.Close(fd)
			for _, s := range sent {
				to := &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_IPV6), Ifindex: hl.Attrs().Index}
				if err := unix.Sendto(fd, withFlowLabel(s.frame, s.label), 0, to); err != nil {
					return fmt.Errorf("send %s: %w", s.name, err)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		checkCrossed(t, sent, pl.hostMAC, marker, func() [][]byte { return tapFrames(t, nic.Tap, 300*time.Millisecond) })
	})

	t.Run("from the guest", func(t *testing.T) {
		const marker = 0x2ff
		sniff := e.sniff(pl.hostName)
		g := &guest{t: t, tap: nic.Tap, mac: nic.MAC}
		sent := ctl6Frames(t, nic.MAC, eui64LinkLocal(nic.MAC), marker)
		for _, s := range sent {
			g.send(withFlowLabel(s.frame, s.label))
		}
		checkCrossed(t, sent, nic.MAC, marker, func() [][]byte { return sniff.frames(300 * time.Millisecond) })
	})
	checkFilterHits6(t, e)
}

// checkFilterHits6 checks that both sides have the classifier, in
// direct-action mode.
func checkFilterHits6(t *testing.T, e *podEnv) {
	t.Helper()
	for _, dev := range []string{"eth0", "vmtap0"} {
		out := e.podCmd("tc", "filter", "show", "dev", dev, "ingress")
		if !strings.Contains(out, "vmshim_ctl6") || !strings.Contains(out, "direct-action") {
			t.Errorf("no ipv6 control classifier on %s:\n%s", dev, out)
		}
	}
}
