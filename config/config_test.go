package config

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

func writeConfig(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDefaultIsValid(t *testing.T) {
	d := Default()
	if err := d.Validate(); err != nil {
		t.Fatalf("Default().Validate() = %v", err)
	}
	want := Config{
		QEMUBinary: "qemu-system-x86_64", QEMUImg: "qemu-img", SWTPM: "swtpm", RuncShim: "containerd-shim-runc-v2", Accel: "auto",
		DefaultVCPUs: 1, DefaultMemory: "512Mi", MaxVCPUs: 16, MaxMemory: "16Gi", MemoryOverhead: "128Mi",
		MaxDiskSize: "256Gi", DiskDriver: "virtio-blk", KernelCmdline: "console=ttyS0 no_timer_check",
		Sandbox: true, BootTimeout: "60s", BootSlotHold: "30s",
		CNIConfDir: "/etc/cni/net.d", CNIBinDirs: []string{"/opt/cni/bin", "/usr/lib/cni"},
		Jail: true, JailIDs: "1879048192-1879113727",
		CacheDir: "/var/lib/vmshim/disks", CacheMaxSize: "50Gi",
		MaxDownloadSize: "10Gi", MaxDecompressionRatio: 100, DownloadTimeout: "1h",
		URLDisks: true, URLDenyCIDRs: []string{"169.254.0.0/16", "fe80::/10", "fd00:ec2::254/128", "fd00:ec2::23/128", "fd20:ce::254/128",
			"100.100.100.200/32", "168.63.129.16/32", "192.0.0.192/32", "64:ff9b::a9fe:0/112", "2002:a9fe::/32"},
		UEFICode: "/usr/share/OVMF/OVMF_CODE_4M.fd", UEFIVars: "/usr/share/OVMF/OVMF_VARS_4M.fd",
		UEFISecureCode: "/usr/share/OVMF/OVMF_CODE_4M.secboot.fd", UEFISecureVars: "/usr/share/OVMF/OVMF_VARS_4M.ms.fd",
		Mesh: "refuse", OnStop: "poweroff", OnResumeError: "refuse", Balloon: true, BalloonStatsInterval: "10s", MemMerge: true,
	}
	if !reflect.DeepEqual(d, want) {
		t.Fatalf("Default() = %+v, want %+v", d, want)
	}
	d.CNIBinDirs[0] = "/changed"
	if got := Default().CNIBinDirs[0]; got != "/opt/cni/bin" {
		t.Fatalf("changing one Default() changed the next: cni_bin_dirs[0] = %q", got)
	}
}

func TestLoad(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		want    func(*Config) // applied to Default()
		wantErr string        // substring; "" = success
	}{
		{name: "empty file", body: "", want: func(*Config) {}},
		{
			name: "overrides",
			body: `qemu_binary = "/usr/bin/qemu-system-x86_64"
qemu_img = "/usr/bin/qemu-img"
swtpm = "/usr/bin/swtpm"
accel = "tcg"
default_vcpus = 2
default_memory = "1Gi"
max_vcpus = 4
max_memory = "2Gi"
memory_overhead = "256Mi"
max_disk_size = "20Gi"
disk_driver = "nvme"
kernel_cmdline = "console=ttyS0 quiet"
sandbox = false
boot_timeout = "2m"
boot_slots = 3
boot_slot_hold = "45s"
cni_network = "vm-net_1.0"
cni_conf_dir = "/srv/cni/conf"
cni_bin_dirs = ["/srv/cni/bin"]
cache_dir = "/srv/disks"
cache_max_size = "5Gi"
max_download_size = "2Gi"
max_decompression_ratio = 20
download_timeout = "10m"
ca_file = "/etc/vmshim/ca.pem"
uefi_code = "/srv/ovmf/code.fd"
uefi_vars = "/srv/ovmf/vars.fd"
uefi_secure_code = "/srv/ovmf/code.secboot.fd"
uefi_secure_vars = "/srv/ovmf/vars.ms.fd"
mesh = "bypass"
on_stop = "suspend"
on_resume_error = "boot"
balloon = false
balloon_stats_interval = "0"
mem_merge = false
tpm = "2.0"
`,
			want: func(c *Config) {
				*c = Config{
					QEMUBinary: "/usr/bin/qemu-system-x86_64", QEMUImg: "/usr/bin/qemu-img", SWTPM: "/usr/bin/swtpm", RuncShim: "containerd-shim-runc-v2", Accel: "tcg", TPM: "2.0",
					DefaultVCPUs: 2, DefaultMemory: "1Gi", MaxVCPUs: 4, MaxMemory: "2Gi", MemoryOverhead: "256Mi",
					MaxDiskSize: "20Gi", DiskDriver: "nvme", KernelCmdline: "console=ttyS0 quiet",
					Sandbox: false, BootTimeout: "2m", BootSlots: 3, BootSlotHold: "45s",
					CNINetwork: "vm-net_1.0", CNIConfDir: "/srv/cni/conf", CNIBinDirs: []string{"/srv/cni/bin"},
					Jail: true, JailIDs: DefaultJailIDs,
					CacheDir: "/srv/disks", CacheMaxSize: "5Gi", CAFile: "/etc/vmshim/ca.pem",
					MaxDownloadSize: "2Gi", MaxDecompressionRatio: 20, DownloadTimeout: "10m",
					URLDisks: true, URLDenyCIDRs: Default().URLDenyCIDRs,
					UEFICode: "/srv/ovmf/code.fd", UEFIVars: "/srv/ovmf/vars.fd",
					UEFISecureCode: "/srv/ovmf/code.secboot.fd", UEFISecureVars: "/srv/ovmf/vars.ms.fd",
					Mesh: "bypass", OnStop: "suspend", OnResumeError: "boot", BalloonStatsInterval: "0",
				}
			},
		},
		{name: "cni network only", body: `cni_network = "vmnet"`, want: func(c *Config) { c.CNINetwork = "vmnet" }},
		{
			name: "cni bin dirs replace the defaults",
			body: `cni_bin_dirs = ["/a", "/b", "/c"]`,
			want: func(c *Config) { c.CNIBinDirs = []string{"/a", "/b", "/c"} },
		},
		{name: "partial override keeps defaults", body: "accel = \"kvm\"\n", want: func(c *Config) { c.Accel = "kvm" }},
		{name: "bad memory overhead", body: "memory_overhead = \"lots\"\n", wantErr: `memory_overhead: `},
		{name: "unknown key", body: "accel = \"tcg\"\nfoo = 1\n", wantErr: `unknown key "foo"`},
		{name: "unknown keys", body: "foo = 1\nbar = 2\n", wantErr: `unknown keys "bar", "foo"`},
		{name: "unknown table", body: "[extra]\nx = 1\n", wantErr: `unknown key "extra"`},
		{name: "syntax error", body: "accel = \n", wantErr: "toml: line 1"},
		{name: "wrong type", body: "default_vcpus = \"two\"\n", wantErr: "default_vcpus"},
		{name: "bad accel", body: `accel = "hvf"`, wantErr: `accel: "hvf" is not one of auto, kvm, tcg`},
		{name: "zero vcpus", body: `default_vcpus = 0`, wantErr: "default_vcpus: 0 is not in 1..16"},
		{name: "default above max vcpus", body: "default_vcpus = 8\nmax_vcpus = 4", wantErr: "default_vcpus: 8 is not in 1..4"},
		{name: "bad max vcpus", body: `max_vcpus = 0`, wantErr: "max_vcpus: 0 is not in 1..288"},
		{name: "bad default memory", body: `default_memory = "lots"`, wantErr: `default_memory: "lots" is not a quantity`},
		{name: "small default memory", body: `default_memory = "32Mi"`, wantErr: `default_memory: "32Mi" is not in 64Mi..16Gi`},
		{name: "default memory above max", body: `default_memory = "32Gi"`, wantErr: `default_memory: "32Gi" is not in 64Mi..16Gi`},
		{name: "negative max memory", body: `max_memory = "-1Gi"`, wantErr: `max_memory: "-1Gi" is negative`},
		{name: "small max memory", body: `max_memory = "1Mi"`, wantErr: `max_memory: "1Mi" is less than 64Mi`},
		{name: "huge max disk", body: `max_disk_size = "100Ei"`, wantErr: `max_disk_size: "100Ei" is too large`},
		{name: "huge max memory", body: `max_memory = "1e30"`, wantErr: `max_memory: "1e30" is too large`},
		{name: "zero max disk", body: `max_disk_size = "0"`, wantErr: `max_disk_size: "0" must be greater than zero`},
		{name: "bad disk driver", body: `disk_driver = "floppy"`, wantErr: `disk_driver: "floppy" is not one of`},
		{name: "cmdline newline", body: `kernel_cmdline = "a\nb"`, wantErr: "kernel_cmdline: contains a newline"},
		{name: "cmdline long", body: `kernel_cmdline = "` + strings.Repeat("a", 5000) + `"`, wantErr: "kernel_cmdline: 5000 bytes"},
		{name: "bad duration", body: `boot_timeout = "soon"`, wantErr: `boot_timeout: "soon" is not a duration`},
		{name: "zero duration", body: `boot_timeout = "0s"`, wantErr: `boot_timeout: "0s" must be greater than zero`},
		{name: "boot slots negative", body: `boot_slots = -2`, wantErr: `boot_slots: -2 is not -1 (no pacing), 0 (auto) or a count up to 1024`},
		{name: "boot slots many", body: `boot_slots = 1025`, wantErr: `boot_slots: 1025 is not`},
		{name: "boot slot hold bad", body: `boot_slot_hold = "a while"`, wantErr: `boot_slot_hold: "a while" is not a duration`},
		{name: "boot slot hold zero", body: `boot_slot_hold = "0s"`, wantErr: `boot_slot_hold: "0s" is not greater than zero and at most 10m0s`},
		{name: "boot slot hold long", body: `boot_slot_hold = "11m"`, wantErr: `boot_slot_hold: "11m" is not greater than zero`},
		{name: "empty qemu", body: `qemu_binary = ""`, wantErr: "qemu_binary: must not be empty"},
		{name: "relative qemu-img", body: `qemu_img = "bin/qemu-img"`, wantErr: `qemu_img: "bin/qemu-img" must be a command name or an absolute path`},
		{name: "cni network bad start", body: `cni_network = "-net"`, wantErr: `cni_network: "-net" is not a CNI network name`},
		{name: "cni network bad char", body: `cni_network = "my net"`, wantErr: `cni_network: "my net" is not a CNI network name`},
		{name: "cni network slash", body: `cni_network = "a/b"`, wantErr: `cni_network: "a/b" is not a CNI network name`},
		{name: "cni network wrong type", body: `cni_network = 1`, wantErr: "cni_network"},
		{name: "relative cni conf dir", body: `cni_conf_dir = "etc/cni"`, wantErr: `cni_conf_dir: "etc/cni" must be an absolute path`},
		{name: "empty cni conf dir", body: `cni_conf_dir = ""`, wantErr: `cni_conf_dir: "" must be an absolute path`},
		{name: "cni conf dir newline", body: `cni_conf_dir = "/etc/\ncni"`, wantErr: `cni_conf_dir: "/etc/\ncni" contains a newline or NUL`},
		{name: "relative cni bin dir", body: `cni_bin_dirs = ["/opt/cni/bin", "lib/cni"]`, wantErr: `cni_bin_dirs: "lib/cni" must be an absolute path`},
		{name: "empty cni bin dir", body: `cni_bin_dirs = [""]`, wantErr: `cni_bin_dirs: "" must be an absolute path`},
		{name: "no cni bin dirs", body: `cni_bin_dirs = []`, wantErr: "cni_bin_dirs: must list at least one directory"},
		{name: "cni bin dirs not a list", body: `cni_bin_dirs = "/opt/cni/bin"`, wantErr: "cni_bin_dirs"},
		{name: "qemu user empty", body: `qemu_user = ""`, want: func(*Config) {}},
		{name: "qemu user", body: `qemu_user = "root"`, wantErr: `qemu_user: no longer supported: each VM's QEMU runs as an id of its own from jail_ids`},
		{name: "jail off", body: `jail = false`, want: func(c *Config) { c.Jail = false }},
		{name: "jail ids", body: `jail_ids = "100000-165535"`, want: func(c *Config) { c.JailIDs = "100000-165535" }},
		{name: "jail ids with root", body: `jail_ids = "0-100"`, wantErr: `jail_ids: "0-100": want 0 < FIRST <= LAST`},
		{name: "jail ids with nobody", body: `jail_ids = "60000-70000"`, wantErr: `jail_ids: "60000-70000" holds 65534`},
		{name: "jail ids not a range", body: `jail_ids = "1000"`, wantErr: `jail_ids: "1000" is not a range`},
		{name: "privileged devices", body: `privileged_devices = true`, want: func(c *Config) { c.PrivilegedDevices = true }},
		{name: "no cache cap", body: `cache_max_size = "0"`, want: func(c *Config) { c.CacheMaxSize = "0" }},
		{name: "relative cache dir", body: `cache_dir = "disks"`, wantErr: `cache_dir: "disks" must be an absolute path`},
		{name: "bad cache size", body: `cache_max_size = "lots"`, wantErr: `cache_max_size:`},
		{name: "no download cap", body: `max_download_size = "0"`, want: func(c *Config) { c.MaxDownloadSize = "0" }},
		{name: "bad download size", body: `max_download_size = "-1"`, wantErr: `max_download_size: "-1" is negative`},
		{name: "no ratio", body: `max_decompression_ratio = 0`, want: func(c *Config) { c.MaxDecompressionRatio = 0 }},
		{name: "negative ratio", body: `max_decompression_ratio = -5`, wantErr: `max_decompression_ratio: -5 is negative`},
		{name: "no download timeout", body: `download_timeout = "0"`, want: func(c *Config) { c.DownloadTimeout = "0" }},
		{name: "bad download timeout", body: `download_timeout = "soon"`, wantErr: `download_timeout: "soon" is not a duration`},
		{name: "negative download timeout", body: `download_timeout = "-1s"`, wantErr: `download_timeout: "-1s" is negative`},
		{name: "relative uefi code", body: `uefi_code = "OVMF_CODE.fd"`, wantErr: `uefi_code: "OVMF_CODE.fd" must be an absolute path`},
		{name: "relative ca file", body: `ca_file = "ca.pem"`, wantErr: `ca_file: "ca.pem" must be an absolute path`},
		{name: "url disks off", body: `url_disks = false`, want: func(c *Config) { c.URLDisks = false }},
		{name: "url deny list", body: `url_deny_cidrs = ["169.254.169.254", "10.0.0.0/8"]`, want: func(c *Config) { c.URLDenyCIDRs = []string{"169.254.169.254", "10.0.0.0/8"} }},
		{name: "empty url deny list", body: `url_deny_cidrs = []`, want: func(c *Config) { c.URLDenyCIDRs = []string{} }},
		{name: "bad url deny list", body: `url_deny_cidrs = ["10.0.0.0/8", "metadata"]`, wantErr: `url_deny_cidrs: "metadata" is neither a CIDR nor an address`},
		{name: "qemu user wrong type", body: `qemu_user = 0`, wantErr: "qemu_user"},
		{name: "balloon statistics every minute", body: `balloon_stats_interval = "1m"`, want: func(c *Config) { c.BalloonStatsInterval = "1m" }},
		{name: "balloon statistics too often", body: `balloon_stats_interval = "500ms"`,
			wantErr: `balloon_stats_interval: "500ms" is not 0 or a whole number of seconds from 1s to 1h`},
		{name: "balloon statistics in part seconds", body: `balloon_stats_interval = "1.5s"`, wantErr: `balloon_stats_interval: "1.5s" is not 0 or`},
		{name: "balloon statistics too seldom", body: `balloon_stats_interval = "2h"`, wantErr: `balloon_stats_interval: "2h" is not 0 or`},
		{name: "balloon statistics not a duration", body: `balloon_stats_interval = "often"`, wantErr: `balloon_stats_interval: "often" is not a duration`},
		{name: "several problems", body: "accel = \"x\"\ndisk_driver = \"y\"", wantErr: `accel: "x" is not one of auto, kvm, tcg; disk_driver: "y"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := writeConfig(t, tc.body)
			got, err := Load(p)
			if tc.wantErr != "" {
				if err == nil {
					t.Fatalf("Load() = %+v, want error containing %q", got, tc.wantErr)
				}
				if !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Load() error = %q, want it to contain %q", err, tc.wantErr)
				}
				if !strings.HasPrefix(err.Error(), "config "+p+": ") {
					t.Errorf("Load() error = %q, want it to name the file", err)
				}
				if strings.Contains(err.Error(), "\n") {
					t.Errorf("Load() error is not one line: %q", err)
				}
				if !errdefs.IsInvalidArgument(err) {
					t.Errorf("Load() error %q is not ErrInvalidArgument", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Load() error = %v", err)
			}
			want := Default()
			tc.want(&want)
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("Load() = %+v, want %+v", got, want)
			}
		})
	}
}

func TestLoadMissing(t *testing.T) {
	p := filepath.Join(t.TempDir(), "nope.toml")
	_, err := Load(p)
	if err == nil || !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), p) {
		t.Fatalf("Load(missing) error = %v, want not-found naming %s", err, p)
	}
	if _, err := os.Stat(DefaultPath); errors.Is(err, os.ErrNotExist) {
		got, err := Load(DefaultPath)
		if err != nil || !reflect.DeepEqual(got, Default()) {
			t.Fatalf("Load(DefaultPath) = %+v, %v; want Default()", got, err)
		}
	}
}

func TestLoadUnreadable(t *testing.T) {
	dir := t.TempDir()
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), dir) {
		t.Fatalf("Load(directory) error = %v, want an error naming %s", err, dir)
	}
}

func TestPathFrom(t *testing.T) {
	tests := []struct {
		name, explicit, env, want string
	}{
		{name: "default", want: DefaultPath},
		{name: "env", env: "/env/config.toml", want: "/env/config.toml"},
		{name: "explicit beats env", explicit: "/opt/config.toml", env: "/env/config.toml", want: "/opt/config.toml"},
		{name: "explicit", explicit: "/opt/config.toml", want: "/opt/config.toml"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(EnvPath, tc.env)
			if got := PathFrom(tc.explicit); got != tc.want {
				t.Fatalf("PathFrom(%q) with %s=%q = %q, want %q", tc.explicit, EnvPath, tc.env, got, tc.want)
			}
		})
	}
}

func TestValidatePrefix(t *testing.T) {
	c := Default()
	c.Accel = "fast"
	err := c.Validate()
	if err == nil || err.Error() != `config: accel: "fast" is not one of auto, kvm, tcg` || !errdefs.IsInvalidArgument(err) {
		t.Fatalf("Validate() = %v", err)
	}
}
