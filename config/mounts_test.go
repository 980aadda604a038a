package config

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// criMounts are the mounts containerd's CRI puts in every container's spec.
func criMounts(dir, file string) []specs.Mount {
	return []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance"}},
		{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"nosuid", "noexec", "nodev", "relatime", "ro"}},
		{Destination: "/etc/hosts", Type: "bind", Source: file, Options: []string{"rbind", "rprivate", "rw"}},
		{Destination: "/dev/termination-log", Type: "bind", Source: file, Options: []string{"rbind", "rprivate", "rw"}},
		{Destination: "/etc/hostname", Type: "bind", Source: file, Options: []string{"rbind", "rprivate", "rw"}},
		{Destination: "/etc/resolv.conf", Type: "bind", Source: file, Options: []string{"rbind", "rprivate", "rw"}},
		{Destination: "/dev/shm", Type: "bind", Source: dir, Options: []string{"rbind", "rprivate", "rw"}},
	}
}

func TestResolveShares(t *testing.T) {
	tmp := t.TempDir()
	mk := func(name string) string {
		p := filepath.Join(tmp, name)
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	data, config, token, cache := mk("data,1"), mk("config"), mk("token"), mk("cache")
	file := filepath.Join(tmp, "app.conf")
	if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(tmp, "link")
	if err := os.Symlink(data, link); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(tmp, "missing")

	tests := []struct {
		name    string
		mounts  []specs.Mount
		want    []Share
		skipped []string // substrings, one per skipped mount
	}{
		{name: "no mounts"},
		{name: "pod plumbing is never shared nor listed", mounts: criMounts(cache, file)},
		{
			name: "kubernetes volumes",
			mounts: append(criMounts(cache, file),
				specs.Mount{Destination: "/data", Type: "bind", Source: data, Options: []string{"rbind", "rprivate", "rw"}},
				specs.Mount{Destination: "/etc/config", Type: "bind", Source: config, Options: []string{"rbind", "rprivate", "ro"}},
				specs.Mount{Destination: ServiceAccountDir, Type: "bind", Source: token, Options: []string{"rbind", "rprivate"}},
				specs.Mount{Destination: "/etc/app.conf", Type: "bind", Source: file, Options: []string{"rbind", "ro"}},
				specs.Mount{Destination: "/scratch", Type: "tmpfs", Source: "tmpfs", Options: []string{"size=64m"}},
			),
			want: []Share{
				{Tag: "vmshim0", HostPath: data, GuestPath: "/data"},
				{Tag: "vmshim1", HostPath: config, GuestPath: "/etc/config", ReadOnly: true},
				{Tag: "vmshim2", HostPath: token, GuestPath: ServiceAccountDir, ReadOnly: true},
			},
			skipped: []string{`"/etc/app.conf": source`, `"/scratch": tmpfs mount, not a bind mount`},
		},
		{
			name: "bind recognised by type or option; last of ro and rw wins",
			mounts: []specs.Mount{
				{Destination: "/a", Type: "none", Source: data, Options: []string{"bind", "ro", "rw"}},
				{Destination: "/b", Source: config, Options: []string{"rbind", "rw", "rro"}},
				{Destination: "/c/", Type: "bind", Source: cache + "/"},
				{Destination: "/d", Type: "bind", Source: link},
			},
			want: []Share{
				{Tag: "vmshim0", HostPath: data, GuestPath: "/a"},
				{Tag: "vmshim1", HostPath: config, GuestPath: "/b", ReadOnly: true},
				{Tag: "vmshim2", HostPath: cache, GuestPath: "/c"},
				{Tag: "vmshim3", HostPath: link, GuestPath: "/d"},
			},
		},
		{
			name: "unusable sources and destinations are listed",
			mounts: []specs.Mount{
				{Destination: "/gone", Type: "bind", Source: missing},
				{Destination: "/rel", Type: "bind", Source: "volumes/data"},
				{Destination: "rel", Type: "bind", Source: data},
				{Destination: "/new\nline", Type: "bind", Source: data},
				{Destination: "/x", Type: "bind", Source: data + "\n"},
				{Destination: "/", Type: "bind", Source: data},
				{Destination: "/with space", Type: "bind", Source: data},
				{Destination: "/overlay", Type: "overlay", Source: "overlay"},
				{Destination: "/untyped", Source: data},
				{Destination: "/hostile", Type: "x\n mount, not", Source: data},
				{Destination: "/ok", Type: "bind", Source: data},
			},
			want: []Share{{Tag: "vmshim0", HostPath: data, GuestPath: "/ok"}},
			skipped: []string{
				`"/gone": source: stat`,
				`"/rel": path "volumes/data" is not absolute`,
				`"rel": path "rel" is not absolute`,
				`"/new\nline": path "/new\nline" has a control character`,
				`"/x": path`,
				`"/": the guest's root`,
				`"/with space": path "/with space" has whitespace or a backslash`,
				`"/overlay": overlay mount, not a bind mount`,
				`"/untyped": untyped mount, not a bind mount`,
				`"/hostile": "x\n mount, not" mount, not a bind mount`,
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, skipped := ResolveShares(&specs.Spec{Mounts: tt.mounts})
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("shares = %+v\nwant %+v", got, tt.want)
			}
			if len(skipped) != len(tt.skipped) {
				t.Fatalf("skipped = %q, want %d entries like %q", skipped, len(tt.skipped), tt.skipped)
			}
			for i, s := range skipped {
				if !strings.HasPrefix(s, tt.skipped[i]) {
					t.Errorf("skipped[%d] = %q, want it to start with %q", i, s, tt.skipped[i])
				}
				if strings.Contains(s, "\n") {
					t.Errorf("skipped[%d] = %q spans lines", i, s)
				}
			}
		})
	}
}

func TestResolveSharesNilSpec(t *testing.T) {
	if shares, skipped := ResolveShares(nil); shares != nil || skipped != nil {
		t.Errorf("ResolveShares(nil) = %v, %v", shares, skipped)
	}
}
