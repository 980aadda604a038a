package network

import (
	"net"
	"os"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// FuzzCtl6Program runs both sides' classifiers on arbitrary IPv6
// packets and holds their verdicts to ctl6Model's: no packet, however
// its chain is built or cut, is classified otherwise than the walk
// means.
func FuzzCtl6Program(f *testing.F) {
	const icmp, udp = unix.IPPROTO_ICMPV6, unix.IPPROTO_UDP
	ra := icmp6Msg(icmp6RouterAdvert, make([]byte, 12)...)
	ip6 := func(first byte, rest []byte) []byte { return pkt6(first, rest)[etherHeaderLen:] }
	for _, seed := range [][]byte{
		ip6(icmp, ra),
		ip6(ip6DestOpts, chain(ra, optsHdr(icmp, 0))),
		ip6(ip6HopByHop, chain(ra, optsHdr(icmp, 0), optsHdr(ip6DestOpts, 1))),
		ip6(ip6Routing, chain(ra, routingHdr(icmp))),
		ip6(ip6AH, chain(ra, ahHdr(icmp))),
		ip6(ip6Fragment, chain(ra, fragHdr(icmp, 0, true))),
		ip6(ip6Fragment, chain(ra, fragHdr(icmp, 3, true))),
		ip6(longChain(ra, icmp, 9)),
		ip6(ip6DestOpts, chain(udp6(547, 546, []byte{7, 0, 0, 1}), optsHdr(udp, 0))),
		ip6(ip6DestOpts, chain(nsMsg(icmp6NeighborSolicit, testTapLL), optsHdr(icmp, 0))),
		ip6(ip6DestOpts, chain(nsMsg(icmp6NeighborAdvert, testTapLL), optsHdr(icmp, 0))),
		ip6(unix.IPPROTO_TCP, tcpSeg(80)),
	} {
		f.Add(seed)
	}
	if os.Geteuid() != 0 {
		f.Skip("needs root: loads BPF programs")
	}
	tapR, linkR := tapRules6(testTapLL), linkRules6(noSuchIfindex)
	progs := map[*ctl6Rules]*ebpf.Program{}
	for _, r := range []*ctl6Rules{&tapR, &linkR} {
		prog, err := loadCtl6(*r)
		if err != nil {
			f.Fatal(err)
		}
		f.Cleanup(func() { prog.Close() })
		progs[r] = prog
	}
	eth := ethFrame(multicastMAC(net.ParseIP("ff02::1")), testGuestMAC, unix.ETH_P_IPV6, nil)
	f.Fuzz(func(t *testing.T, pkt []byte) {
		if len(pkt) < ipv6HeaderLen || len(pkt) > 1500 {
			return // BPF_PROG_TEST_RUN refuses IPv6 frames without a whole fixed header
		}
		frame := append(append([]byte(nil), eth...), pkt...)
		for r, prog := range progs {
			ret, err := prog.Run(&ebpf.RunOptions{Data: frame})
			if err != nil {
				t.Fatalf("run on %x: %v", frame, err)
			}
			if got, want := int32(ret), ctl6Model(frame, *r); got != want {
				t.Errorf("rules %+v: verdict %d, model %d, on %x", *r, got, want, frame)
			}
		}
	})
}
