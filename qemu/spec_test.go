package qemu

import (
	"bytes"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
)

func TestValidateDevices(t *testing.T) {
	share := func(f func(*Share)) func(*Spec) {
		return func(s *Spec) {
			sh := Share{ID: "s0", Tag: "vmshim0", Path: "/srv/data"}
			f(&sh)
			s.Shares = append(s.Shares, sh)
		}
	}
	vfio := func(addrs ...string) func(*Spec) {
		return func(s *Spec) { s.VFIO = addrs }
	}
	tests := []struct {
		name   string
		modify func(*Spec)
		field  string // "" = valid
	}{
		{"host device raw", func(s *Spec) {
			s.Drives = []Drive{{ID: "vol", Path: "/dev/sdb", Format: FormatRaw, HostDevice: true}}
		}, ""},
		{"host device qcow2", func(s *Spec) {
			s.Drives = []Drive{{ID: "vol", Path: "/dev/sdb", Format: FormatQCOW2, HostDevice: true}}
		}, `invalid drive "vol" format`},
		{"raw cut to a size", func(s *Spec) {
			s.Drives = []Drive{{ID: "vol", Path: "/dev/sdb", Format: FormatRaw, HostDevice: true, Size: 1 << 20}}
		}, ""},
		{"size not of sectors", func(s *Spec) {
			s.Drives = []Drive{{ID: "vol", Path: "/dev/sdb", Format: FormatRaw, HostDevice: true, Size: 1000}}
		}, `invalid drive "vol" size`},
		{"negative size", func(s *Spec) {
			s.Drives = []Drive{{ID: "vol", Path: "/dev/sdb", Format: FormatRaw, Size: -512}}
		}, `invalid drive "vol" size`},
		{"qcow2 cut to a size", func(s *Spec) {
			s.Drives = []Drive{{ID: "vol", Path: "/a.qcow2", Format: FormatQCOW2, Size: 512}}
		}, `invalid drive "vol" size`},
		{"host device relative", func(s *Spec) {
			s.Drives = []Drive{{ID: "vol", Path: "sdb", Format: FormatRaw, HostDevice: true}}
		}, `invalid drive "vol" path`},
		{"share", share(func(*Share) {}), ""},
		{"share tag of 31 bytes", share(func(sh *Share) { sh.Tag = strings.Repeat("t", 31) }), ""},
		{"share id empty", share(func(sh *Share) { sh.ID = "" }), "invalid share[0] id"},
		{"share id upper case", share(func(sh *Share) { sh.ID = "S0" }), "invalid share[0] id"},
		{"share id comma", share(func(sh *Share) { sh.ID = "a,b" }), "invalid share[0] id"},
		{"share id long", share(func(sh *Share) { sh.ID = strings.Repeat("s", 21) }), "invalid share[0] id"},
		{"duplicate share id", func(s *Spec) {
			share(func(*Share) {})(s)
			share(func(sh *Share) { sh.Tag = "other" })(s)
		}, `invalid share "s0" id`},
		{"share tag empty", share(func(sh *Share) { sh.Tag = "" }), `invalid share "s0" tag`},
		{"share tag comma", share(func(sh *Share) { sh.Tag = "a,fsdev=x" }), `invalid share "s0" tag`},
		{"share tag equals", share(func(sh *Share) { sh.Tag = "a=b" }), `invalid share "s0" tag`},
		{"share tag newline", share(func(sh *Share) { sh.Tag = "a\nb" }), `invalid share "s0" tag`},
		{"share tag upper case", share(func(sh *Share) { sh.Tag = "Data" }), `invalid share "s0" tag`},
		{"share tag of 32 bytes", share(func(sh *Share) { sh.Tag = strings.Repeat("t", 32) }), `invalid share "s0" tag`},
		{"duplicate share tag", func(s *Spec) {
			share(func(*Share) {})(s)
			share(func(sh *Share) { sh.ID = "s1" })(s)
		}, `invalid share "s1" tag`},
		{"share path empty", share(func(sh *Share) { sh.Path = "" }), `invalid share "s0" path`},
		{"share path relative", share(func(sh *Share) { sh.Path = "srv" }), `invalid share "s0" path`},
		{"share path unclean", share(func(sh *Share) { sh.Path = "/srv/../etc" }), `invalid share "s0" path`},
		{"share path trailing slash", share(func(sh *Share) { sh.Path = "/srv/" }), `invalid share "s0" path`},
		{"share path newline", share(func(sh *Share) { sh.Path = "/srv/a\n-device x" }), `invalid share "s0" path`},
		{"share path NUL", share(func(sh *Share) { sh.Path = "/srv/a\x00" }), `invalid share "s0" path`},
		{"vfio", vfio("0000:00:00.0", "ffff:ff:1f.7", "0000:3b:10.2"), ""},
		{"vfio upper case", vfio("0000:3B:00.0"), "invalid vfio[0]"},
		{"vfio no domain", vfio("3b:00.0"), "invalid vfio[0]"},
		{"vfio short domain", vfio("000:3b:00.0"), "invalid vfio[0]"},
		{"vfio device above 1f", vfio("0000:00:20.0"), "invalid vfio[0]"},
		{"vfio function above 7", vfio("0000:00:00.8"), "invalid vfio[0]"},
		{"vfio not hex", vfio("0000:0g:00.0"), "invalid vfio[0]"},
		{"vfio wrong separators", vfio("0000.00:00:0"), "invalid vfio[0]"},
		{"vfio option injection", vfio("0000:00:00.0,romfile=/etc/shadow"), "invalid vfio[0]"},
		{"vfio newline", vfio("0000:00:00.0\n"), "invalid vfio[0]"},
		{"vfio sign", vfio("+000:00:00.0"), "invalid vfio[0]"},
		{"vfio empty", vfio(""), "invalid vfio[0]"},
		{"vfio duplicate", vfio("0000:01:00.0", "0000:01:00.0"), "invalid vfio[1]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := baseSpec()
			tt.modify(&s)
			err := s.Validate()
			if tt.field == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			checkInvalid(t, err, tt.field)
		})
	}
}

// TestDevicesAcceptedByQEMU launches the real binary, paused and sandboxed,
// with 9p shares (one read-only, one with a comma in its path), a read-only
// raw seed and a host device drive, and checks through QMP that QEMU made
// every device and node.
func TestDevicesAcceptedByQEMU(t *testing.T) {
	bin := qemuBinary(t)
	dir := t.TempDir()
	rw := filepath.Join(dir, "data,readonly=on")
	ro := filepath.Join(dir, "secrets")
	seed := filepath.Join(dir, "seed.img")
	for _, d := range []string{rw, ro} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(seed, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	spec := testSpec(dir)
	spec.Sandbox, spec.Paused = true, true
	spec.Drives = []Drive{
		{ID: "seed", Path: seed, Format: FormatRaw, ReadOnly: true, Serial: "cidata"},
		// /dev/null is a character device, which host_device accepts.
		{ID: "hd", Path: "/dev/null", Format: FormatRaw, ReadOnly: true, HostDevice: true},
	}
	spec.Shares = []Share{
		{ID: "rw", Tag: "vmshim0", Path: rw},
		{ID: "ro", Tag: "vmshim1", Path: ro, ReadOnly: true},
	}
	ctx := testCtx(t, 20*time.Second)
	var stderr bytes.Buffer
	v, err := Launch(ctx, LaunchConfig{Binary: bin, Spec: spec, Stderr: &stderr})
	if err != nil {
		t.Fatal(err)
	}
	defer waitDone(t, v)
	defer v.Kill()

	var props []struct {
		Name string `json:"name"`
		Type string `json:"type"`
	}
	if err := v.QMP().Execute(ctx, "qom-list", map[string]string{"path": "/machine/peripheral"}, &props); err != nil {
		t.Fatalf("qom-list: %v; stderr: %s", err, stderr.String())
	}
	var got []string
	for _, p := range props {
		if strings.HasPrefix(p.Type, "child<") {
			got = append(got, p.Name+" "+p.Type)
		}
	}
	sort.Strings(got)
	want := []string{
		"dev-hd child<virtio-blk-pci>",
		"dev-seed child<virtio-blk-pci>",
		"share-ro child<virtio-9p-pci>",
		"share-rw child<virtio-9p-pci>",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("peripherals = %q, want %q", got, want)
	}

	var nodes []struct {
		NodeName string `json:"node-name"`
		Driver   string `json:"drv"`
		ReadOnly bool   `json:"ro"`
	}
	if err := v.QMP().Execute(ctx, "query-named-block-nodes", nil, &nodes); err != nil {
		t.Fatal(err)
	}
	drivers := map[string]string{}
	for _, n := range nodes {
		if !n.ReadOnly {
			t.Errorf("node %s is writable", n.NodeName)
		}
		drivers[n.NodeName] = n.Driver
	}
	for node, drv := range map[string]string{"file-hd": "host_device", "disk-hd": "raw", "file-seed": "file", "disk-seed": "raw"} {
		if drivers[node] != drv {
			t.Errorf("node %s driver = %q, want %q (nodes %v)", node, drivers[node], drv, drivers)
		}
	}
}
