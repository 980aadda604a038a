package integration

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/mdlayher/ndp"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The router the pod network pretends to be, and what it advertises.
const (
	rogueRouter = "fe80::bad:1"
	roguePrefix = "fd00:bad::"
)

var rogueMAC = net.HardwareAddr{0x02, 0, 0, 0, 0x0b, 0xad}

// rogueRA is an Ethernet frame from the pod network's side: a router
// advertisement to all nodes behind a Destination Options header, from
// rogueRouter, with a default route and an on-link, autonomous
// roguePrefix/64.
func rogueRA(t *testing.T) []byte {
	t.Helper()
	src, dst := netip.MustParseAddr(rogueRouter), netip.MustParseAddr("ff02::1")
	ra := &ndp.RouterAdvertisement{CurrentHopLimit: 64, RouterLifetime: 30 * time.Minute, Options: []ndp.Option{
		&ndp.PrefixInformation{PrefixLength: 64, OnLink: true, AutonomousAddressConfiguration: true,
			ValidLifetime: time.Hour, PreferredLifetime: time.Hour, Prefix: netip.MustParseAddr(roguePrefix)},
		&ndp.LinkLayerAddress{Direction: ndp.Source, Addr: rogueMAC},
	}}
	msg, err := ndp.MarshalMessageChecksum(ra, src, dst)
	if err != nil {
		t.Fatal(err)
	}
	// Destination Options: next header ICMPv6, length 0 (8 bytes), PadN.
	payload := append([]byte{unix.IPPROTO_ICMPV6, 0, 1, 4, 0, 0, 0, 0}, msg...)
	b := make([]byte, 14+40, 14+40+len(payload))
	copy(b[0:6], []byte{0x33, 0x33, 0, 0, 0, 1})
	copy(b[6:12], rogueMAC)
	binary.BigEndian.PutUint16(b[12:14], unix.ETH_P_IPV6)
	ip := b[14:]
	ip[0] = 0x60
	binary.BigEndian.PutUint16(ip[4:6], uint16(len(payload)))
	ip[6], ip[7] = 60, 255 // Destination Options, hop limit 255 as router discovery requires
	copy(ip[8:24], src.AsSlice())
	copy(ip[24:40], dst.AsSlice())
	return append(b, payload...)
}

// sendOnLink sends frame out of the link named ifname in the netns at
// path.
func sendOnLink(path, ifname string, frame []byte) error {
	return inNetns(path, func() error {
		l, err := netlink.LinkByName(ifname)
		if err != nil {
			return err
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return unix.Sendto(fd, frame, 0, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_IPV6), Ifindex: l.Attrs().Index})
	})
}

// pingWithDestOpts sends ICMPv6 echo requests behind a Destination
// Options header from the netns at path to dst until one is answered:
// ordinary traffic behind the header the rogue advertisement carried
// still reaches the guest.
func pingWithDestOpts(ctx context.Context, path string, dst net.IP) error {
	return inNetns(path, func() error {
		fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_ICMPV6)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		// RFC 3542 sticky option: every packet carries it. The kernel
		// sets the Next Header byte.
		if err := unix.SetsockoptString(fd, unix.IPPROTO_IPV6, unix.IPV6_DSTOPTS, string([]byte{0, 0, 1, 4, 0, 0, 0, 0})); err != nil {
			return fmt.Errorf("set IPV6_DSTOPTS: %w", err)
		}
		tv := unix.Timeval{Usec: 500000}
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			return err
		}
		to := &unix.SockaddrInet6{}
		copy(to.Addr[:], dst.To16())
		buf := make([]byte, 1500)
		for seq := uint16(1); ctx.Err() == nil; seq++ {
			// The kernel fills in an ICMPv6 raw socket's checksum.
			req := []byte{128, 0, 0, 0, 0x0b, 0xad, byte(seq >> 8), byte(seq), 'v', 'm', 's', 'h', 'i', 'm'}
			if err := unix.Sendto(fd, req, 0, to); err != nil {
				return fmt.Errorf("send echo request: %w", err)
			}
			for {
				n, from, err := unix.Recvfrom(fd, buf, 0)
				if errors.Is(err, unix.EAGAIN) {
					break
				}
				if err != nil {
					return err
				}
				src, ok := from.(*unix.SockaddrInet6)
				if ok && n >= 8 && buf[0] == 129 && bytes.Equal(buf[4:6], []byte{0x0b, 0xad}) && net.IP(src.Addr[:]).Equal(dst) {
					return nil
				}
			}
		}
		return ctx.Err()
	})
}

// TestIPv6ExtensionHeaderRA repeats the attack of a router advertisement
// behind a Destination Options header from the pod network, which the
// u32 filters alone took for ordinary traffic and handed to the guest:
// the guest's routes do not change. (The guest's own advertisements
// behind extension headers are kept from leaving the tap by the same
// classifier; a busybox guest has no way to send one, so
// network.TestSetupIPv6ExtensionHeaders covers that direction.)
func TestIPv6ExtensionHeaderRA(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*bootTimeout)
	defer cancel()
	d := criDaemon(ctx, t, daemonOptions{cni: dualStackCNI}, "kernel-agent.tar")
	p := runPod6(ctx, t, newCRI(t, d), "ra-ext")
	vm := p.startVM(ctx, t, imageKernelAgent, nil)
	vm.waitLog(ctx, t, markerAgent)
	lease := leaseFields(vm.waitLog(ctx, t, "VMSHIM-LEASE6"))
	guestIP := net.ParseIP(lease["ip"])
	if guestIP == nil {
		t.Fatalf("guest's dhcpv6 lease %v", lease)
	}
	routes := func() string {
		return vm.mustExec(ctx, t, "sh", "-c", "ip -6 route show; ip -6 addr show")
	}
	// The responder's advertisement has given the guest its router.
	var before string
	for i := 0; ; i++ {
		if before = routes(); strings.Contains(before, "default via fe80::") {
			break
		}
		if i == 60 {
			t.Fatalf("guest has no ipv6 default route:\n%s", before)
		}
		time.Sleep(time.Second)
	}

	netnsPath := "/run/netns/" + d.netns
	for range 3 {
		if err := sendOnLink(netnsPath, "vmshim-br0", rogueRA(t)); err != nil {
			t.Fatalf("send the router advertisement on the pod network: %v", err)
		}
	}
	// Traffic behind the same header, sent after it, reaches the guest.
	pctx, pcancel := context.WithTimeout(ctx, time.Minute)
	defer pcancel()
	if err := pingWithDestOpts(pctx, netnsPath, guestIP); err != nil {
		t.Fatalf("echo request behind destination options to the guest's %s: %v", guestIP, err)
	}
	after := routes()
	t.Logf("guest before:\n%s\nafter:\n%s", before, after)
	for _, bad := range []string{rogueRouter, strings.TrimSuffix(roguePrefix, "::")} {
		if strings.Contains(after, bad) {
			t.Errorf("the pod network's router advertisement reached the guest: %s in\n%s", bad, after)
		}
	}
	p.remove(t)
}
