package launch

import (
	"github.com/vmshim/vmshim/thread"

	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// netnsDir is where the shim pins the network namespaces it makes, next to
// those of `ip netns` and the CRI, so that `ip netns` lists them.
const netnsDir = "/run/netns"

// taskNetnsPath names the network namespace the shim makes for a task
// whose spec asks for a new one without a path.
func taskNetnsPath(ns, id string) string {
	sum := sha256.Sum256([]byte(ns + "/" + id))
	return filepath.Join(netnsDir, "vmshim-"+hex.EncodeToString(sum[:8]))
}

// createNetns makes a new network namespace with its loopback up and pins
// it with a bind mount at path. On failure nothing is left at path.
func createNetns(path string) (retErr error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("create %s: %w", filepath.Dir(path), err)
	}
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return fmt.Errorf("create netns mount point: %w", err)
	}
	f.Close()
	defer func() {
		if retErr != nil {
			_ = removeNetns(path)
		}
	}()
	return thread.Run(func() error {
		if err := unix.Mount("/proc/thread-self/ns/net", path, "none", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("pin netns at %s: %w", path, err)
		}
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return fmt.Errorf("loopback in new netns: %w", err)
		}
		if err := netlink.LinkSetUp(lo); err != nil {
			return fmt.Errorf("loopback up in new netns: %w", err)
		}
		return nil
	}, thread.NewNetns)
}

// removeNetns unpins and removes a namespace createNetns made; a missing
// one is removed already.
func removeNetns(path string) error {
	if err := mount.Unmount(path, unix.MNT_DETACH); err != nil &&
		!errors.Is(err, os.ErrNotExist) && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("unmount netns %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove netns %s: %w", path, err)
	}
	return nil
}

// netnsIsEmpty reports whether the namespace at path has no interface
// but lo: nothing (a hook, say) has given it a network.
func netnsIsEmpty(path string) (bool, error) {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return false, fmt.Errorf("open netns %s: %w", path, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return false, fmt.Errorf("netlink in netns %s: %w", path, err)
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		return false, fmt.Errorf("list links in netns %s: %w", path, err)
	}
	for _, l := range links {
		if l.Attrs().Flags&net.FlagLoopback == 0 {
			return false, nil
		}
	}
	return true, nil
}
