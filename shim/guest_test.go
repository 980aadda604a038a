package shim

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/vmshim/vmshim/config"
	"github.com/vmshim/vmshim/image"
	"github.com/vmshim/vmshim/network"
	"github.com/vmshim/vmshim/qemu"
)

func TestInstanceID(t *testing.T) {
	for _, tc := range []struct {
		ann  map[string]string
		want string
	}{
		{map[string]string{sandboxUIDAnnotation: "uid-1", sandboxIDAnnotation: "sb"}, "vmshim-uid-1"},
		{map[string]string{sandboxIDAnnotation: "sb"}, "vmshim-sb"},
		{nil, "vmshim-default-vm1"},
	} {
		if got := instanceID("default", "vm1", &specs.Spec{Annotations: tc.ann}); got != tc.want {
			t.Errorf("instanceID(%v) = %q, want %q", tc.ann, got, tc.want)
		}
	}
}

func TestSeedDrive(t *testing.T) {
	bundle, rootfs := t.TempDir(), t.TempDir()
	rec := &record{ID: "vm1", Bundle: bundle}
	spec := &specs.Spec{Hostname: "pod-a", Annotations: map[string]string{sandboxUIDAnnotation: "u1"}}
	desc := &config.VM{ID: "vm1", Env: []string{"PATH=/usr/bin", "GREETING=hi", "HOME=/root"}, SSHAuthorizedKeys: nil}
	mac, _ := net.ParseMAC("52:54:00:12:34:56")
	drive, err := seedDrive("k8s.io", spec, desc, rec, rootfs,
		[]image.CloudMount{{Tag: "vmshim0", Path: "/data", ReadOnly: true}}, []network.NIC{{Name: "eth0", MAC: mac}})
	if err != nil {
		t.Fatal(err)
	}
	want := qemu.Drive{ID: "seed", Path: filepath.Join(rootfs, overlayDir, "seed.iso"), Format: "raw", ReadOnly: true, Driver: config.DiskDriverVirtioBlk}
	if drive != want {
		t.Fatalf("drive %+v, want %+v", drive, want)
	}
	saved, err := readRecord(bundle)
	if err != nil || saved.Seed != want.Path {
		t.Fatalf("record names seed %q (%v), want %q", saved.Seed, err, want.Path)
	}
	iso, err := os.ReadFile(want.Path)
	if err != nil {
		t.Fatal(err)
	}
	// The seed's files are stored uncompressed; look for what they say.
	for _, s := range []string{"vmshim-u1", "pod-a", "52:54:00:12:34:56", "GREETING", "vmshim0"} {
		if !strings.Contains(string(iso), s) {
			t.Errorf("seed lacks %q", s)
		}
	}
	for _, s := range []string{"PATH=", "HOME="} {
		if strings.Contains(string(iso), s) {
			t.Errorf("seed holds the container's %s", s)
		}
	}
	rec.release(t.Context())
	if _, err := os.Stat(want.Path); !os.IsNotExist(err) {
		t.Errorf("release left the seed: %v", err)
	}
}
