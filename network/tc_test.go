package network

import (
	"net"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

func u32Keys(t *testing.T, f netlink.Filter) []nl.TcU32Key {
	t.Helper()
	u, ok := f.(*netlink.U32)
	if !ok {
		t.Fatalf("filter %T, want u32", f)
	}
	if u.Sel.Flags&nl.TC_U32_TERMINAL == 0 || int(u.Sel.Nkeys) != len(u.Sel.Keys) {
		t.Fatalf("selector %+v: not terminal or wrong key count", u.Sel)
	}
	if u.Parent != netlink.HANDLE_MIN_INGRESS {
		t.Fatalf("parent %x, want ingress", u.Parent)
	}
	return u.Sel.Keys
}

func TestTapFilters(t *testing.T) {
	mac := net.HardwareAddr{0x02, 0x11, 0x22, 0x33, 0x44, 0x55}
	fs, err := tapFilters(7, 3, mac, net.IPv4(169, 254, 1, 2))
	if err != nil {
		t.Fatal(err)
	}
	if len(fs) != 11+4 {
		t.Fatalf("got %d filters, want 15", len(fs))
	}
	for i, f := range fs[:11] {
		keys := u32Keys(t, f)
		ihl := 5 + i
		if f.Attrs().Priority != prioDHCP || f.Attrs().Protocol != unix.ETH_P_IP || f.Attrs().LinkIndex != 7 {
			t.Errorf("dhcp filter %d attrs %+v", i, f.Attrs())
		}
		if keys[0].Val != uint32(0x40|ihl)<<24 || keys[3].Off != int32(ihl*4) || keys[3].Val != 67 {
			t.Errorf("dhcp filter for ihl %d: keys %+v", ihl, keys)
		}
		if len(f.(*netlink.U32).Actions) != 0 || f.(*netlink.U32).ClassId == 0 {
			t.Errorf("dhcp filter %d must pass to the stack: a class and no action", i)
		}
	}
	arp := fs[11]
	if keys := u32Keys(t, arp); arp.Attrs().Protocol != unix.ETH_P_ARP || keys[0].Off != 24 || keys[0].Val != 0xa9fe0102 {
		t.Errorf("arp filter %+v keys %+v", arp.Attrs(), keys)
	}
	toNetns := u32Keys(t, fs[12])
	if toNetns[0] != (nl.TcU32Key{Mask: 0xffff, Val: 0x0211, Off: -16}) ||
		toNetns[1] != (nl.TcU32Key{Mask: 0xffffffff, Val: 0x22334455, Off: -12}) {
		t.Errorf("to-netns keys %+v", toNetns)
	}
	bcast := fs[13].(*netlink.U32)
	if k := u32Keys(t, bcast); k[0].Mask != 0x100 || k[0].Val != 0x100 || k[0].Off != -16 {
		t.Errorf("broadcast keys %+v", k)
	}
	m, ok := bcast.Actions[0].(*netlink.MirredAction)
	if !ok || m.MirredAction != netlink.TCA_EGRESS_MIRROR || m.Ifindex != 3 || m.Attrs().Action != netlink.TC_ACT_OK {
		t.Errorf("broadcast action %+v", bcast.Actions[0])
	}
	last := fs[14].(*netlink.U32)
	m, ok = last.Actions[0].(*netlink.MirredAction)
	if !ok || m.MirredAction != netlink.TCA_EGRESS_REDIR || m.Ifindex != 3 || last.Priority != prioToLink {
		t.Errorf("catch-all %+v action %+v", last.Attrs(), last.Actions[0])
	}
	if k := u32Keys(t, last); len(k) != 1 || k[0].Mask != 0 {
		t.Errorf("catch-all keys %+v", k)
	}
}

func TestTapFiltersWithoutIPv4(t *testing.T) {
	fs, err := tapFilters(7, 3, net.HardwareAddr{2, 0, 0, 0, 0, 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fs {
		if f.Attrs().Priority == prioARPLocal {
			t.Error("arp filter for a link-local address the tap does not have")
		}
	}
	if _, err := tapFilters(7, 3, net.HardwareAddr{1, 2}, nil); err == nil {
		t.Error("short mac accepted")
	}
}

func TestLinkFilters(t *testing.T) {
	fs := linkFilters(3, 7)
	if len(fs) != 13 {
		t.Fatalf("got %d filters, want 13", len(fs))
	}
	for _, f := range fs[:11] {
		if k := u32Keys(t, f); k[3].Val != 68 || f.Attrs().LinkIndex != 3 {
			t.Errorf("dhcp reply filter keys %+v", k)
		}
	}
	arp := fs[11].(*netlink.U32)
	if k := u32Keys(t, arp); arp.Protocol != unix.ETH_P_ARP || arp.Priority != prioLinkARP ||
		len(k) != 1 || k[0] != (nl.TcU32Key{Mask: 0xffff, Val: arpReply, Off: 4}) {
		t.Errorf("arp reply filter %+v keys %+v", arp.Attrs(), k)
	}
	m, ok := arp.Actions[0].(*netlink.MirredAction)
	if !ok || m.MirredAction != netlink.TCA_EGRESS_MIRROR || m.Ifindex != 7 || m.Attrs().Action != netlink.TC_ACT_OK {
		t.Errorf("arp reply action %+v, want a copy to the tap, and the netns stack", arp.Actions[0])
	}
	last := fs[12].(*netlink.U32)
	m, ok = last.Actions[0].(*netlink.MirredAction)
	if !ok || m.MirredAction != netlink.TCA_EGRESS_REDIR || m.Ifindex != 7 || last.Priority != prioLinkToVM {
		t.Errorf("redirect to tap: %+v", last.Actions)
	}
	if prioLinkIPv6Ext >= prioLinkSocket || prioLinkSocket >= prioLinkToVM {
		t.Error("the socket classifier must run after the control traffic's filters and before the redirect")
	}
}
