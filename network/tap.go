package network

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// tapPrefix names the taps Setup creates: vmtap0, vmtap1, ...
const tapPrefix = "vmtap"

// in6AddrGenModeNone (IN6_ADDR_GEN_MODE_NONE) keeps the kernel from giving
// the tap an IPv6 link-local address, so the netns stack sends no router
// solicitations or DAD probes to the guest.
const in6AddrGenModeNone = 1

// tapFlags: no packet-information header; a virtio-net header, which QEMU
// detects on the fd (TUNGETIFF) and needs to offer the guest checksum and
// segmentation offloads; fail rather than attach to an existing device.
const tapFlags = netlink.TUNTAP_NO_PI | netlink.TUNTAP_VNET_HDR | netlink.TUNTAP_TUN_EXCL

// vnetHdrLen is the length of the virtio-net header that precedes every
// frame read from or written to a tap fd until QEMU changes it.
const vnetHdrLen = 10

func tapName(i int) string { return tapPrefix + strconv.Itoa(i) }

// isOwnTap reports whether link is a tap Setup created.
func isOwnTap(link netlink.Link) bool {
	return link.Type() == "tuntap" && strings.HasPrefix(link.Attrs().Name, tapPrefix)
}

// createTap creates the tap name in the namespace, with the given MTU, up
// and without IPv6. The tap is not persistent: it lives while the returned
// file (or a copy of it, such as QEMU's) is open.
func createTap(p *podNS, name string, mtu int) (*os.File, netlink.Link, error) {
	t := &netlink.Tuntap{
		LinkAttrs:  netlink.LinkAttrs{Name: name},
		Mode:       netlink.TUNTAP_MODE_TAP,
		Flags:      tapFlags,
		NonPersist: true,
		Queues:     1,
	}
	// /dev/net/tun creates the device in the netns of the thread opening it.
	if err := p.do(func() error { return p.h.LinkAdd(t) }); err != nil {
		return nil, nil, fmt.Errorf("create tap %s: %w", name, err)
	}
	if len(t.Fds) != 1 {
		for _, f := range t.Fds {
			f.Close()
		}
		return nil, nil, fmt.Errorf("create tap %s: got %d fds: %w", name, len(t.Fds), errdefs.ErrUnknown)
	}
	f := t.Fds[0]
	link, err := configureTap(p, name, mtu)
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return f, link, nil
}

func configureTap(p *podNS, name string, mtu int) (netlink.Link, error) {
	link, err := p.h.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("find tap %s: %w", name, err)
	}
	if err := p.h.LinkSetIP6AddrGenMode(link, in6AddrGenModeNone); err != nil &&
		!errors.Is(err, unix.EAFNOSUPPORT) && !errors.Is(err, unix.EOPNOTSUPP) {
		return nil, fmt.Errorf("turn off ipv6 address generation on %s: %w", name, err)
	}
	if err := p.h.LinkSetMTU(link, mtu); err != nil {
		return nil, fmt.Errorf("set mtu %d on %s: %w", mtu, name, err)
	}
	if err := p.h.LinkSetUp(link); err != nil {
		return nil, fmt.Errorf("set %s up: %w", name, err)
	}
	// Read it back for the MAC the kernel chose and the final flags.
	if link, err = p.h.LinkByName(name); err != nil {
		return nil, fmt.Errorf("find tap %s: %w", name, err)
	}
	return link, nil
}

// addLocalRoute gives the tap its link-local address and routes the pod IP
// to the guest through it, so the netns's own stack reaches the VM.
func addLocalRoute(p *podNS, tap netlink.Link, linkLocal, podIP net.IP) error {
	name := tap.Attrs().Name
	addr := &netlink.Addr{
		IPNet: &net.IPNet{IP: linkLocal.To4(), Mask: net.CIDRMask(32, 32)},
		Scope: unix.RT_SCOPE_LINK,
	}
	if err := p.h.AddrAdd(tap, addr); err != nil {
		return fmt.Errorf("add %s to %s: %w", addr.IPNet, name, err)
	}
	// The pod IP stays an address of the CNI interface, so frames from
	// the guest carry a source the netns owns; accept_local keeps the
	// netns from dropping them as martians (ARP for the link-local
	// address, port-forward replies). The setting goes with the tap.
	err := p.do(func() error {
		return os.WriteFile("/proc/sys/net/ipv4/conf/"+name+"/accept_local", []byte("1"), 0)
	})
	if err != nil {
		return fmt.Errorf("accept local source addresses on %s: %w", name, err)
	}
	route := &netlink.Route{
		LinkIndex: tap.Attrs().Index,
		Dst:       &net.IPNet{IP: podIP.To4(), Mask: net.CIDRMask(32, 32)},
		Src:       linkLocal.To4(),
		Scope:     netlink.SCOPE_LINK,
	}
	if err := p.h.RouteAdd(route); err != nil {
		return fmt.Errorf("add route %s dev %s src %s: %w", route.Dst, name, linkLocal, err)
	}
	return nil
}

// deleteTap removes the tap name if it is still there, for instance because
// QEMU still holds it. Its address and route go with it.
func deleteTap(p *podNS, name string) error {
	link, err := p.h.LinkByName(name)
	if err != nil {
		if isNotFound(err) {
			return nil
		}
		return fmt.Errorf("find tap %s: %w", name, err)
	}
	if !isOwnTap(link) {
		return fmt.Errorf("link %s is a %s, not a tap of ours: %w", name, link.Type(), errdefs.ErrFailedPrecondition)
	}
	if err := p.h.LinkDel(link); err != nil && !isNotFound(err) {
		return fmt.Errorf("delete tap %s: %w", name, err)
	}
	return nil
}
