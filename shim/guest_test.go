package shim

import (
	"net"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/vmshim/vmshim/cloudinit"
	"github.com/vmshim/vmshim/config"
	"github.com/vmshim/vmshim/network"
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

func TestCloudInitFiles(t *testing.T) {
	spec := &specs.Spec{Hostname: "pod-a", Annotations: map[string]string{sandboxUIDAnnotation: "u1"}}
	desc := &config.VM{ID: "vm1", Env: []string{"PATH=/usr/bin", "GREETING=hi", "HOME=/root"}, SSHAuthorizedKeys: nil}
	mac, _ := net.ParseMAC("52:54:00:12:34:56")
	files, err := cloudInitFiles("k8s.io", spec, desc,
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
