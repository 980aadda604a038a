package network

import (
	"testing"

	"golang.org/x/sys/unix"
)

// FuzzSockProgram runs the socket classifier on arbitrary IPv4 and IPv6
// packets, in a netns holding sockEnv's sockets, and holds its verdicts
// to sockEnv.model's: however a packet is built or cut, only what a
// socket of the netns owns goes up its stack.
func FuzzSockProgram(f *testing.F) {
	const tcp, udp = unix.IPPROTO_TCP, unix.IPPROTO_UDP
	p6 := func(first byte, rest []byte) []byte {
		return frame6To(testPeer6, testPod6, first, rest)[etherHeaderLen:]
	}
	for _, seed := range [][]byte{
		ipv4Pkt(testPeer4, testPod4, tcp, 0, 0, tcpHdr(testSport, portListen4, tcpFlagSYN)),
		ipv4Pkt(testPeer4, testPod4, tcp, 2, 0, tcpHdr(testSport, portListenAny, tcpFlagSYN)),
		ipv4Pkt(conn4.src, conn4.dst, tcp, 0, 0, tcpHdr(portConn4, portListen4, tcpFlagACK)),
		ipv4Pkt(out4.src, out4.dst, tcp, 0, 0, tcpHdr(portPeer, portOut, tcpFlagSYN|tcpFlagACK)),
		ipv4Pkt(testPeer4, testPod4, udp, 0, 0, udp6(testSport, portUDP4, []byte("q"))),
		ipv4Pkt(testPeer4, testPod4, udp, 0, 0x2000, udp6(testSport, portUDPAny, []byte("q"))),
		p6(tcp, tcpHdr(testSport, portListen6, tcpFlagSYN)),
		p6(ip6DestOpts, chain(tcpHdr(testSport, portListenAny, tcpFlagSYN), optsHdr(tcp, 0))),
		p6(ip6AH, chain(udp6(testSport, portUDPAny, nil), ahHdr(udp))),
		p6(ip6Fragment, chain(udp6(testSport, portUDPAny, nil), fragHdr(udp, 0, true))),
		p6(longChain(tcpHdr(testSport, portListen6, tcpFlagSYN), tcp, 8)),
		p6(tcp, tcpHdr(portConn6, portListen6, tcpFlagACK)),
		p6(udp, udp6(testSport, portUDPLL, nil)),
	} {
		f.Add(seed)
	}
	e := newSockEnv(f)
	prog := loadTestSock(f, e.addrs4, e.addrs6)
	f.Fuzz(func(t *testing.T, pkt []byte) {
		typ, min := uint16(etherIP), ipv4HeaderLen
		if len(pkt) > 0 && pkt[0]>>4 == 6 {
			typ, min = unix.ETH_P_IPV6, ipv6HeaderLen
		}
		if len(pkt) < min || len(pkt) > 1500 {
			return // BPF_PROG_TEST_RUN refuses frames without a whole fixed header
		}
		frame := ethFrame(testPodMAC, testPeerMAC, typ, pkt)
		if got, want := e.run(t, prog, frame), e.model(frame); got != want {
			t.Errorf("verdict %d, model %d, on %x", got, want, frame)
		}
	})
}
