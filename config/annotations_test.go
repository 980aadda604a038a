package config

import (
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

func TestResolveCloudInitAnnotations(t *testing.T) {
	key := sshKey("ssh-ed25519", "alice@example")
	const mime = "Content-Type: multipart/mixed; boundary=\"XYZ\"\nMIME-Version: 1.0\n\n--XYZ\nContent-Type: text/x-shellscript\n\n#!/bin/sh\necho hi\n--XYZ--\n"
	tests := []struct {
		name     string
		ann      map[string]string
		wantUD   string // VM.UserData on success
		wantNC   string // VM.NetworkConfig on success
		wantErr  string // exact message; "" = success
		wantKeys bool   // VM.SSHAuthorizedKeys is set
	}{
		// user-data: accepted kinds
		{name: "cloud-config", ann: map[string]string{AnnotationUserData: "#cloud-config\npackages: [curl]\n"}, wantUD: "#cloud-config\npackages: [curl]\n"},
		{name: "cloud-config crlf", ann: map[string]string{AnnotationUserData: "#cloud-config\r\nhostname: a\r\n"}, wantUD: "#cloud-config\r\nhostname: a\r\n"},
		{name: "cloud-config trailing blanks on header", ann: map[string]string{AnnotationUserData: "#cloud-config  \nhostname: a\n"}, wantUD: "#cloud-config  \nhostname: a\n"},
		{name: "cloud-config empty document", ann: map[string]string{AnnotationUserData: "#cloud-config\n"}, wantUD: "#cloud-config\n"},
		{name: "cloud-config only comments", ann: map[string]string{AnnotationUserData: "#cloud-config\n# nothing yet\n"}, wantUD: "#cloud-config\n# nothing yet\n"},
		{name: "cloud-config lists", ann: map[string]string{AnnotationUserData: "#cloud-config\nssh_authorized_keys: []\nwrite_files:\n- path: /a\nmounts: ~\n"}, wantUD: "#cloud-config\nssh_authorized_keys: []\nwrite_files:\n- path: /a\nmounts: ~\n"},
		{name: "cloud-config with ssh keys", ann: map[string]string{AnnotationUserData: "#cloud-config\n{}\n", AnnotationSSHAuthorizedKeys: key}, wantUD: "#cloud-config\n{}\n", wantKeys: true},
		{name: "script", ann: map[string]string{AnnotationUserData: "#!/bin/sh\necho hi\n"}, wantUD: "#!/bin/sh\necho hi\n"},
		{name: "script with ssh keys", ann: map[string]string{AnnotationUserData: "#!/bin/sh\n", AnnotationSSHAuthorizedKeys: key}, wantUD: "#!/bin/sh\n", wantKeys: true},
		{name: "mime", ann: map[string]string{AnnotationUserData: mime}, wantUD: mime},
		{name: "mime lower-case header", ann: map[string]string{AnnotationUserData: strings.ToLower(mime[:24]) + mime[24:]}, wantUD: strings.ToLower(mime[:24]) + mime[24:]},
		{name: "blank user-data is none", ann: map[string]string{AnnotationUserData: " \n"}},

		// user-data: refused
		{name: "plain text", ann: map[string]string{AnnotationUserData: "hello"}, wantErr: "annotation vmshim.io/user-data: user-data must start with #cloud-config or #!"},
		{name: "leading blank line", ann: map[string]string{AnnotationUserData: "\n#cloud-config\n"}, wantErr: "annotation vmshim.io/user-data: user-data must start with #cloud-config or #!"},
		{name: "cloud-config-archive", ann: map[string]string{AnnotationUserData: "#cloud-config-archive\n- content: x\n"}, wantErr: "annotation vmshim.io/user-data: user-data must start with #cloud-config or #!"},
		{name: "jinja", ann: map[string]string{AnnotationUserData: "## template: jinja\n#cloud-config\n"}, wantErr: "annotation vmshim.io/user-data: user-data must start with #cloud-config or #!"},
		{name: "bad yaml", ann: map[string]string{AnnotationUserData: "#cloud-config\nhostname: a\nfqdn: a: b\n"},
			wantErr: "annotation vmshim.io/user-data: cloud-config is not valid YAML: line 3: mapping values are not allowed in this context"},
		{name: "yaml tab indent", ann: map[string]string{AnnotationUserData: "#cloud-config\nruncmd:\n\t- ls\n"},
			wantErr: "annotation vmshim.io/user-data: cloud-config is not valid YAML: line 3: found character that cannot start any token"},
		{name: "cloud-config list", ann: map[string]string{AnnotationUserData: "#cloud-config\n- a\n"}, wantErr: "annotation vmshim.io/user-data: cloud-config must be a YAML mapping, not a list"},
		{name: "cloud-config string", ann: map[string]string{AnnotationUserData: "#cloud-config\nhello\n"}, wantErr: "annotation vmshim.io/user-data: cloud-config must be a YAML mapping, not a string"},
		{name: "write_files not a list", ann: map[string]string{AnnotationUserData: "#cloud-config\nwrite_files: {path: /a}\n"},
			wantErr: "annotation vmshim.io/user-data: cloud-config key write_files must be a list, not a mapping"},
		{name: "ssh_authorized_keys not a list", ann: map[string]string{AnnotationUserData: "#cloud-config\nssh_authorized_keys: ssh-ed25519 AAAA\n"},
			wantErr: "annotation vmshim.io/user-data: cloud-config key ssh_authorized_keys must be a list, not a string"},
		{name: "mounts not a list", ann: map[string]string{AnnotationUserData: "#cloud-config\nmounts: 3\n"},
			wantErr: "annotation vmshim.io/user-data: cloud-config key mounts must be a list, not a number"},
		{name: "mime with ssh keys", ann: map[string]string{AnnotationUserData: mime, AnnotationSSHAuthorizedKeys: key},
			wantErr: "annotation vmshim.io/user-data: MIME multipart user-data cannot be combined with vmshim.io/ssh-authorized-keys"},
		{name: "mime without version", ann: map[string]string{AnnotationUserData: "Content-Type: multipart/mixed; boundary=X\n\n--X--\n"},
			wantErr: "annotation vmshim.io/user-data: MIME multipart user-data has no MIME-Version header (cloud-init needs it)"},
		{name: "mime version only in body", ann: map[string]string{AnnotationUserData: "Content-Type: multipart/mixed; boundary=X\n\nMIME-Version: 1.0\n--X--\n"},
			wantErr: "annotation vmshim.io/user-data: MIME multipart user-data has no MIME-Version header (cloud-init needs it)"},
		{name: "single-part mime", ann: map[string]string{AnnotationUserData: "Content-Type: text/cloud-config\nMIME-Version: 1.0\n\nhostname: a\n"},
			wantErr: "annotation vmshim.io/user-data: user-data must start with #cloud-config or #!"},

		// network-config
		{name: "network v2", ann: map[string]string{AnnotationNetworkConfig: "version: 2\nethernets:\n  eth0: {dhcp4: true}\n"}, wantNC: "version: 2\nethernets:\n  eth0: {dhcp4: true}\n"},
		{name: "network v1", ann: map[string]string{AnnotationNetworkConfig: "version: 1\nconfig:\n- type: physical\n  name: eth0\n"}, wantNC: "version: 1\nconfig:\n- type: physical\n  name: eth0\n"},
		{name: "network blank is none", ann: map[string]string{AnnotationNetworkConfig: "\n"}},
		{name: "network bad yaml", ann: map[string]string{AnnotationNetworkConfig: "version: 2\nethernets: [\n"},
			wantErr: "annotation vmshim.io/network-config: not valid YAML: line 2: did not find expected node content"},
		{name: "network list", ann: map[string]string{AnnotationNetworkConfig: "- version: 2\n"}, wantErr: "annotation vmshim.io/network-config: must be a YAML mapping with a version key, not a list"},
		{name: "network no version", ann: map[string]string{AnnotationNetworkConfig: "ethernets: {}\n"}, wantErr: "annotation vmshim.io/network-config: has no version key (1 or 2)"},
		{name: "network wrapped", ann: map[string]string{AnnotationNetworkConfig: "network:\n  version: 2\n"}, wantErr: "annotation vmshim.io/network-config: has no version key (1 or 2)"},
		{name: "network version 3", ann: map[string]string{AnnotationNetworkConfig: "version: 3\n"}, wantErr: "annotation vmshim.io/network-config: version must be 1 or 2"},
		{name: "network version string", ann: map[string]string{AnnotationNetworkConfig: "version: \"2\"\n"}, wantErr: "annotation vmshim.io/network-config: version must be 1 or 2"},
		{name: "network too big", ann: map[string]string{AnnotationNetworkConfig: strings.Repeat(" ", MaxNetworkConfig+1)},
			wantErr: "annotation vmshim.io/network-config: 65537 bytes, more than 65536"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			spec := newSpec()
			for k, v := range tc.ann {
				withAnn(k, v)(spec)
			}
			got, err := Resolve(Default(), "c1", spec)
			if tc.wantErr != "" {
				if err == nil {
					t.Fatalf("Resolve() succeeded, want error %q", tc.wantErr)
				}
				if err.Error() != tc.wantErr {
					t.Fatalf("Resolve() error = %q, want %q", err, tc.wantErr)
				}
				if !errdefs.IsInvalidArgument(err) {
					t.Fatalf("Resolve() error %q is not ErrInvalidArgument", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Resolve() error = %v", err)
			}
			if got.UserData != tc.wantUD {
				t.Errorf("UserData = %q, want %q", got.UserData, tc.wantUD)
			}
			if got.NetworkConfig != tc.wantNC {
				t.Errorf("NetworkConfig = %q, want %q", got.NetworkConfig, tc.wantNC)
			}
			if (len(got.SSHAuthorizedKeys) > 0) != tc.wantKeys {
				t.Errorf("SSHAuthorizedKeys = %q, want set: %v", got.SSHAuthorizedKeys, tc.wantKeys)
			}
		})
	}
}
