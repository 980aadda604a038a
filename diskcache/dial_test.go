package diskcache

import (
	"context"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/containerd/errdefs"
)

// defaultNetns is a Netns in the test's own namespace with the default
// deny list, whose names resolve through table (fully qualified name to
// addresses); it records the names it was asked.
func defaultNetns(t *testing.T, table map[string][]string) (*Netns, *[]string) {
	t.Helper()
	deny, err := ParseDeny(DefaultDeny)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	asked := &[]string{}
	n := &Netns{Deny: deny}
	n.lookup = func(_ context.Context, host string) ([]netip.Addr, error) {
		mu.Lock()
		*asked = append(*asked, host)
		mu.Unlock()
		var out []netip.Addr
		for _, s := range table[host] {
			out = append(out, netip.MustParseAddr(s))
		}
		if len(out) == 0 {
			return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
		}
		return out, nil
	}
	return n, asked
}

// podClient is the client of NewPodClient for n, without its check of
// n.Path (the test's own namespace).
func podClient(t *testing.T, n *Netns) *http.Client {
	t.Helper()
	c, err := newClient("", n.DialContext)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestDenyControl shows the check every connect goes through: the default
// list refuses link-local and metadata addresses in every spelling, and
// lets the pod's own loopback and ordinary addresses through.
func TestDenyControl(t *testing.T) {
	n, _ := defaultNetns(t, nil)
	for _, tc := range []struct {
		addr   string
		denied bool
	}{
		{"169.254.169.254:80", true},
		{"[::ffff:169.254.169.254]:80", true},
		{"[::ffff:a9fe:a9fe]:80", true},
		{"169.254.170.2:80", true},
		{"[fe80::1]:80", true},
		{"[fe80::1%eth0]:80", true},
		{"[fd00:ec2::254]:80", true},
		{"[fd20:ce::254]:80", true},
		{"100.100.100.200:80", true},
		{"[::ffff:100.100.100.200]:80", true},
		{"168.63.129.16:80", true},
		{"[64:ff9b::a9fe:a9fe]:80", true},
		{"not-an-address:80", true},
		{"127.0.0.1:80", false},
		{"[::1]:80", false},
		{"10.88.0.1:443", false},
		{"100.100.100.201:80", false},
		{"[2001:db8::1]:80", false},
	} {
		err := n.control("tcp4", tc.addr, nil)
		if (err != nil) != tc.denied {
			t.Errorf("%s: %v, want denied %v", tc.addr, err, tc.denied)
		}
		if err != nil && (!errdefs.IsFailedPrecondition(err) || strings.Contains(err.Error(), "\n")) {
			t.Errorf("%s: error %v is not a one-line failed precondition", tc.addr, err)
		}
	}
}

// TestDenyDial shows a denied address, given as such or as a name that
// resolves to it, is refused before any connection, and Control refuses a
// connection the name check let through.
func TestDenyDial(t *testing.T) {
	n, _ := defaultNetns(t, map[string][]string{
		"meta.test.":   {"169.254.169.254"},
		"mapped.test.": {"::ffff:169.254.169.254"},
		"mixed.test.":  {"127.0.0.1", "fd00:ec2::254"},
	})
	for _, addr := range []string{"169.254.169.254:80", "[::ffff:169.254.169.254]:80", "meta.test:80", "mapped.test:80", "mixed.test:80"} {
		_, err := n.DialContext(context.Background(), "tcp", addr)
		if err == nil || !strings.Contains(err.Error(), "url_deny_cidrs") {
			t.Errorf("%s: %v, want a refusal naming url_deny_cidrs", addr, err)
		}
	}
	// Loopback denied too: Control alone sees the connection to it.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	strict := &Netns{Deny: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}
	if _, err := strict.dial(context.Background(), "tcp", "127.0.0.1", strings.Split(ln.Addr().String(), ":")[1]); err == nil || !strings.Contains(err.Error(), "url_deny_cidrs") {
		t.Errorf("a dial past the name check: %v, want Control's refusal", err)
	}
}

// TestDenyRedirect shows a redirect to a denied address, by address or by
// a name that resolves to one, fails at once without a request there.
func TestDenyRedirect(t *testing.T) {
	for _, target := range []string{"http://169.254.169.254/latest/meta-data/", "http://[::ffff:169.254.169.254]/", "http://meta.test/"} {
		n, _ := defaultNetns(t, map[string][]string{"meta.test.": {"169.254.169.254"}})
		f := &fake{redirect: target}
		srv := newFake(t, f)
		c := testCache(t)
		c.Client = podClient(t, n)
		var got lines
		_, err := c.Get(context.Background(), mustURL(t, srv.URL+"/d"), sum(nil), got.add)
		if err == nil || !strings.Contains(err.Error(), "url_deny_cidrs") {
			t.Fatalf("redirect to %s: %v", target, err)
		}
		checkOneLine(t, err)
		if got.has("retrying") {
			t.Errorf("redirect to %s: a refusal was retried:\n%s", target, &got)
		}
		if left := files(t, c, "tmp"); len(left) != 0 {
			t.Errorf("redirect to %s: left %v", target, left)
		}
	}
}

// TestResolveSearch shows the pod's search list: tried first for a name
// without a dot, after the name itself for others, and not at all for a
// fully qualified name; a name the pod's DNS does not know fails at once.
func TestResolveSearch(t *testing.T) {
	n, asked := defaultNetns(t, map[string][]string{"disks.ns.svc.cluster.local.": {"127.0.0.1"}, "a.b.": {"127.0.0.2"}})
	n.Search = []string{"ns.svc.cluster.local", "svc.cluster.local."}
	for _, tc := range []struct {
		host, want string
		names      []string
	}{
		{"disks", "127.0.0.1", []string{"disks.ns.svc.cluster.local."}},
		{"a.b", "127.0.0.2", []string{"a.b."}},
		{"a", "", []string{"a.ns.svc.cluster.local.", "a.svc.cluster.local.", "a."}},
		{"disks.", "", []string{"disks."}},
	} {
		*asked = nil
		addrs, err := n.resolve(context.Background(), tc.host)
		if !slices.Equal(*asked, tc.names) {
			t.Errorf("%s: asked %v, want %v", tc.host, *asked, tc.names)
		}
		switch {
		case tc.want == "" && (err == nil || !errdefs.IsNotFound(err)):
			t.Errorf("%s: %v %v, want not found", tc.host, addrs, err)
		case tc.want != "" && (err != nil || len(addrs) != 1 || addrs[0].String() != tc.want):
			t.Errorf("%s: %v %v, want %s", tc.host, addrs, err, tc.want)
		}
	}
}

// TestParseDeny shows the deny list takes CIDRs and single addresses.
func TestParseDeny(t *testing.T) {
	got, err := ParseDeny([]string{"10.0.0.1", "fd00::/8", "192.168.1.7/16"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"10.0.0.1/32", "fd00::/8", "192.168.0.0/16"}
	for i, p := range got {
		if p.String() != want[i] {
			t.Errorf("entry %d: %s, want %s", i, p, want[i])
		}
	}
	for _, bad := range []string{"", "10.0.0.0/33", "fe80::1%eth0", "example.com"} {
		if _, err := ParseDeny([]string{bad}); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestNoNetns shows a pod client needs a network namespace of the pod's
// own: none, or the caller's own, is refused in one line.
func TestNoNetns(t *testing.T) {
	for _, path := range []string{"", "/proc/self/ns/net", "/proc/self/ns/mnt", "/nonexistent/netns"} {
		_, err := NewPodClient("", &Netns{Path: path})
		if err == nil || !strings.HasPrefix(err.Error(), "disk-url: ") {
			t.Errorf("%q: %v", path, err)
			continue
		}
		checkOneLine(t, err)
	}
}
