package integration

import (
	"context"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// testRegistry is an OCI distribution registry (go-containerregistry's,
// in memory) listening on a loopback address in a daemon's network
// namespace, which the daemon's CRI pulls from in place of the
// registries images name.
type testRegistry struct {
	addr    string // host:port in the netns
	netns   string // the netns's path
	logPath string // the requests it served
}

// startRegistry starts a registry in d's network namespace, stopped when
// the test ends.
func startRegistry(t *testing.T, d *daemon) *testRegistry {
	t.Helper()
	r := &testRegistry{netns: "/run/netns/" + d.netns, logPath: filepath.Join(t.TempDir(), "registry.log")}
	logf, err := os.Create(r.logPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { logf.Close() })
	var ln net.Listener
	if err := inNetns(r.netns, func() (err error) {
		ln, err = net.Listen("tcp", "127.0.0.1:0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: registry.New(registry.Logger(log.New(logf, "", log.Ltime)))}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	r.addr = ln.Addr().String()
	return r
}

// transport dials the registry from inside its network namespace.
func (r *testRegistry) transport() http.RoundTripper {
	return &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := inNetns(r.netns, func() (err error) {
			c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}}
}

// push stores img in the registry under ref's repository and tag, as
// the registry ref names would.
func (r *testRegistry) push(ctx context.Context, ref string, img v1.Image) error {
	src, err := name.ParseReference(ref)
	if err != nil {
		return err
	}
	dst, err := name.ParseReference(r.addr+"/"+src.Context().RepositoryStr()+":"+src.Identifier(), name.Insecure)
	if err != nil {
		return err
	}
	if err := remote.Write(dst, img, remote.WithContext(ctx), remote.WithTransport(r.transport())); err != nil {
		return fmt.Errorf("push %s: %w", ref, err)
	}
	return nil
}

// registryHostsTOML sends every request for a registry host to the
// test registry, over plain HTTP.
const registryHostsTOML = "server = %q\n"

// serve has d's CRI pull the images of the registry hosts refs name from
// the registry (d must have been started with registryHosts).
func (r *testRegistry) serve(d *daemon, refs ...string) error {
	for _, ref := range refs {
		n, err := name.ParseReference(ref)
		if err != nil {
			return err
		}
		dir := filepath.Join(d.registryDir(), n.Context().RegistryStr())
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, "hosts.toml"), fmt.Appendf(nil, registryHostsTOML, "http://"+r.addr), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// missing lists the pulls the registry answered with "not found":
// images asked for that it does not hold. (containerd names the registry
// it pulls for in the query; pushes' checks have none.)
func (r *testRegistry) missing() []string {
	data, _ := os.ReadFile(r.logPath)
	seen := map[string]bool{}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 3 && f[3] == "404" && strings.Contains(f[2], "?ns=") {
			seen[f[1]+" "+f[2]] = true
		}
	}
	out := make([]string, 0, len(seen))
	for s := range seen {
		out = append(out, s)
	}
	sort.Strings(out)
	return out
}

// pushAll pushes images (reference → image) and serves their hosts.
func (r *testRegistry) pushAll(ctx context.Context, t *testing.T, d *daemon, images map[string]v1.Image) {
	t.Helper()
	refs := make([]string, 0, len(images))
	for ref, img := range images {
		if err := r.push(ctx, ref, img); err != nil {
			t.Fatal(err)
		}
		refs = append(refs, ref)
	}
	if err := r.serve(d, refs...); err != nil {
		t.Fatal(err)
	}
}
