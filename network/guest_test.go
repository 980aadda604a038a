package network

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"os"
	"testing"
	"time"
)

var allOnesMAC = net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

const (
	etherARP = 0x0806
	etherIP  = 0x0800
)

func ethFrame(dst, src net.HardwareAddr, typ uint16, payload []byte) []byte {
	b := make([]byte, 14, 14+len(payload))
	copy(b[0:6], dst)
	copy(b[6:12], src)
	binary.BigEndian.PutUint16(b[12:14], typ)
	return append(b, payload...)
}

func arpPacket(op uint16, sha net.HardwareAddr, spa net.IP, tha net.HardwareAddr, tpa net.IP) []byte {
	b := make([]byte, 28)
	binary.BigEndian.PutUint16(b[0:2], 1)       // Ethernet
	binary.BigEndian.PutUint16(b[2:4], etherIP) // IPv4
	b[4], b[5] = 6, 4
	binary.BigEndian.PutUint16(b[6:8], op)
	copy(b[8:14], sha)
	copy(b[14:18], spa.To4())
	copy(b[18:24], tha)
	copy(b[24:28], tpa.To4())
	return b
}

func ipChecksum(b []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return ^uint16(sum)
}

// udpPacket is an IPv4 datagram without UDP checksum (allowed over IPv4).
func udpPacket(src, dst net.IP, sport, dport uint16, payload []byte) []byte {
	b := make([]byte, 28, 28+len(payload))
	b[0] = 0x45
	binary.BigEndian.PutUint16(b[2:4], uint16(28+len(payload)))
	b[8], b[9] = 64, 17
	copy(b[12:16], src.To4())
	copy(b[16:20], dst.To4())
	binary.BigEndian.PutUint16(b[10:12], ipChecksum(b[:20]))
	binary.BigEndian.PutUint16(b[20:22], sport)
	binary.BigEndian.PutUint16(b[22:24], dport)
	binary.BigEndian.PutUint16(b[24:26], uint16(8+len(payload)))
	return append(b, payload...)
}

// parsed is the little of a frame the tests look at.
type parsed struct {
	dst, src     net.HardwareAddr
	typ          uint16
	arpOp        uint16
	sha          net.HardwareAddr
	spa, tpa     net.IP
	ipSrc, ipDst net.IP
	proto        byte
	sport, dport uint16
	payload      []byte
}

func parseFrame(b []byte) (parsed, bool) {
	var p parsed
	if len(b) < 14 {
		return p, false
	}
	p.dst, p.src, p.typ = b[0:6], b[6:12], binary.BigEndian.Uint16(b[12:14])
	l3 := b[14:]
	switch p.typ {
	case etherARP:
		if len(l3) < 28 {
			return p, false
		}
		p.arpOp, p.sha = binary.BigEndian.Uint16(l3[6:8]), l3[8:14]
		p.spa, p.tpa = net.IP(l3[14:18]), net.IP(l3[24:28])
	case etherIP:
		if len(l3) < 20 {
			return p, false
		}
		ihl := int(l3[0]&0x0f) * 4
		p.proto, p.ipSrc, p.ipDst = l3[9], net.IP(l3[12:16]), net.IP(l3[16:20])
		if p.proto == 17 && len(l3) >= ihl+8 {
			udp := l3[ihl:]
			p.sport, p.dport = binary.BigEndian.Uint16(udp[0:2]), binary.BigEndian.Uint16(udp[2:4])
			end := int(binary.BigEndian.Uint16(udp[4:6]))
			if end > len(udp) || end < 8 {
				end = len(udp)
			}
			p.payload = udp[8:end]
		}
	}
	return p, true
}

// guest plays the VM on a tap fd: it writes and reads frames (each behind a
// virtio-net header) and answers ARP requests for its address.
type guest struct {
	t   *testing.T
	tap *os.File
	mac net.HardwareAddr
	ip  net.IP
}

func (g *guest) send(frame []byte) {
	g.t.Helper()
	buf := append(make([]byte, vnetHdrLen), frame...)
	if _, err := g.tap.Write(buf); err != nil {
		g.t.Fatalf("write to tap: %v", err)
	}
}

// expect reads frames until match accepts one, answering ARP requests for
// the guest's address meanwhile.
func (g *guest) expect(what string, match func(parsed) bool) parsed {
	g.t.Helper()
	var got parsed
	g.read(what, func(frame []byte) bool {
		p, ok := parseFrame(frame)
		if !ok {
			return false
		}
		if match(p) {
			got = p
			return true
		}
		if p.typ == etherARP && p.arpOp == 1 && p.tpa.Equal(g.ip) {
			g.send(ethFrame(p.sha, g.mac, etherARP, arpPacket(2, g.mac, g.ip, p.sha, p.spa)))
		}
		return false
	})
	return got
}

// read hands each frame from the tap to handle until it returns true,
// for at most 5 s.
func (g *guest) read(what string, handle func(frame []byte) bool) {
	g.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	if err := g.tap.SetReadDeadline(deadline); err != nil {
		g.t.Fatal(err)
	}
	buf := make([]byte, 65536)
	for {
		n, err := g.tap.Read(buf)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			g.t.Fatalf("guest: no %s within 5s", what)
		}
		if err != nil {
			g.t.Fatalf("read tap: %v", err)
		}
		if n >= vnetHdrLen && handle(bytes.Clone(buf[vnetHdrLen:n])) {
			return
		}
	}
}
