package network

import (
	"net"
	"testing"

	"github.com/cilium/ebpf"
)

// TestReplyProgram runs the TCX program on frames (BPF_PROG_TEST_RUN):
// only IPv4 to the relay's source address skips the clsact filters.
func TestReplyProgram(t *testing.T) {
	needRoot(t)
	src := mustIP("169.254.1.1")
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type: ebpf.SchedCLS, AttachType: ebpf.AttachTCXIngress,
		Instructions: replyProgram(src), License: "Dual MIT/GPL",
	})
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	defer prog.Close()
	guestMAC := net.HardwareAddr{0x02, 0, 0, 0, 0, 0x05}
	routerMAC := net.HardwareAddr{0x02, 0, 0, 0, 0, 0x01}
	podIP, gw := mustIP("10.99.0.5"), mustIP("10.99.0.1")
	payload := make([]byte, 32)
	for _, tc := range []struct {
		name  string
		frame []byte
		want  int32
	}{
		{"ipv4 to the source, sent to the router's mac", ethFrame(routerMAC, guestMAC, etherIP, udpPacket(podIP, src, 80, 40000, payload)), tcxPass},
		{"ipv4 to the source, broadcast", ethFrame(allOnesMAC, guestMAC, etherIP, udpPacket(podIP, src, 80, 40000, payload)), tcxPass},
		{"ipv4 to the router", ethFrame(routerMAC, guestMAC, etherIP, udpPacket(podIP, gw, 80, 40000, payload)), tcxNext},
		{"ipv4 to a neighbour of the source", ethFrame(routerMAC, guestMAC, etherIP, udpPacket(podIP, mustIP("169.254.1.2"), 80, 40000, payload)), tcxNext},
		{"ipv4 from the source", ethFrame(routerMAC, guestMAC, etherIP, udpPacket(src, gw, 80, 40000, payload)), tcxNext},
		{"arp for the source", ethFrame(allOnesMAC, guestMAC, etherARP, append(arpPacket(1, guestMAC, podIP, make(net.HardwareAddr, 6), src), payload...)), tcxNext},
		{"ipv6", ethFrame(routerMAC, guestMAC, 0x86dd, append([]byte{0x60}, make([]byte, 47)...)), tcxNext},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ret, err := prog.Run(&ebpf.RunOptions{Data: tc.frame})
			if err != nil {
				t.Fatalf("run: %v", err)
			}
			if got := int32(ret); got != tc.want {
				t.Errorf("verdict = %d, want %d", got, tc.want)
			}
		})
	}
}
