package cloudinit

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"io"
	"mime"
	"mime/multipart"
	"net/mail"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/containerd/errdefs"
	"sigs.k8s.io/yaml"
)

const (
	key1 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl alice@example"
	key2 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBx5jT4aT5oK9TqX4sm0b2HtGxnsn5v8z6p8sYc1S2ah bob"
	mac0 = "52:54:00:12:34:56"
	// hostile is a value that breaks naive YAML, shell and env-file quoting.
	hostile = "it's \"$(rm -rf /)\" `id` \\n $HOME\nsecond: line # no comment\n- not a list"
)

// userMIME is a multipart user-data message as `cloud-init devel make-mime` writes it.
const userMIME = "Content-Type: multipart/mixed; boundary=\"===BOUNDARY==\"\nMIME-Version: 1.0\n\n" +
	"--===BOUNDARY==\nContent-Type: text/x-shellscript; charset=\"us-ascii\"\nMIME-Version: 1.0\n\n#!/bin/sh\necho from-mime\n\n--===BOUNDARY==--\n"

// shimEnvFiles are the write_files entries the shim adds for env.
func shimEnvFiles(envFile, profile string) []any {
	return []any{
		map[string]any{"path": "/etc/vmshim/env", "content": envFile, "permissions": "0644", "owner": "root:root"},
		map[string]any{"path": "/etc/profile.d/vmshim-env.sh", "content": "# The container's environment, written by vmshim.\n" + profile, "permissions": "0644", "owner": "root:root"},
	}
}

func TestCloudInitFiles(t *testing.T) {
	tests := []struct {
		name        string
		ci          Documents
		wantMeta    map[string]any
		wantNetwork any         // parsed network-config; nil = no file
		wantNetRaw  string      // exact network-config, when set
		wantUser    any         // parsed shim/merged cloud-config (for MIME: the first part)
		wantRaw     string      // exact user-data, when set (verbatim cases)
		wantSecond  string      // MIME: the second part's raw content ("" = not MIME)
		wantSecondT string      // MIME: the second part's Content-Type
		wantLeaves  [][2]string // MIME: the user's leaf parts as Python's email parser sees them
	}{
		{
			name:     "instance id only",
			ci:       Documents{InstanceID: "i-1"},
			wantMeta: map[string]any{"instance-id": "i-1"},
			wantUser: map[string]any{},
			wantRaw:  "#cloud-config\n{}\n",
		},
		{
			name:     "hostname and nics",
			ci:       Documents{InstanceID: "i-1", Hostname: "vm1", MACs: []string{mac0, "52:54:00:AB:CD:EF"}},
			wantMeta: map[string]any{"instance-id": "i-1", "local-hostname": "vm1"},
			wantNetwork: map[string]any{"version": 2.0, "ethernets": map[string]any{
				"nic0": map[string]any{"dhcp4": true, "match": map[string]any{"macaddress": mac0}},
				"nic1": map[string]any{"dhcp4": true, "match": map[string]any{"macaddress": "52:54:00:ab:cd:ef"}},
			}},
			wantUser: map[string]any{},
		},
		{
			name: "dual-stack and ipv6-only nics",
			ci: Documents{InstanceID: "i-1", MACs: []string{mac0, "52:54:00:AB:CD:EF", "52:54:00:00:00:03"},
				IPv6: []string{mac0, "52:54:00:ab:cd:ef"}, NoIPv4: []string{"52:54:00:AB:CD:EF"}},
			wantMeta: map[string]any{"instance-id": "i-1"},
			wantNetwork: map[string]any{"version": 2.0, "ethernets": map[string]any{
				"nic0": map[string]any{"dhcp4": true, "dhcp6": true, "accept-ra": true, "match": map[string]any{"macaddress": mac0}},
				"nic1": map[string]any{"dhcp4": false, "dhcp6": true, "accept-ra": true, "match": map[string]any{"macaddress": "52:54:00:ab:cd:ef"}},
				"nic2": map[string]any{"dhcp4": true, "match": map[string]any{"macaddress": "52:54:00:00:00:03"}},
			}},
			wantUser: map[string]any{},
		},
		{
			name:        "user network-config wins",
			ci:          Documents{InstanceID: "i-1", MACs: []string{mac0}, NetworkConfig: "version: 1\nconfig: []\n"},
			wantMeta:    map[string]any{"instance-id": "i-1"},
			wantNetwork: map[string]any{"version": 1.0, "config": []any{}},
			wantNetRaw:  "version: 1\nconfig: []\n",
			wantUser:    map[string]any{},
		},
		{
			name: "keys, env and mounts",
			ci: Documents{InstanceID: "i-1", SSHKeys: []string{key1, key2},
				Env:    []string{"PATH=/usr/bin:/bin", "EMPTY=", "SPACED=a b", "bad-name=x", "1X=y", "NOEQUALS", "NUL=a\x00b", "_ok=1"},
				Mounts: []Mount{{Tag: "vol-0", Path: "/data/config", ReadOnly: true}, {Tag: "vol_1", Path: "/data/scratch"}}},
			wantMeta: map[string]any{"instance-id": "i-1"},
			wantUser: map[string]any{
				"ssh_authorized_keys": []any{key1, key2},
				"write_files": shimEnvFiles("PATH=/usr/bin:/bin\nEMPTY=\"\"\nSPACED=\"a b\"\n_ok=1\n",
					"export PATH='/usr/bin:/bin'\nexport EMPTY=''\nexport SPACED='a b'\nexport _ok='1'\n"),
				"mounts": []any{
					[]any{"vol-0", "/data/config", "9p", "trans=virtio,version=9p2000.L,msize=262144,nofail,ro", "0", "0"},
					[]any{"vol_1", "/data/scratch", "9p", "trans=virtio,version=9p2000.L,msize=262144,nofail", "0", "0"},
				},
			},
		},
		{
			name:     "env with no valid entry writes no files",
			ci:       Documents{InstanceID: "i-1", Env: []string{"a-b=1", "=x", "NOEQ"}},
			wantMeta: map[string]any{"instance-id": "i-1"},
			wantUser: map[string]any{},
		},
		{
			name: "user cloud-config merged",
			ci: Documents{InstanceID: "i-1", SSHKeys: []string{key2}, Env: []string{"A=1"}, Mounts: []Mount{{Tag: "v0", Path: "/mnt/v"}},
				UserData: "#cloud-config\n# a comment\nssh_authorized_keys:\n  - " + key1 + "\nwrite_files:\n  - path: /etc/motd\n    content: |\n      hello\n      world\n    permissions: 0644\n" +
					"packages: [curl, 'yes', on]\nruncmd:\n  - [sh, -c, 'echo \"$HOME\"']\n  - echo 52:54:00:12:34:56\nbig: 12345678901234567890\nratio: 1.5\nexp: 1.0e+21\nwhen: 2001-12-14\nnothing: ~\n\"on\": quoted key\nmounts:\n",
			},
			wantMeta: map[string]any{"instance-id": "i-1"},
			wantUser: map[string]any{
				"ssh_authorized_keys": []any{key1, key2},
				"write_files": append([]any{map[string]any{"path": "/etc/motd", "content": "hello\nworld\n", "permissions": 420.0}},
					shimEnvFiles("A=1\n", "export A='1'\n")...),
				"packages": []any{"curl", "yes", true},
				"runcmd":   []any{[]any{"sh", "-c", `echo "$HOME"`}, "echo 52:54:00:12:34:56"},
				"big":      12345678901234567890.0,
				"ratio":    1.5,
				"exp":      1e21,
				"when":     "2001-12-14",
				"nothing":  nil,
				"on":       "quoted key",
				"mounts":   []any{[]any{"v0", "/mnt/v", "9p", "trans=virtio,version=9p2000.L,msize=262144,nofail", "0", "0"}},
			},
		},
		{
			name:     "user cloud-config empty document",
			ci:       Documents{InstanceID: "i-1", SSHKeys: []string{key1}, UserData: "#cloud-config\n"},
			wantMeta: map[string]any{"instance-id": "i-1"},
			wantUser: map[string]any{"ssh_authorized_keys": []any{key1}},
		},
		{
			name:     "user cloud-config verbatim when the shim adds nothing",
			ci:       Documents{InstanceID: "i-1", UserData: "#cloud-config\n# keep me\npackages: [curl]\n"},
			wantMeta: map[string]any{"instance-id": "i-1"},
			wantUser: map[string]any{"packages": []any{"curl"}},
			wantRaw:  "#cloud-config\n# keep me\npackages: [curl]\n",
		},
		{
			name:        "user script",
			ci:          Documents{InstanceID: "i-1", SSHKeys: []string{key1}, UserData: "#!/bin/sh\necho \"hi\" \r\n\tdone"},
			wantMeta:    map[string]any{"instance-id": "i-1"},
			wantUser:    map[string]any{"ssh_authorized_keys": []any{key1}},
			wantSecond:  "#!/bin/sh\necho \"hi\" \r\n\tdone",
			wantSecondT: "text/x-shellscript",
			wantLeaves:  [][2]string{{"text/x-shellscript", "#!/bin/sh\necho \"hi\" \r\n\tdone"}},
		},
		{
			name:     "user script verbatim when the shim adds nothing",
			ci:       Documents{InstanceID: "i-1", UserData: "#!/bin/sh\necho hi\n"},
			wantMeta: map[string]any{"instance-id": "i-1"},
			wantRaw:  "#!/bin/sh\necho hi\n",
		},
		{
			name:        "user MIME nested",
			ci:          Documents{InstanceID: "i-1", Env: []string{"A=1"}, UserData: userMIME},
			wantMeta:    map[string]any{"instance-id": "i-1"},
			wantUser:    map[string]any{"write_files": shimEnvFiles("A=1\n", "export A='1'\n")},
			wantSecond:  userMIME,
			wantSecondT: "multipart/mixed",
			wantLeaves:  [][2]string{{"text/x-shellscript", "#!/bin/sh\necho from-mime\n"}},
		},
		{
			name:     "user MIME verbatim when the shim adds nothing",
			ci:       Documents{InstanceID: "i-1", UserData: userMIME},
			wantMeta: map[string]any{"instance-id": "i-1"},
			wantRaw:  userMIME,
		},
		{
			name:     "hostile values",
			ci:       Documents{InstanceID: "i-'1\"", Hostname: hostile, Env: []string{"H=" + hostile, "U=caf\u00e9 \u2028 \x7f \xff"}},
			wantMeta: map[string]any{"instance-id": "i-'1\"", "local-hostname": hostile},
			wantUser: map[string]any{"write_files": shimEnvFiles(
				"H=\"it's \\\"\\$(rm -rf /)\\\" \\`id\\` \\\\n \\$HOME\nsecond: line # no comment\n- not a list\"\nU=\"caf\u00e9 \u2028 \x7f \uFFFD\"\n",
				"export H='it'\\''s \"$(rm -rf /)\" `id` \\n $HOME\nsecond: line # no comment\n- not a list'\nexport U='caf\u00e9 \u2028 \x7f \uFFFD'\n")},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			files, err := tc.ci.Files()
			if err != nil {
				t.Fatalf("Files() error = %v", err)
			}
			again, err := tc.ci.Files()
			if err != nil || !reflect.DeepEqual(files, again) {
				t.Fatalf("Files() is not deterministic")
			}
			checkYAML(t, "meta-data", files[SeedMetaData], tc.wantMeta)
			if tc.wantNetwork == nil {
				if nc, ok := files[SeedNetworkConfig]; ok {
					t.Errorf("network-config = %q, want none", nc)
				}
			} else {
				checkYAML(t, "network-config", files[SeedNetworkConfig], tc.wantNetwork)
			}
			if tc.wantNetRaw != "" && string(files[SeedNetworkConfig]) != tc.wantNetRaw {
				t.Errorf("network-config = %q, want %q", files[SeedNetworkConfig], tc.wantNetRaw)
			}
			ud := files[SeedUserData]
			if tc.wantRaw != "" && string(ud) != tc.wantRaw {
				t.Errorf("user-data = %q, want %q", ud, tc.wantRaw)
			}
			if tc.wantSecond != "" {
				first, second, secondType := splitMIME(t, ud)
				checkCloudConfig(t, first, tc.wantUser)
				if second != tc.wantSecond {
					t.Errorf("user part = %q, want %q", second, tc.wantSecond)
				}
				if secondType != tc.wantSecondT {
					t.Errorf("user part type = %q, want %q", secondType, tc.wantSecondT)
				}
				if leaves := pyMIMELeaves(t, ud); leaves != nil && !reflect.DeepEqual(leaves[1:], tc.wantLeaves) {
					t.Errorf("cloud-init would run %q, want %q", leaves[1:], tc.wantLeaves)
				}
				return
			}
			if tc.wantUser != nil {
				checkCloudConfig(t, ud, tc.wantUser)
			}
		})
	}
}

func TestCloudInitFilesErrors(t *testing.T) {
	tests := []struct {
		name    string
		ci      Documents
		wantErr string
	}{
		{"no instance id", Documents{}, "cloud-init: instance id is empty"},
		{"bad mac", Documents{InstanceID: "i", MACs: []string{"52:54:00:12:34"}}, `cloud-init: nic 0: "52:54:00:12:34" is not an ethernet MAC address`},
		{"long mac", Documents{InstanceID: "i", MACs: []string{"00:00:00:00:fe:80:00:00:00:00:00:00:02:00:5e:10:00:00:00:01"}},
			`cloud-init: nic 0: "00:00:00:00:fe:80:00:00:00:00:00:00:02:00:5e:10:00:00:00:01" is not an ethernet MAC address`},
		{"duplicate mac", Documents{InstanceID: "i", MACs: []string{mac0, strings.ToUpper(mac0)}}, "cloud-init: nic 1: MAC address 52:54:00:12:34:56 is used twice"},
		{"empty tag", Documents{InstanceID: "i", Mounts: []Mount{{Path: "/a"}}},
			`cloud-init: mount 0: tag "" is not a 9p tag cloud-init keeps ([A-Za-z0-9_-], at most 31, not a device name)`},
		{"tag with colon", Documents{InstanceID: "i", Mounts: []Mount{{Tag: "host:/x", Path: "/a"}}},
			`cloud-init: mount 0: tag "host:/x" is not a 9p tag cloud-init keeps ([A-Za-z0-9_-], at most 31, not a device name)`},
		{"tag like a device", Documents{InstanceID: "i", Mounts: []Mount{{Tag: "vdb1", Path: "/a"}}},
			`cloud-init: mount 0: tag "vdb1" is not a 9p tag cloud-init keeps ([A-Za-z0-9_-], at most 31, not a device name)`},
		{"tag like metadata", Documents{InstanceID: "i", Mounts: []Mount{{Tag: "ephemeral0", Path: "/a"}}},
			`cloud-init: mount 0: tag "ephemeral0" is not a 9p tag cloud-init keeps ([A-Za-z0-9_-], at most 31, not a device name)`},
		{"tag too long", Documents{InstanceID: "i", Mounts: []Mount{{Tag: strings.Repeat("a", 32), Path: "/a"}}},
			`cloud-init: mount 0: tag "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" is not a 9p tag cloud-init keeps ([A-Za-z0-9_-], at most 31, not a device name)`},
		{"relative path", Documents{InstanceID: "i", Mounts: []Mount{{Tag: "v", Path: "a"}}}, `cloud-init: mount 0 (v): path "a" is not an absolute path below /`},
		{"root path", Documents{InstanceID: "i", Mounts: []Mount{{Tag: "v", Path: "/"}}}, `cloud-init: mount 0 (v): path "/" is not an absolute path below /`},
		{"path with space", Documents{InstanceID: "i", Mounts: []Mount{{Tag: "v", Path: "/my data"}}},
			`cloud-init: mount 0 (v): path "/my data" has a blank, control character or backslash, which fstab cannot hold`},
		{"path with newline", Documents{InstanceID: "i", Mounts: []Mount{{Tag: "v", Path: "/a\nb"}}},
			`cloud-init: mount 0 (v): path "/a\nb" has a blank, control character or backslash, which fstab cannot hold`},
		{"unclean path", Documents{InstanceID: "i", Mounts: []Mount{{Tag: "v", Path: "/a/../b"}}}, `cloud-init: mount 0 (v): path "/a/../b" is not clean`},
		{"unknown user-data", Documents{InstanceID: "i", Env: []string{"A=1"}, UserData: "hello"}, "cloud-init: user-data must start with #cloud-config or #!"},
		{"unknown user-data, nothing to add", Documents{InstanceID: "i", UserData: "Content-Type: text/plain\n\nhello"}, "cloud-init: user-data must start with #cloud-config or #!"},
		{"cloud-config list", Documents{InstanceID: "i", Env: []string{"A=1"}, UserData: "#cloud-config\n- a\n"}, "cloud-init: user-data cloud-config is not a mapping"},
		{"cloud-config bad yaml", Documents{InstanceID: "i", Env: []string{"A=1"}, UserData: "#cloud-config\na: b: c\n"},
			"cloud-init: user-data cloud-config: error converting YAML to JSON: yaml: line 2: mapping values are not allowed in this context"},
		{"cloud-config write_files not a list", Documents{InstanceID: "i", Env: []string{"A=1"}, UserData: "#cloud-config\nwrite_files: {}\n"},
			"cloud-init: user-data cloud-config key write_files is not a list"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			files, err := tc.ci.Files()
			if err == nil {
				t.Fatalf("Files() = %q, want error %q", files, tc.wantErr)
			}
			if err.Error() != tc.wantErr {
				t.Fatalf("Files() error = %q, want %q", err, tc.wantErr)
			}
			if !errdefs.IsInvalidArgument(err) {
				t.Fatalf("Files() error %q is not ErrInvalidArgument", err)
			}
		})
	}
}

// TestEnvFilesInShell sources both environment files in sh and checks
// every value comes back byte for byte (the env file's double-quoted
// syntax is the one systemd's EnvironmentFile= shares with sh).
func TestEnvFilesInShell(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	values := map[string]string{
		"PLAIN": "/usr/bin:/bin", "EMPTY": "", "HOSTILE": hostile, "QUOTES": `'"'"`, "BACKSLASH": `a\b\\c\`,
		"DOLLAR": "$(id) ${HOME} $$ `uname`", "LEADING": "  x  ", "NEWLINES": "\n\na\n\n", "GLOB": "* ?[a]", "UNICODE": "caf\u00e9 \u2603",
	}
	var env []string
	for k, v := range values {
		env = append(env, k+"="+v)
	}
	envFile, profile := envFiles(env)
	dir := t.TempDir()
	for name, content := range map[string]string{"env": envFile, "profile": profile} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		for k, want := range values {
			script := `set -a; . "$1"; eval "printf %s \"\$$2\""`
			out, err := exec.Command(sh, "-c", script, "sh", p, k).Output()
			if err != nil {
				t.Fatalf("source %s: %v\n%s", name, err, content)
			}
			if string(out) != want {
				t.Errorf("%s: $%s = %q, want %q", name, k, out, want)
			}
		}
	}
}

// TestYAMLQuoting renders awkward strings and keys and reads them back with
// Go's YAML parser and, when present, PyYAML (cloud-init's).
func TestYAMLQuoting(t *testing.T) {
	strs := []string{
		"", " ", "yes", "No", "on", "OFF", "y", "null", "~", "true", "0644", "0x1f", "1e3", "1_000", ".inf", "-.nan",
		"52:54:00:12:34:56", "1:30", "2001-12-14", "2001-12-14t21:59:43.10-05:00", "=", "<<", "- a", "? a", ": a", "a: b", "a #b",
		"#c", "!tag", "&a", "*a", "%x", "@x", "`x", "|", ">", "'", "\"", "\\", "[a]", "{a: b}", ",", "a\nb", "a\n", "a\n\n", "\na",
		" a\nb", "a \nb", "a\tb\n", "\tb\nc", "\r\n", "\x00\x01\x1b\x7f", "\u0085 \u2028 \u2029 \ufeff \ufffe", "caf\u00e9 \U0001F600",
		"---\n...\n", "a\n---\nb\n", "  \n", "x\n  y\n", "$(rm -rf /)",
		"\ufeffa\nb", // the library escapes every character after a leading BOM
		// PyYAML takes a key on one line only up to 1024 characters.
		strings.Repeat("long key ", 130),
	}
	list := make([]any, 0, len(strs))
	keys := map[string]any{}
	for i, s := range strs {
		list = append(list, s)
		keys[s] = i
	}
	doc := map[string]any{"list": list, "keys": keys, "nested": []any{[]any{"a", []any{}}, map[string]any{}, map[string]any{"x": []any{map[string]any{"y": "z\n"}}}}}
	out := yamlDoc(doc)
	want := wantJSON(t, doc)
	var got any
	if err := yaml.Unmarshal(out, &got); err != nil {
		t.Fatalf("parse:\n%s\n%v", out, err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Go YAML read back\n%v\nwant\n%v\nfrom\n%s", got, want, out)
	}
	if py := pyYAML(t, out); py != nil && !reflect.DeepEqual(py, want) {
		t.Errorf("PyYAML read back\n%v\nwant\n%v\nfrom\n%s", py, want, out)
	}
}

// wantJSON is v as JSON would carry it, invalid UTF-8 replaced.
func wantJSON(t *testing.T, v any) any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// checkYAML parses doc with Go's YAML parser and, when present, PyYAML, and
// compares both to want.
func checkYAML(t *testing.T, name string, doc []byte, want any) {
	t.Helper()
	var got any
	if err := yaml.Unmarshal(doc, &got); err != nil {
		t.Fatalf("%s: %v\n%s", name, err, doc)
	}
	want = wantJSON(t, want)
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s =\n%v\nwant\n%v\nfrom\n%s", name, got, want, doc)
	}
	if py := pyYAML(t, doc); py != nil && !reflect.DeepEqual(py, want) {
		t.Errorf("%s (PyYAML) =\n%v\nwant\n%v\nfrom\n%s", name, py, want, doc)
	}
}

// checkCloudConfig checks doc is a #cloud-config document with the given content.
func checkCloudConfig(t *testing.T, doc []byte, want any) {
	t.Helper()
	if !bytes.HasPrefix(doc, []byte("#cloud-config\n")) {
		t.Fatalf("user-data does not start with #cloud-config:\n%s", doc)
	}
	checkYAML(t, "user-data", doc, want)
}

// hasPyYAML reports whether python3 can import yaml; -short skips the
// Python cross-checks.
var hasPyYAML = sync.OnceValue(func() bool {
	return !testing.Short() && exec.Command("python3", "-c", "import yaml").Run() == nil
})

// pyYAML parses doc with PyYAML's safe loader (which dates and binary
// aside is cloud-init's) and returns it through JSON, or nil without PyYAML.
func pyYAML(t *testing.T, doc []byte) any {
	t.Helper()
	const script = "import json, sys, yaml\njson.dump(yaml.safe_load(sys.stdin.buffer), sys.stdout, default=str)\n"
	if !hasPyYAML() {
		return nil
	}
	cmd := exec.Command("python3", "-c", script)
	cmd.Stdin = bytes.NewReader(doc)
	out, err := cmd.Output()
	if err != nil {
		t.Errorf("PyYAML cannot parse:\n%s\n%v", doc, err)
		return nil
	}
	var v any
	if err := json.Unmarshal(out, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// splitMIME parses a two-part multipart/mixed user-data as cloud-init's
// email parser would and returns the shim's decoded cloud-config, the raw
// second part (headers and body) and the second part's type.
func splitMIME(t *testing.T, ud []byte) (first []byte, second, secondType string) {
	t.Helper()
	msg, err := mail.ReadMessage(bytes.NewReader(ud))
	if err != nil {
		t.Fatalf("user-data is not a MIME message: %v\n%s", err, ud)
	}
	if !strings.Contains(strings.ToLower(string(ud[:min(len(ud), 4096)])), "mime-version:") {
		t.Errorf("cloud-init would not see a MIME message without MIME-Version")
	}
	mt, params, err := mime.ParseMediaType(msg.Header.Get("Content-Type"))
	if err != nil || mt != "multipart/mixed" {
		t.Fatalf("user-data Content-Type = %q (%v)", msg.Header.Get("Content-Type"), err)
	}
	body, err := io.ReadAll(msg.Body)
	if err != nil {
		t.Fatal(err)
	}
	mr := multipart.NewReader(bytes.NewReader(body), params["boundary"])
	var parts []*multipart.Part
	var raws [][]byte
	for {
		p, err := mr.NextRawPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("user-data part: %v", err)
		}
		b, err := io.ReadAll(p)
		if err != nil {
			t.Fatal(err)
		}
		parts, raws = append(parts, p), append(raws, b)
	}
	if len(parts) != 2 {
		t.Fatalf("user-data has %d parts, want 2", len(parts))
	}
	if ct := parts[0].Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/cloud-config") {
		t.Errorf("first part Content-Type = %q", ct)
	}
	first = decodeB64(t, raws[0])
	if leaves := pyMIMELeaves(t, ud); leaves != nil {
		if len(leaves) != 2 || leaves[0][0] != "text/cloud-config" || leaves[0][1] != string(first) {
			t.Errorf("Python's email parser sees %q", leaves)
		}
	}
	secondType, _, _ = mime.ParseMediaType(parts[1].Header.Get("Content-Type"))
	if secondType == "text/x-shellscript" {
		return first, string(decodeB64(t, raws[1])), secondType
	}
	// A nested message: the second part is the user's, headers and all.
	delim := "--" + params["boundary"]
	_, rest, _ := strings.Cut(string(body), delim+"\n")
	_, rest, _ = strings.Cut(rest, "\n"+delim+"\n")
	second, _, ok := strings.Cut(rest, "\n"+delim+"--\n")
	if !ok {
		t.Fatalf("no closing delimiter in\n%s", ud)
	}
	return first, second, secondType
}

// pyMIMELeaves walks ud with Python's email parser as cloud-init does and
// returns each non-multipart part's type and decoded payload, or nil
// without python3 (or with -short).
func pyMIMELeaves(t *testing.T, ud []byte) [][2]string {
	t.Helper()
	const script = "import email, json, sys\n" +
		"msg = email.message_from_string(sys.stdin.read())\n" +
		"json.dump([[p.get_content_type(), p.get_payload(decode=True).decode()] for p in msg.walk() if p.get_content_maintype() != 'multipart'], sys.stdout)\n"
	if _, err := exec.LookPath("python3"); err != nil || testing.Short() {
		return nil
	}
	cmd := exec.Command("python3", "-c", script)
	cmd.Stdin = bytes.NewReader(ud)
	out, err := cmd.Output()
	if err != nil {
		t.Errorf("python email parser: %v", err)
		return nil
	}
	var leaves [][2]string
	if err := json.Unmarshal(out, &leaves); err != nil {
		t.Fatal(err)
	}
	return leaves
}

func decodeB64(t *testing.T, b []byte) []byte {
	t.Helper()
	out, err := base64.StdEncoding.DecodeString(strings.ReplaceAll(string(b), "\n", ""))
	if err != nil {
		t.Fatalf("part is not base64: %v", err)
	}
	return out
}
