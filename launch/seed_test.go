package launch

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/vmshim/vmshim/cloudinit"
	"github.com/vmshim/vmshim/config"
	"github.com/vmshim/vmshim/network"
)

func TestInstanceID(t *testing.T) {
	for _, tc := range []struct {
		ann  map[string]string
		want string
	}{
		{map[string]string{config.AnnotationSandboxUID: "uid-1", config.AnnotationSandboxID: "sb"}, "vmshim-uid-1"},
		{map[string]string{config.AnnotationSandboxID: "sb"}, "vmshim-sb"},
		{nil, "vmshim-default-vm1"},
	} {
		if got := instanceID("default", "vm1", &specs.Spec{Annotations: tc.ann}); got != tc.want {
			t.Errorf("instanceID(%v) = %q, want %q", tc.ann, got, tc.want)
		}
	}
}

func TestCloudInitFiles(t *testing.T) {
	spec := &specs.Spec{Hostname: "pod-a", Annotations: map[string]string{config.AnnotationSandboxUID: "u1"}}
	desc := &config.VM{ID: "vm1", Env: []string{"PATH=/usr/bin", "GREETING=hi", "HOME=/root"}, SSHAuthorizedKeys: nil}
	mac, _ := net.ParseMAC("52:54:00:12:34:56")
	files, err := cloudInitFiles("k8s.io", spec, "pod-a", desc,
		[]cloudinit.Mount{{Tag: "vmshim0", Path: "/data", ReadOnly: true}}, []network.NIC{{Name: "eth0", MAC: mac}})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{cloudinit.SeedMetaData, cloudinit.SeedUserData} {
		if _, ok := files[name]; !ok {
			t.Errorf("seed lacks %s", name)
		}
	}
	var all strings.Builder
	for _, data := range files {
		all.Write(data)
	}
	for _, s := range []string{"vmshim-u1", "pod-a", "52:54:00:12:34:56", "GREETING", "vmshim0"} {
		if !strings.Contains(all.String(), s) {
			t.Errorf("seed lacks %q", s)
		}
	}
	for _, s := range []string{"PATH=", "HOME="} {
		if strings.Contains(all.String(), s) {
			t.Errorf("seed holds the container's %s", s)
		}
	}
}

// TestHostnameFile: a CRI container's /etc/hostname is read only when it
// is a small regular file; a fifo (which would hang the create), a device
// node, a directory or a huge sparse file fails in one line naming it.
func TestHostnameFile(t *testing.T) {
	dir := t.TempDir()
	file := func(name string, make func(p string) error) string {
		p := filepath.Join(dir, name)
		if err := make(p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	spec := func(src string) *specs.Spec {
		return &specs.Spec{Mounts: []specs.Mount{{Destination: "/etc/hostname", Source: src, Type: "bind"}}}
	}
	good := file("good", func(p string) error { return os.WriteFile(p, []byte("vm-pod\n"), 0o644) })
	if h, err := hostname(spec(good)); err != nil || h != "vm-pod" {
		t.Errorf("hostname = %q, %v", h, err)
	}
	if h, err := hostname(spec(filepath.Join(dir, "missing"))); err != nil || h != "" {
		t.Errorf("missing file: %q, %v", h, err)
	}
	if h, err := hostname(&specs.Spec{Hostname: "spec", Mounts: spec(good).Mounts}); err != nil || h != "spec" {
		t.Errorf("the spec's host name: %q, %v", h, err)
	}
	bad := map[string]string{
		"fifo":      file("fifo", func(p string) error { return unix.Mkfifo(p, 0o644) }),
		"directory": file("dir", func(p string) error { return os.Mkdir(p, 0o755) }),
		"symlink":   file("link", func(p string) error { return os.Symlink(good, p) }),
		"more than 4096 bytes": file("huge", func(p string) error {
			if err := os.WriteFile(p, nil, 0o644); err != nil {
				return err
			}
			return os.Truncate(p, 4<<30)
		}),
	}
	if os.Geteuid() == 0 {
		bad["character device"] = file("null", func(p string) error { return unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))) })
	}
	for kind, p := range bad {
		_, err := hostname(spec(p))
		if err == nil || !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), kind) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %v, want one line naming %s and what it is", kind, err, p)
		}
	}
}
