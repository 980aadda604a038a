package network

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	kwait "k8s.io/apimachinery/pkg/util/wait"

	"github.com/vmshim/vmshim/thread"
)

// runInNS runs fn on a locked OS thread inside ns (thread.Run).
func runInNS(ns netns.NsHandle, fn func() error) error {
	return thread.Run(fn, thread.JoinNetns(fmt.Sprintf("/proc/self/fd/%d", int(ns))))
}

// makeNS makes an unnamed network namespace and returns a handle to it;
// set, when not nil, runs in it first.
func makeNS(set func() error) (netns.NsHandle, error) {
	ns := netns.None()
	err := thread.Run(func() (err error) {
		if set != nil {
			if err := set(); err != nil {
				return err
			}
		}
		ns, err = netns.Get()
		return err
	}, thread.NewNetns)
	return ns, err
}

// newNS creates an unnamed network namespace with lo up and IPv6 DAD off
// (so addresses are never "tentative" in snapshots).
func newNS(t testing.TB) (netns.NsHandle, *netlink.Handle) {
	t.Helper()
	ns, err := makeNS(func() error {
		_ = os.WriteFile("/proc/sys/net/ipv6/conf/default/accept_dad", []byte("0"), 0o644)
		_ = os.WriteFile("/proc/sys/net/ipv6/conf/all/accept_dad", []byte("0"), 0o644)
		return nil
	})
	if err != nil {
		t.Fatalf("new netns: %v", err)
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		ns.Close()
		t.Fatalf("netlink handle: %v", err)
	}
	t.Cleanup(func() {
		h.Close()
		ns.Close()
	})
	lo, err := h.LinkByName("lo")
	if err == nil {
		err = h.LinkSetUp(lo)
	}
	if err != nil {
		t.Fatalf("lo up: %v", err)
	}
	return ns, h
}

// newNamedNS creates a namespace as newNS does and binds it at
// /run/netns/name, as ip-netns(8) names one; the name goes with the test.
func newNamedNS(t *testing.T, name string) (netns.NsHandle, *netlink.Handle) {
	t.Helper()
	ns, h := newNS(t)
	path := filepath.Join("/run/netns", name)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, nil, 0o444); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(fmt.Sprintf("/proc/self/fd/%d", int(ns)), path, "none", unix.MS_BIND, ""); err != nil {
		_ = os.Remove(path)
		t.Fatalf("bind netns at %s: %v", path, err)
	}
	t.Cleanup(func() {
		if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
			return
		}
		if err := netns.DeleteNamed(name); err != nil {
			t.Errorf("delete netns %s: %v", name, err)
		}
	})
	return ns, h
}

// settleLink waits until the link called name has carrier and want IPv6
// addresses, none of them tentative. A veth's carrier, and with it the
// end of its addresses' tentative state, comes from the kernel's link
// watch a moment after both ends are up; until then a connection to one
// of the addresses finds no route.
func settleLink(t testing.TB, h *netlink.Handle, name string, want int) {
	t.Helper()
	var (
		last  netlink.Link
		addrs []netlink.Addr
	)
	err := kwait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		l, err := h.LinkByName(name)
		if err != nil {
			return false, err
		}
		last = l
		if addrs, err = h.AddrList(l, netlink.FAMILY_V6); err != nil {
			return false, err
		}
		if l.Attrs().RawFlags&unix.IFF_LOWER_UP == 0 || len(addrs) != want {
			return false, nil
		}
		for _, a := range addrs {
			if a.Flags&unix.IFA_F_TENTATIVE != 0 {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		var flags net.Flags
		if last != nil {
			flags = last.Attrs().Flags
		}
		t.Fatalf("%s did not settle: %v; flags %v addrs %v", name, err, flags, addrs)
	}
}
