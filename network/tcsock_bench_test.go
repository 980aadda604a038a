package network

import (
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// BenchmarkSockProgram is the socket classifier's own cost per frame
// (BPF_PROG_TEST_RUN, repeated in the kernel), in a netns holding
// sockEnv's sockets: a lookup that misses (the guest's traffic), one
// that finds a connection or a listener of the netns, and a frame that
// needs none. The IPv6 control classifier on the same frame, which
// every IPv6 frame of a pod already pays, is there to compare.
func BenchmarkSockProgram(b *testing.B) {
	e := newSockEnv(b)
	prog := loadTestSock(b, e.addrs4, e.addrs6)
	ctl6, err := loadCtl6(linkRules6(noSuchIfindex))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ctl6.Close() })
	const tcp = unix.IPPROTO_TCP
	seg4 := func(c tcpTuple, flags byte) []byte {
		return frame4(ipv4Pkt(c.src, c.dst, tcp, 0, 0, tcpHdr(uint16(c.sport), uint16(c.dport), flags)))
	}
	toGuest6 := frame6To(testPeer6, testPod6, tcp, tcpHdr(testSport, portFree, tcpFlagACK))
	for _, bc := range []struct {
		name  string
		prog  *ebpf.Program
		frame []byte
	}{
		{"ipv4 tcp to the guest", prog, seg4(tcpTuple{testPeer4, testPod4, testSport, portFree}, tcpFlagACK)},
		{"ipv4 tcp of a connection of the netns", prog, seg4(conn4, tcpFlagACK)},
		{"ipv4 syn to a listener of the netns", prog, seg4(tcpTuple{testPeer4, testPod4, testSport, portListenAny}, tcpFlagSYN)},
		{"ipv4 udp to the guest", prog, frame4(ipv4Pkt(testPeer4, testPod4, unix.IPPROTO_UDP, 0, 0, udp6(testSport, portFree, []byte("q"))))},
		{"ipv6 tcp to the guest", prog, toGuest6},
		{"ipv6 tcp to the guest, control classifier", ctl6, toGuest6},
		{"arp", prog, ethFrame(allOnesMAC, testPeerMAC, etherARP, arpPacket(1, testPeerMAC, testPeer4, make(net.HardwareAddr, 6), testPod4))},
	} {
		b.Run(bc.name, func(b *testing.B) {
			var per time.Duration
			err := runInNS(e.ns, func() error {
				_, d, err := bc.prog.Benchmark(bc.frame, b.N, nil)
				per = d
				return err
			})
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(per.Nanoseconds()), "ns/frame")
		})
	}
}

// BenchmarkIngress is the whole way of a UDP datagram from the pod
// network into a wired pod, the forwarder's sk_lookup program attached
// as in a pod: sent from the host side, then read from the tap (the
// guest) or from a socket of the netns, one datagram per iteration.
// "before" deletes the socket classifier's filter, which is how the CNI
// link's ingress was before it.
func BenchmarkIngress(b *testing.B) {
	for _, bc := range []struct {
		name       string
		classifier bool
		toNetns    bool
	}{
		{"before, to the guest", false, false},
		{"to the guest", true, false},
		{"to a socket of the netns", true, true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			e := newPodEnv(b)
			pl := e.addLink("eth0", 99, bridgeLike)
			n := e.setup(testCtx(b))
			if !bc.classifier {
				e.podCmd("tc", "filter", "del", "dev", "eth0", "ingress", "pref", strconv.Itoa(prioLinkSocket))
			}
			// No guest answers ARP: the host knows the pod's MAC.
			hl, err := e.hostH.LinkByName(pl.hostName)
			if err != nil {
				b.Fatal(err)
			}
			if err := e.hostH.NeighAdd(&netlink.Neigh{LinkIndex: hl.Attrs().Index, IP: pl.podIP, HardwareAddr: pl.mac, State: netlink.NUD_PERMANENT}); err != nil {
				b.Fatal(err)
			}
			const port = 7002
			var local *net.UDPConn
			if bc.toNetns {
				local = e.udpIn(e.pod, "udp4", &net.UDPAddr{Port: port}, nil)
			}
			out := e.udpIn(e.host, "udp4", nil, &net.UDPAddr{IP: pl.podIP, Port: port})
			tap := n.NICs()[0].Tap
			deadline := time.Now().Add(time.Minute)
			for _, d := range []interface{ SetReadDeadline(time.Time) error }{tap, out} {
				if err := d.SetReadDeadline(deadline); err != nil {
					b.Fatal(err)
				}
			}
			if local != nil {
				if err := local.SetReadDeadline(deadline); err != nil {
					b.Fatal(err)
				}
			}
			msg, buf := []byte("datagram"), make([]byte, 65536)
			b.ResetTimer()
			for range b.N {
				if _, err := out.Write(msg); err != nil {
					b.Fatal(err)
				}
				if local != nil {
					if _, err := local.Read(buf); err != nil {
						b.Fatal(err)
					}
					continue
				}
				for {
					n, err := tap.Read(buf)
					if err != nil {
						b.Fatal(err)
					}
					// Skip what the responders send the guest.
					if p, ok := parseFrame(buf[vnetHdrLen:n]); ok && p.dport == port {
						break
					}
				}
			}
		})
	}
}
