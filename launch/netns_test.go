package launch

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// testNetns makes a network namespace pinned under a temporary directory
// and removes it when the test ends; it skips the test unless root.
func testNetns(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("making a network namespace needs root")
	}
	path := filepath.Join(t.TempDir(), "netns", "test")
	if err := createNetns(path); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := removeNetns(path); err != nil {
			t.Error(err)
		}
	})
	return path
}

// netnsID names the network namespace at path (a pinned one or a
// /proc/PID/ns/net link) as readlink of /proc/PID/ns/net does.
func netnsID(t *testing.T, path string) string {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatalf("stat %s: %v", path, err)
	}
	return fmt.Sprintf("net:[%d]", st.Ino)
}

// mounted reports whether path is a mount point in our mount namespace.
func mounted(t *testing.T, path string) bool {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == path {
			return true
		}
	}
	return false
}

func TestCreateNetns(t *testing.T) {
	path := testNetns(t)
	id := netnsID(t, path)
	if id == ourNetns(t) {
		t.Fatalf("%s is our own network namespace %s", path, id)
	}
	if !mounted(t, path) {
		t.Errorf("%s is not a mount point", path)
	}

	ns, err := netns.GetFromPath(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	if len(links) != 1 || links[0].Attrs().Name != "lo" {
		t.Errorf("new netns has links %v, want only lo", links)
	} else if links[0].Attrs().Flags&net.FlagUp == 0 {
		t.Errorf("lo is down: %v", links[0].Attrs().Flags)
	}

	// A second namespace at the same path is refused and the first stays.
	if err := createNetns(path); !errors.Is(err, os.ErrExist) {
		t.Errorf("createNetns over an existing one: %v, want it exists", err)
	}
	if got := netnsID(t, path); got != id {
		t.Errorf("after the failed create %s is %s, want %s still", path, got, id)
	}

	for i := range 2 {
		if err := removeNetns(path); err != nil {
			t.Fatalf("removeNetns #%d: %v", i, err)
		}
		if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("after removeNetns #%d %s is still there: %v", i, path, err)
		}
		if mounted(t, path) {
			t.Errorf("after removeNetns #%d %s is still mounted", i, path)
		}
	}
}

func TestRemoveNetnsNotMounted(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("unmounting needs root")
	}
	path := filepath.Join(t.TempDir(), "stale")
	if err := os.WriteFile(path, nil, 0o444); err != nil {
		t.Fatal(err)
	}
	if err := removeNetns(path); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale mount point %s is still there: %v", path, err)
	}
}

func TestTaskNetnsPath(t *testing.T) {
	name := regexp.MustCompile(`^/run/netns/vmshim-[0-9a-f]{16}$`)
	seen := map[string]string{}
	for _, tc := range []struct{ ns, id string }{
		{"default", "web"},
		{"default", "web2"},
		{"k8s.io", "web"},
		{"web", "default"},
		{"default", "a"},
		{"defaulta", ""},
	} {
		p := taskNetnsPath(tc.ns, tc.id)
		if !name.MatchString(p) {
			t.Errorf("taskNetnsPath(%q, %q) = %q, not /run/netns/vmshim-<16 hex>", tc.ns, tc.id, p)
		}
		if again := taskNetnsPath(tc.ns, tc.id); again != p {
			t.Errorf("taskNetnsPath(%q, %q) = %q, then %q", tc.ns, tc.id, p, again)
		}
		key := tc.ns + " " + tc.id
		if other, ok := seen[p]; ok {
			t.Errorf("taskNetnsPath(%s) = taskNetnsPath(%s) = %s", key, other, p)
		}
		seen[p] = key
	}
}
