package network

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/containernetworking/cni/libcni"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// cniPluginDir holds the Debian containernetworking-plugins binaries.
const cniPluginDir = "/usr/lib/cni"

// cniEnv is a test-made "host" netns, where the plugins run and the bridge
// appears, and a named "pod" netns attached to it. Nothing outside them
// changes; both vanish when the test ends.
type cniEnv struct {
	t       *testing.T
	host    netns.NsHandle
	pod     netns.NsHandle
	podH    *netlink.Handle
	podName string // under /run/netns
	podPath string
	dataDir string // host-local IPAM leases
	conf    CNIConfig
}

func randomHex(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

func needCNIPlugins(t *testing.T) {
	t.Helper()
	needRoot(t)
	for _, p := range []string{"bridge", "host-local"} {
		if _, err := os.Stat(filepath.Join(cniPluginDir, p)); err != nil {
			t.Skipf("needs the CNI %s plugin in %s", p, cniPluginDir)
		}
	}
}

// writeConf writes a CNI configuration file into dir.
func writeConf(t *testing.T, dir, file, body string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, file)), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, file), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

// bridgeConflist is a bridge + host-local network on 10.213.0.0/24,
// followed by the plugins named in extra (each given only a type).
func bridgeConflist(name, bridge, dataDir string, extra ...string) string {
	plugins := []string{fmt.Sprintf(`{"type": "bridge", "bridge": %q, "isGateway": true, "ipMasq": false,
	  "ipam": {"type": "host-local", "dataDir": %q, "ranges": [[{"subnet": "10.213.0.0/24"}]]}}`, bridge, dataDir)}
	for _, e := range extra {
		plugins = append(plugins, fmt.Sprintf(`{"type": %q}`, e))
	}
	return fmt.Sprintf(`{"cniVersion": "1.0.0", "name": %q, "plugins": [%s]}`, name, strings.Join(plugins, ",\n"))
}

func newCNIEnv(t *testing.T) *cniEnv {
	t.Helper()
	needCNIPlugins(t)
	suffix := randomHex(t, 3)
	e := &cniEnv{t: t, podName: "vmshimt-" + suffix, dataDir: t.TempDir()}
	e.host, _ = newNS(t)
	e.pod, e.podH = newNamedNS(t, e.podName)
	e.podPath = filepath.Join("/run/netns", e.podName)
	e.conf = CNIConfig{Network: "vmshim-test", ConfDir: t.TempDir(), BinDirs: []string{cniPluginDir}, CacheDir: t.TempDir()}
	writeConf(t, e.conf.ConfDir, "10-test.conflist", bridgeConflist(e.conf.Network, "vmshimt"+suffix, e.dataDir))
	return e
}

// attach runs AttachCNI from the host netns.
func (e *cniEnv) attach(ctx context.Context, c CNIConfig, id string) (*CNIAttachment, error) {
	var a *CNIAttachment
	err := runInNS(e.host, func() error {
		var err error
		a, err = AttachCNI(ctx, c, id, e.podPath)
		return err
	})
	if a != nil {
		e.t.Cleanup(func() { _ = e.detach(context.Background(), a) })
	}
	return a, err
}

// detach runs Detach from the host netns.
func (e *cniEnv) detach(ctx context.Context, a *CNIAttachment) error {
	return runInNS(e.host, func() error { return a.Detach(ctx) })
}

// leases lists the addresses host-local holds for the network.
func (e *cniEnv) leases() []string {
	e.t.Helper()
	files, err := filepath.Glob(filepath.Join(e.dataDir, e.conf.Network, "10.213.0.*"))
	if err != nil {
		e.t.Fatal(err)
	}
	for i, f := range files {
		files[i] = filepath.Base(f)
	}
	return files
}

// podAddrs lists eth0's IPv4 addresses in the pod netns; nil when there is no eth0.
func (e *cniEnv) podAddrs() []string {
	e.t.Helper()
	l, err := e.podH.LinkByName("eth0")
	var nf netlink.LinkNotFoundError
	if errors.As(err, &nf) {
		return nil
	}
	if err != nil {
		e.t.Fatalf("eth0 in pod netns: %v", err)
	}
	addrs, err := e.podH.AddrList(l, netlink.FAMILY_V4)
	if err != nil {
		e.t.Fatalf("eth0 addresses: %v", err)
	}
	out := []string{}
	for _, a := range addrs {
		out = append(out, a.IPNet.String())
	}
	return out
}

// checkDetached makes sure nothing of the attachment is left: no lease, no
// cached result and, when the netns still has a path, no eth0.
func (e *cniEnv) checkDetached(a *CNIAttachment, netnsGone bool) {
	e.t.Helper()
	if l := e.leases(); len(l) != 0 {
		e.t.Errorf("leases after detach = %v, want none", l)
	}
	cache := filepath.Join(e.conf.CacheDir, "results", e.conf.Network+"-"+a.ContainerID+"-eth0")
	if _, err := os.Stat(cache); !errors.Is(err, os.ErrNotExist) {
		e.t.Errorf("cached result %s after detach: %v", cache, err)
	}
	if !netnsGone {
		if addrs := e.podAddrs(); addrs != nil {
			e.t.Errorf("eth0 still in pod netns with %v", addrs)
		}
	}
}

func checkAttached(t *testing.T, e *cniEnv, a *CNIAttachment, id string) {
	t.Helper()
	if a.Network != e.conf.Network || a.ContainerID != id || a.Netns != e.podPath || a.IfName != "eth0" ||
		!slices.Equal(a.BinDirs, e.conf.BinDirs) || a.CacheDir != e.conf.CacheDir || len(a.ConfList) == 0 {
		t.Errorf("attachment = %+v", a)
	}
	if len(a.IPs) != 1 || !strings.HasPrefix(a.IPs[0], "10.213.0.") || !strings.HasSuffix(a.IPs[0], "/24") {
		t.Fatalf("IPs = %v, want one address in 10.213.0.0/24", a.IPs)
	}
	if got := e.podAddrs(); !slices.Equal(got, a.IPs) {
		t.Errorf("eth0 addresses = %v, want %v", got, a.IPs)
	}
	ip := strings.TrimSuffix(a.IPs[0], "/24")
	if got := e.leases(); !slices.Equal(got, []string{ip}) {
		t.Errorf("host-local leases = %v, want [%s]", got, ip)
	}
}

func TestCNIAttachDetach(t *testing.T) {
	e := newCNIEnv(t)
	ctx := testCtx(t)
	a, err := e.attach(ctx, e.conf, "default-vm1")
	if err != nil {
		t.Fatalf("AttachCNI: %v", err)
	}
	checkAttached(t, e, a, "default-vm1")
	if err := e.detach(ctx, a); err != nil {
		t.Fatalf("Detach: %v", err)
	}
	e.checkDetached(a, false)
	if err := e.detach(ctx, a); err != nil {
		t.Fatalf("second Detach: %v", err)
	}
}

// TestCNIPrepareBeforeAdd checks that PrepareCNI gives the attachment
// without changing anything, and that Attach then adds it.
func TestCNIPrepareBeforeAdd(t *testing.T) {
	e := newCNIEnv(t)
	ctx := testCtx(t)
	a, err := PrepareCNI(ctx, e.conf, "default-rec", e.podPath)
	if err != nil {
		t.Fatalf("PrepareCNI: %v", err)
	}
	if leases := e.leases(); len(leases) != 0 || len(a.ConfList) == 0 || len(a.IPs) != 0 {
		t.Fatalf("after PrepareCNI: leases %v, attachment %+v", leases, a)
	}
	if err := runInNS(e.host, func() error { return a.Attach(ctx) }); err != nil {
		t.Fatalf("Attach: %v", err)
	}
	t.Cleanup(func() { _ = e.detach(context.Background(), a) })
	if leases := e.leases(); len(leases) != 1 || len(a.IPs) != 1 {
		t.Errorf("after Attach: leases %v, ips %v, want one", leases, a.IPs)
	}
}

func TestCNIDetachFromRecord(t *testing.T) {
	for _, tc := range []struct {
		name      string
		netnsGone bool
	}{
		{"netns kept", false},
		{"netns gone", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newCNIEnv(t)
			ctx := testCtx(t)
			a, err := e.attach(ctx, e.conf, "default-vm2")
			if err != nil {
				t.Fatalf("AttachCNI: %v", err)
			}
			checkAttached(t, e, a, "default-vm2")
			data, err := json.Marshal(a)
			if err != nil {
				t.Fatal(err)
			}
			var rec CNIAttachment
			if err := json.Unmarshal(data, &rec); err != nil {
				t.Fatalf("unmarshal %s: %v", data, err)
			}
			if tc.netnsGone {
				if err := netns.DeleteNamed(e.podName); err != nil {
					t.Fatal(err)
				}
			}
			if err := e.detach(ctx, &rec); err != nil {
				t.Fatalf("Detach from record: %v", err)
			}
			e.checkDetached(&rec, tc.netnsGone)
			if err := e.detach(ctx, &rec); err != nil {
				t.Fatalf("second Detach from record: %v", err)
			}
		})
	}
}

// writeFailPlugin writes a CNI plugin that fails ADD with code 11 (try
// again later) and succeeds otherwise.
func writeFailPlugin(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	script := `#!/bin/sh
cat >/dev/null
case "$CNI_COMMAND" in
ADD) echo '{"cniVersion": "1.0.0", "code": 11, "msg": "vmshim test failure"}'; exit 1 ;;
VERSION) echo '{"cniVersion": "1.0.0", "supportedVersions": ["1.0.0"]}' ;;
esac
`
	if err := os.WriteFile(filepath.Join(dir, "vmshim-fail"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestCNIAttachFailureUndoes(t *testing.T) {
	e := newCNIEnv(t)
	ctx := testCtx(t)
	c := e.conf
	c.Network = "vmshim-fail"
	c.BinDirs = []string{cniPluginDir, writeFailPlugin(t)}
	writeConf(t, c.ConfDir, "20-fail.conflist", bridgeConflist(c.Network, "vmshimf"+randomHex(t, 3), e.dataDir, "vmshim-fail"))
	a, err := e.attach(ctx, c, "default-vm3")
	if err == nil {
		t.Fatalf("AttachCNI = %+v, want an error", a)
	}
	if !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "vmshim test failure") {
		t.Errorf("AttachCNI error = %v, want the plugin's try-again-later as ErrUnavailable", err)
	}
	if l, err := filepath.Glob(filepath.Join(e.dataDir, c.Network, "10.213.0.*")); err != nil || len(l) != 0 {
		t.Errorf("leases after failed attach = %v, %v; want none", l, err)
	}
	if addrs := e.podAddrs(); addrs != nil {
		t.Errorf("eth0 left in pod netns with %v", addrs)
	}
}

func TestAttachCNIErrors(t *testing.T) {
	confDir := t.TempDir()
	writeConf(t, confDir, "10-missing.conflist", `{"cniVersion": "1.0.0", "name": "noplugin", "plugins": [{"type": "vmshim-no-such-plugin"}]}`)
	writeConf(t, confDir, "00-broken.conflist", `{"name": `)
	binDir := t.TempDir()
	nsPath := filepath.Join(t.TempDir(), "netns") // never entered: every case fails first
	if err := os.WriteFile(nsPath, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	good := CNIConfig{Network: "nope", ConfDir: confDir, BinDirs: []string{binDir}}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name    string
		ctx     context.Context
		mod     func(*CNIConfig)
		id      string
		netns   string
		is      func(error) bool
		wantErr string
	}{
		{name: "network not found", is: errdefs.IsNotFound, wantErr: `cni network "nope" not found in ` + confDir},
		{name: "conf dir missing", mod: func(c *CNIConfig) { c.ConfDir = filepath.Join(confDir, "none") },
			is: errdefs.IsNotFound, wantErr: `cni network "nope" not found in ` + filepath.Join(confDir, "none")},
		{name: "plugin missing", mod: func(c *CNIConfig) { c.Network = "noplugin" },
			is: errdefs.IsNotFound, wantErr: `"vmshim-no-such-plugin" in path [` + binDir + `]`},
		{name: "empty container id", id: "-", is: errdefs.IsInvalidArgument, wantErr: "container id"},
		{name: "bad container id", id: "a/b", is: errdefs.IsInvalidArgument, wantErr: `container id "a/b"`},
		{name: "bad network name", mod: func(c *CNIConfig) { c.Network = "my net" }, is: errdefs.IsInvalidArgument, wantErr: `cni network "my net"`},
		{name: "no bin dirs", mod: func(c *CNIConfig) { c.BinDirs = nil }, is: errdefs.IsInvalidArgument, wantErr: "no plugin directories"},
		{name: "no conf dir", mod: func(c *CNIConfig) { c.ConfDir = "" }, is: errdefs.IsInvalidArgument, wantErr: "no configuration directory"},
		{name: "empty netns", netns: "-", is: errdefs.IsInvalidArgument, wantErr: "netns path is empty"},
		{name: "netns missing", netns: filepath.Join(confDir, "gone"), is: errdefs.IsNotFound, wantErr: "netns " + filepath.Join(confDir, "gone")},
		{name: "cancelled", ctx: cancelled, is: func(err error) bool { return errors.Is(err, context.Canceled) }, wantErr: "context canceled"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := good
			if tc.mod != nil {
				tc.mod(&c)
			}
			ctx := tc.ctx
			if ctx == nil {
				ctx = context.Background()
			}
			id, ns := "default-x", nsPath
			if tc.id == "-" {
				id = ""
			} else if tc.id != "" {
				id = tc.id
			}
			if tc.netns == "-" {
				ns = ""
			} else if tc.netns != "" {
				ns = tc.netns
			}
			a, err := AttachCNI(ctx, c, id, ns)
			if err == nil {
				t.Fatalf("AttachCNI = %+v, want an error", a)
			}
			if !tc.is(err) || !strings.Contains(err.Error(), tc.wantErr) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("AttachCNI error = %q, want one line containing %q of the right class", err, tc.wantErr)
			}
		})
	}
}

func TestFindNetwork(t *testing.T) {
	dir := t.TempDir()
	writeConf(t, dir, "10-list.conflist", `{"cniVersion": "1.0.0", "name": "listed", "plugins": [{"type": "bridge"}, {"type": "portmap"}]}`)
	writeConf(t, dir, "20-single.conf", `{"cniVersion": "0.4.0", "name": "single", "type": "ptp"}`)
	writeConf(t, dir, "30-single.json", `{"cniVersion": "1.0.0", "name": "json", "type": "macvlan"}`)
	writeConf(t, dir, "05-bad.conf", `not json`)
	writeConf(t, dir, "40-first.conflist", `{"cniVersion": "1.0.0", "name": "dup", "plugins": [{"type": "bridge"}]}`)
	writeConf(t, dir, "50-second.conflist", `{"cniVersion": "1.0.0", "name": "dup", "plugins": [{"type": "ptp"}]}`)
	writeConf(t, dir, "60-outside.conflist", `{"cniVersion": "1.0.0", "name": "outside"}`)
	writeConf(t, dir, "outside/10-tuning.conf", `{"type": "tuning"}`)
	writeConf(t, dir, "ignored.txt", `{"cniVersion": "1.0.0", "name": "txt", "type": "ptp"}`)
	for _, tc := range []struct {
		name    string
		want    []string // plugin types
		version string
	}{
		{"listed", []string{"bridge", "portmap"}, "1.0.0"},
		{"single", []string{"ptp"}, "0.4.0"},
		{"json", []string{"macvlan"}, "1.0.0"},
		{"dup", []string{"bridge"}, "1.0.0"},
		{"outside", []string{"tuning"}, "1.0.0"},
		{"txt", nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			list, err := findNetwork(context.Background(), tc.name, dir)
			if tc.want == nil {
				if !errdefs.IsNotFound(err) {
					t.Fatalf("findNetwork = %v, %v; want ErrNotFound", list, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("findNetwork: %v", err)
			}
			// The recorded bytes alone must give back the same network.
			again, err := libcni.ConfListFromBytes(list.Bytes)
			if err != nil {
				t.Fatalf("parse recorded conflist %s: %v", list.Bytes, err)
			}
			var types []string
			for _, p := range again.Plugins {
				types = append(types, p.Network.Type)
			}
			if again.Name != tc.name || again.CNIVersion != tc.version || !slices.Equal(types, tc.want) {
				t.Errorf("recorded conflist %s = name %q version %q plugins %v, want %q %q %v",
					list.Bytes, again.Name, again.CNIVersion, types, tc.name, tc.version, tc.want)
			}
		})
	}
}

func TestDetachRefusesIncompleteRecord(t *testing.T) {
	var nilAttachment *CNIAttachment
	if err := nilAttachment.Detach(context.Background()); err != nil {
		t.Errorf("nil Detach = %v, want nil", err)
	}
	a := &CNIAttachment{Network: "n", ContainerID: "c", IfName: "eth0"}
	if err := a.Detach(context.Background()); !errdefs.IsInvalidArgument(err) {
		t.Errorf("Detach without conflist = %v, want ErrInvalidArgument", err)
	}
	a.ConfList = json.RawMessage(`{"cniVersion": "1.0.0", "name": "n", "plugins": [{"type": "vmshim-no-such-plugin"}]}`)
	a.BinDirs = []string{t.TempDir()}
	if err := a.Detach(context.Background()); !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), "vmshim-no-such-plugin") {
		t.Errorf("Detach with missing plugin = %v, want ErrNotFound naming it", err)
	}
}
