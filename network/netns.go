package network

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/containerd/errdefs"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/vmshim/vmshim/thread"
)

// netlinkTimeout bounds every netlink request, which takes no context.
const netlinkTimeout = 10 * time.Second

// dumpRetries is how often a netlink dump interrupted by a concurrent change
// is repeated before giving up.
const dumpRetries = 5

// podNS is an open pod network namespace: a handle for entering it and a
// netlink handle whose sockets live in it.
type podNS struct {
	path string
	ns   netns.NsHandle
	h    *netlink.Handle
}

// openNS opens the network namespace at path. It refuses the caller's own
// network namespace, so a wrong path can never strip the host's addresses.
func openNS(path string) (*podNS, error) {
	if path == "" {
		return nil, fmt.Errorf("netns path is empty: %w", errdefs.ErrInvalidArgument)
	}
	ns, err := netns.GetFromPath(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("open netns %s: %w", path, errdefs.ErrNotFound)
		}
		return nil, fmt.Errorf("open netns %s: %w", path, err)
	}
	if err := checkNetNS(ns, path); err != nil {
		ns.Close()
		return nil, err
	}
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		ns.Close()
		return nil, fmt.Errorf("netlink handle in netns %s: %w", path, err)
	}
	if err := h.SetSocketTimeout(netlinkTimeout); err != nil {
		h.Close()
		ns.Close()
		return nil, fmt.Errorf("netlink timeout in netns %s: %w", path, err)
	}
	return &podNS{path: path, ns: ns, h: h}, nil
}

// checkNetNS makes sure ns is a network namespace other than the caller's.
func checkNetNS(ns netns.NsHandle, path string) error {
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(ns), &st); err != nil {
		return fmt.Errorf("stat netns %s: %w", path, err)
	}
	if st.Type != unix.NSFS_MAGIC {
		return fmt.Errorf("%s is not a namespace file: %w", path, errdefs.ErrNotFound)
	}
	typ, err := unix.IoctlRetInt(int(ns), unix.NS_GET_NSTYPE)
	if err == nil && typ != unix.CLONE_NEWNET {
		return fmt.Errorf("%s is not a network namespace: %w", path, errdefs.ErrInvalidArgument)
	}
	self, err := netns.Get()
	if err != nil {
		return fmt.Errorf("current netns: %w", err)
	}
	defer self.Close()
	if self.Equal(ns) {
		return fmt.Errorf("netns %s is the shim's own network namespace: %w", path, errdefs.ErrInvalidArgument)
	}
	return nil
}

// Close releases the namespace and netlink handles.
func (p *podNS) Close() {
	p.h.Close()
	p.ns.Close()
}

// do runs fn on an OS thread switched into the namespace. Sockets and tap
// devices opened by fn belong to the namespace.
func (p *podNS) do(fn func() error) error {
	return thread.Run(fn, thread.JoinNetns(p.path))
}

// retryDump repeats a netlink dump interrupted by a concurrent change.
func retryDump[T any](fn func() (T, error)) (T, error) {
	var (
		v   T
		err error
	)
	for range dumpRetries {
		v, err = fn()
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			return v, err
		}
	}
	return v, err
}

// isNotFound reports whether err says the object is already gone.
func isNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf) || errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENODEV) ||
		errors.Is(err, unix.ESRCH) || errors.Is(err, unix.EADDRNOTAVAIL)
}

// isExist reports whether err says the object is already there.
func isExist(err error) bool {
	return errors.Is(err, unix.EEXIST)
}
