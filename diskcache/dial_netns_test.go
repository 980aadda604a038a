package diskcache

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/net/dns/dnsmessage"
	"golang.org/x/sys/unix"

	"github.com/vmshim/vmshim/thread"
)

// testNetns makes a network namespace with its loopback up, pinned at a
// file until the test ends. It needs root; the test is skipped without.
func testNetns(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to make a network namespace")
	}
	path := filepath.Join(t.TempDir(), "netns")
	if err := os.WriteFile(path, nil, 0o444); err != nil {
		t.Fatal(err)
	}
	err := thread.Run(func() error {
		if err := unix.Mount("/proc/thread-self/ns/net", path, "none", unix.MS_BIND, ""); err != nil {
			return err
		}
		t.Cleanup(func() { _ = unix.Unmount(path, unix.MNT_DETACH) })
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(lo)
	}, thread.NewNetns)
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// listenIn listens on addr inside the namespace at path.
func listenIn(t *testing.T, path, network, addr string) (ln net.Listener, pc net.PacketConn) {
	t.Helper()
	err := thread.Run(func() (err error) {
		if network == "udp" {
			pc, err = net.ListenPacket(network, addr)
		} else {
			ln, err = net.Listen(network, addr)
		}
		return err
	}, thread.JoinNetns(path))
	if err != nil {
		t.Fatal(err)
	}
	return ln, pc
}

// serveDNS answers A queries from table (fully qualified name to IPv4
// address) on pc, NXDOMAIN for other names, and counts the queries.
func serveDNS(t *testing.T, pc net.PacketConn, table map[string]string, queries *atomic.Int32) {
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 512)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			var m dnsmessage.Message
			if m.Unpack(buf[:n]) != nil || len(m.Questions) != 1 {
				continue
			}
			queries.Add(1)
			q := m.Questions[0]
			m.Header.Response, m.Header.Authoritative = true, true
			ip, ok := table[q.Name.String()]
			switch {
			case !ok:
				m.Header.RCode = dnsmessage.RCodeNameError
			case q.Type == dnsmessage.TypeA:
				a := netip.MustParseAddr(ip).As4()
				m.Answers = []dnsmessage.Resource{{
					Header: dnsmessage.ResourceHeader{Name: q.Name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET, TTL: 60},
					Body:   &dnsmessage.AResource{A: a},
				}}
			}
			if out, err := m.Pack(); err == nil {
				pc.WriteTo(out, from)
			}
		}
	}()
}

// TestPodNetns shows a pod client fetches from the pod's namespace, names
// resolved by the pod's nameserver: a server on the pod's loopback is
// reached, one on the caller's loopback sees nothing, and a name the pod's
// DNS maps to a metadata address is refused.
func TestPodNetns(t *testing.T) {
	path := testNetns(t)
	var queries atomic.Int32
	_, pc := listenIn(t, path, "udp", "127.0.0.1:53")
	serveDNS(t, pc, map[string]string{"disk.pod.test.": "127.0.0.1", "meta.pod.test.": "169.254.169.254"}, &queries)
	f := &fake{body: pattern(64 << 10)}
	ln, _ := listenIn(t, path, "tcp", "127.0.0.1:0")
	srv := &httptest.Server{Listener: ln, Config: &http.Server{Handler: f}}
	srv.Start()
	t.Cleanup(srv.Close)
	var node atomic.Int32
	nodeSrv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { node.Add(1) }))
	t.Cleanup(nodeSrv.Close)

	deny, err := ParseDeny(DefaultDeny)
	if err != nil {
		t.Fatal(err)
	}
	client, err := NewPodClient("", &Netns{Path: path, Nameservers: []netip.Addr{netip.MustParseAddr("127.0.0.1")}, Deny: deny})
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	c := testCache(t)
	c.Client = client
	getOK(t, c, "http://disk.pod.test:"+port+"/d", f.body, nil)
	if queries.Load() == 0 {
		t.Errorf("the pod's nameserver was not asked")
	}
	// Cached now: the hit is checked from the pod's namespace too.
	getOK(t, c, "http://disk.pod.test:"+port+"/d", f.body, nil)
	if f.probes.Load() != 1 {
		t.Errorf("%d probes, want 1", f.probes.Load())
	}

	_, err = c.Get(context.Background(), mustURL(t, nodeSrv.URL+"/d"), sum(f.body), nil)
	if err == nil || !errors.Is(err, unix.ECONNREFUSED) && !strings.Contains(err.Error(), "refused") {
		t.Errorf("the node's loopback from the pod: %v, want connection refused", err)
	}
	if node.Load() != 0 {
		t.Errorf("the server on the node's loopback got %d requests", node.Load())
	}
	_, err = c.Get(context.Background(), mustURL(t, "http://meta.pod.test/latest/"), sum(f.body), nil)
	if err == nil || !strings.Contains(err.Error(), "url_deny_cidrs") {
		t.Errorf("a name for the metadata address: %v, want a refusal", err)
	}
}
