package cloudinit

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	goyaml "go.yaml.in/yaml/v3"
	"sigs.k8s.io/yaml"
)

// Names of the files in a NoCloud seed.
const (
	SeedMetaData      = "meta-data"
	SeedUserData      = "user-data"
	SeedNetworkConfig = "network-config"
)

// Guest files that hold the container's environment.
const (
	// GuestEnvFile is KEY=VALUE lines, for systemd's EnvironmentFile=.
	GuestEnvFile = "/etc/vmshim/env"
	// GuestProfileFile exports the environment to login shells.
	GuestProfileFile = "/etc/profile.d/vmshim-env.sh"
)

// mountOptions are the fstab options of every 9p share; nofail keeps the
// guest booting when a share is missing.
const mountOptions = "trans=virtio,version=9p2000.L,msize=262144,nofail"

// Documents is what a VM's NoCloud seed says.
type Documents struct {
	InstanceID, Hostname string
	UserData             string   // "" for none
	SSHKeys              []string // authorized keys for the default user
	Env                  []string // KEY=VALUE, the container's environment
	Mounts               []Mount  // 9p shares to mount
	MACs                 []string // guest NICs in order, for the default network-config
	IPv6                 []string // those of MACs whose NIC has IPv6: DHCPv6 and router advertisements
	NoIPv4               []string // those of MACs whose NIC has no IPv4 but IPv6: no DHCPv4
	NetworkConfig        string   // user-supplied network-config; "" = DHCP on every MAC
}

// Mount is a 9p share the guest mounts at boot.
type Mount struct {
	Tag, Path string
	ReadOnly  bool
}

var (
	shellName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	mountTag  = regexp.MustCompile(`^[A-Za-z0-9_-]{1,31}$`)
	// cloudDevice matches the tags cloud-init's mounts module would take
	// for a block device or a metadata name and rewrite.
	cloudDevice = regexp.MustCompile(`^(x?[shv]d[a-z][0-9]*|sr[0-9]+|ami|root|swap|ephemeral.*|ebs.*)$`)
	// unquotedEnv are the values written bare into GuestEnvFile.
	unquotedEnv = regexp.MustCompile(`^[A-Za-z0-9_@%+=:,./-]*$`)
)

// Files renders the seed: meta-data, user-data and, unless there is
// nothing to say, network-config.
func (c Documents) Files() (map[string][]byte, error) {
	if c.InstanceID == "" {
		return nil, invalidf("cloud-init: instance id is empty")
	}
	meta := map[string]any{"instance-id": c.InstanceID}
	if c.Hostname != "" {
		meta["local-hostname"] = c.Hostname
	}
	files := map[string][]byte{SeedMetaData: yamlDoc(meta)}
	network, err := c.networkConfig()
	if err != nil {
		return nil, err
	}
	if network != nil {
		files[SeedNetworkConfig] = network
	}
	if files[SeedUserData], err = c.userData(); err != nil {
		return nil, err
	}
	return files, nil
}

// networkConfig is the user's network-config, else DHCP on every MAC
// (version 2, matched by MAC, interfaces keep their names), else nil:
// DHCPv4 unless the NIC has IPv6 alone, and DHCPv6 with router
// advertisements on the NICs with IPv6.
func (c Documents) networkConfig() ([]byte, error) {
	if c.NetworkConfig != "" {
		return []byte(c.NetworkConfig), nil
	}
	if len(c.MACs) == 0 {
		return nil, nil
	}
	ethernets := map[string]any{}
	seen := map[string]bool{}
	for i, s := range c.MACs {
		mac, err := net.ParseMAC(s)
		if err != nil || len(mac) != 6 {
			return nil, invalidf("cloud-init: nic %d: %q is not an ethernet MAC address", i, s)
		}
		if seen[mac.String()] {
			return nil, invalidf("cloud-init: nic %d: MAC address %s is used twice", i, mac)
		}
		seen[mac.String()] = true
		eth := map[string]any{
			"match": map[string]any{"macaddress": mac.String()},
			"dhcp4": !slices.ContainsFunc(c.NoIPv4, sameMAC(mac)),
		}
		if slices.ContainsFunc(c.IPv6, sameMAC(mac)) {
			eth["dhcp6"] = true
			eth["accept-ra"] = true
		}
		ethernets[fmt.Sprintf("nic%d", i)] = eth
	}
	return yamlDoc(map[string]any{"version": 2, "ethernets": ethernets}), nil
}

// sameMAC reports whether a string names mac.
func sameMAC(mac net.HardwareAddr) func(string) bool {
	return func(s string) bool {
		m, err := net.ParseMAC(s)
		return err == nil && bytes.Equal(m, mac)
	}
}

// userData merges the shim's cloud-config into the user's user-data.
func (c Documents) userData() ([]byte, error) {
	shim, err := c.shimConfig()
	if err != nil {
		return nil, err
	}
	user := c.UserData
	if strings.TrimSpace(user) == "" {
		return cloudConfig(shim), nil
	}
	first, _, _ := strings.Cut(user, "\n")
	isCloudConfig := strings.TrimRight(first, " \t\r") == "#cloud-config"
	switch {
	case !isCloudConfig && !strings.HasPrefix(user, "#!") && !isMultipart(user):
		return nil, invalidf("cloud-init: user-data must start with #cloud-config or #!")
	case len(shim) == 0:
		return []byte(user), nil
	case isCloudConfig:
		return mergeCloudConfig(user, shim)
	case strings.HasPrefix(user, "#!"):
		return multipartMessage(cloudConfig(shim), mimePart("text/x-shellscript", "user-script", []byte(user))), nil
	}
	// cloud-init walks nested multiparts, so the user's message is one
	// part of the shim's, headers and all.
	return multipartMessage(cloudConfig(shim), []byte(user)), nil
}

// shimConfig is the shim's own cloud-config: keys, environment files and
// mounts, each key present only when it has entries.
func (c Documents) shimConfig() (map[string]any, error) {
	doc := map[string]any{}
	if len(c.SSHKeys) > 0 {
		keys := make([]any, 0, len(c.SSHKeys))
		for _, k := range c.SSHKeys {
			keys = append(keys, k)
		}
		doc["ssh_authorized_keys"] = keys
	}
	if envFile, profile := envFiles(c.Env); envFile != "" {
		doc["write_files"] = []any{
			map[string]any{"path": GuestEnvFile, "content": envFile, "permissions": "0644", "owner": "root:root"},
			map[string]any{"path": GuestProfileFile, "content": profile, "permissions": "0644", "owner": "root:root"},
		}
	}
	var mounts []any
	for i, m := range c.Mounts {
		if !mountTag.MatchString(m.Tag) || cloudDevice.MatchString(m.Tag) {
			return nil, invalidf("cloud-init: mount %d: tag %q is not a 9p tag cloud-init keeps ([A-Za-z0-9_-], at most 31, not a device name)", i, m.Tag)
		}
		if msg := checkGuestPath(m.Path); msg != "" {
			return nil, invalidf("cloud-init: mount %d (%s): path %q %s", i, m.Tag, m.Path, msg)
		}
		opts := mountOptions
		if m.ReadOnly {
			opts += ",ro"
		}
		mounts = append(mounts, []any{m.Tag, m.Path, "9p", opts, "0", "0"})
	}
	if len(mounts) > 0 {
		doc["mounts"] = mounts
	}
	return doc, nil
}

// checkGuestPath says what is wrong with a mount point for fstab, or "".
func checkGuestPath(p string) string {
	switch {
	case !strings.HasPrefix(p, "/") || p == "/":
		return "is not an absolute path below /"
	case strings.IndexFunc(p, func(r rune) bool { return r <= ' ' || r == 0x7f || r == '\\' || r == utf8.RuneError }) >= 0:
		return "has a blank, control character or backslash, which fstab cannot hold"
	case path.Clean(p) != p:
		return "is not clean"
	}
	return ""
}

// envFiles renders the KEY=VALUE entries of env with a shell name as a
// systemd EnvironmentFile and as a profile.d script; both are "" when none
// qualifies.
func envFiles(env []string) (envFile, profile string) {
	var ef, pf strings.Builder
	for _, kv := range env {
		name, value, ok := strings.Cut(kv, "=")
		if !ok || !shellName.MatchString(name) || strings.ContainsRune(value, 0) {
			continue
		}
		value = strings.ToValidUTF8(value, "\uFFFD")
		ef.WriteString(name + "=" + systemdQuote(value) + "\n")
		pf.WriteString("export " + name + "=" + shellQuote(value) + "\n")
	}
	if ef.Len() == 0 {
		return "", ""
	}
	return ef.String(), "# The container's environment, written by vmshim.\n" + pf.String()
}

// systemdQuote leaves plain values bare and double-quotes the others,
// escaping the characters systemd (and sh) unescape inside double quotes.
func systemdQuote(v string) string {
	if v != "" && unquotedEnv.MatchString(v) {
		return v
	}
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range v {
		if strings.ContainsRune("\"\\`$", r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	b.WriteByte('"')
	return b.String()
}

// shellQuote single-quotes v for sh, closing and reopening around each '.
func shellQuote(v string) string {
	return "'" + strings.ReplaceAll(v, "'", `'\''`) + "'"
}

// cloudConfig renders doc as a #cloud-config document.
func cloudConfig(doc map[string]any) []byte {
	return append([]byte("#cloud-config\n"), yamlDoc(doc)...)
}

// mergeCloudConfig appends the shim's lists to the user's and keeps the
// user's other keys as they are.
func mergeCloudConfig(user string, shim map[string]any) ([]byte, error) {
	var doc any
	useNumber := func(d *json.Decoder) *json.Decoder {
		d.UseNumber()
		return d
	}
	if err := yaml.Unmarshal([]byte(user), &doc, useNumber); err != nil {
		return nil, invalidf("cloud-init: user-data cloud-config: %v", err)
	}
	if doc == nil {
		doc = map[string]any{}
	}
	m, ok := doc.(map[string]any)
	if !ok {
		return nil, invalidf("cloud-init: user-data cloud-config is not a mapping")
	}
	for k, add := range shim {
		switch have := m[k].(type) {
		case nil:
			m[k] = add
		case []any:
			m[k] = append(have, add.([]any)...)
		default:
			return nil, invalidf("cloud-init: user-data cloud-config key %s is not a list", k)
		}
	}
	return cloudConfig(m), nil
}

// isMultipart reports whether v starts with a multipart Content-Type header.
func isMultipart(v string) bool {
	const prefix = "content-type: multipart/"
	return len(v) >= len(prefix) && strings.EqualFold(v[:len(prefix)], prefix)
}

// mimePart is a base64 body part of the given type and file name.
func mimePart(contentType, filename string, body []byte) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "Content-Type: %s; charset=\"utf-8\"\nMIME-Version: 1.0\nContent-Transfer-Encoding: base64\n", contentType)
	fmt.Fprintf(&b, "Content-Disposition: attachment; filename=\"%s\"\n\n", filename)
	enc := base64.StdEncoding.EncodeToString(body)
	for len(enc) > 76 {
		b.WriteString(enc[:76] + "\n")
		enc = enc[76:]
	}
	b.WriteString(enc + "\n")
	return []byte(b.String())
}

// multipartMessage wraps the shim's cloud-config and one more part (headers and
// body) in a multipart/mixed message; the boundary is derived from the
// content, so the output is deterministic.
func multipartMessage(shimConfig, other []byte) []byte {
	parts := [][]byte{mimePart("text/cloud-config", "vmshim.cfg", shimConfig), other}
	sum := sha256.Sum256(append(append([]byte(nil), parts[0]...), parts[1]...))
	boundary := "vmshim-" + hex.EncodeToString(sum[:12])
	for i := 0; strings.Contains(string(parts[1]), boundary); i++ {
		boundary = fmt.Sprintf("vmshim-%s-%d", hex.EncodeToString(sum[:12]), i)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Content-Type: multipart/mixed; boundary=\"%s\"\nMIME-Version: 1.0\n\n", boundary)
	for _, p := range parts {
		b.WriteString("--" + boundary + "\n")
		b.Write(p)
		b.WriteString("\n")
	}
	b.WriteString("--" + boundary + "--\n")
	return []byte(b.String())
}

// yamlDoc renders v (mappings, lists and scalars as JSON decodes them) as
// block YAML that cloud-init's parser (PyYAML, YAML 1.1) reads back
// unchanged: every string is double-quoted or a literal block, so nothing
// turns into a number, a boolean or a date, and mapping keys are sorted.
func yamlDoc(v any) []byte {
	var b bytes.Buffer
	enc := goyaml.NewEncoder(&b)
	enc.SetIndent(2)
	err := enc.Encode(yamlNode(v))
	if err == nil {
		err = enc.Close()
	}
	if err != nil {
		// The tree holds well-formed nodes of valid UTF-8 only, and a
		// bytes.Buffer does not fail.
		panic("cloudinit: rendering YAML: " + err.Error())
	}
	return b.Bytes()
}

// yamlNode is v as a node tree with explicit styles, so that the library
// guesses nothing: numbers, booleans and null plain, strings double-quoted
// or literal blocks, keys bare when PyYAML reads them as strings.
func yamlNode(v any) *goyaml.Node {
	switch v := v.(type) {
	case map[string]any:
		n := &goyaml.Node{Kind: goyaml.MappingNode}
		for _, k := range slices.Sorted(maps.Keys(v)) {
			key := yamlScalar(strings.ToValidUTF8(k, "\uFFFD"), 0)
			if !plainKey.MatchString(k) || yamlWords.MatchString(k) {
				key.Style = goyaml.DoubleQuotedStyle
			}
			n.Content = append(n.Content, key, yamlNode(v[k]))
		}
		return flowIfEmpty(n)
	case []any:
		n := &goyaml.Node{Kind: goyaml.SequenceNode}
		for _, item := range v {
			n.Content = append(n.Content, yamlNode(item))
		}
		return flowIfEmpty(n)
	case nil:
		return yamlScalar("null", 0)
	case bool:
		return yamlScalar(strconv.FormatBool(v), 0)
	case int:
		return yamlScalar(strconv.Itoa(v), 0)
	case json.Number:
		s := v.String()
		// PyYAML reads an exponent without a decimal point as a string.
		if i := strings.IndexAny(s, "eE"); i >= 0 && !strings.Contains(s, ".") {
			s = s[:i] + ".0" + s[i:]
		}
		return yamlScalar(s, 0)
	case string:
		// Invalid UTF-8 would make the library write !!binary.
		s := strings.ToValidUTF8(v, "\uFFFD")
		if literalOK(s) {
			return yamlScalar(s, goyaml.LiteralStyle)
		}
		return yamlScalar(s, goyaml.DoubleQuotedStyle)
	}
	return yamlScalar(strings.ToValidUTF8(fmt.Sprint(v), "\uFFFD"), goyaml.DoubleQuotedStyle)
}

// yamlScalar is an untagged scalar node.
func yamlScalar(value string, style goyaml.Style) *goyaml.Node {
	return &goyaml.Node{Kind: goyaml.ScalarNode, Value: value, Style: style}
}

// flowIfEmpty writes an empty mapping or list as {} or [].
func flowIfEmpty(n *goyaml.Node) *goyaml.Node {
	if len(n.Content) == 0 {
		n.Style = goyaml.FlowStyle
	}
	return n
}

// yamlWords are plain scalars YAML 1.1 reads as booleans or null.
var yamlWords = regexp.MustCompile(`^(?i:y|yes|n|no|true|false|on|off|null)$`)

// plainKey are the keys written bare, unless they are yamlWords.
var plainKey = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_-]*$`)

// literalOK reports whether s reads back unchanged as a literal block
// without indentation or keep-chomping indicators: it has a line break, no
// leading blank or break, no trailing blanks on any line, at most one
// final line break, and no U+2028 or U+2029, which the library would take
// for line breaks. For characters a literal block cannot hold (controls,
// U+0085, U+FEFF and the like) the library falls back to double quotes.
func literalOK(s string) bool {
	if !strings.Contains(s, "\n") || strings.HasSuffix(s, "\n\n") || strings.HasPrefix(s, "\n") ||
		strings.HasPrefix(s, " ") || strings.HasPrefix(s, "\t") || strings.ContainsAny(s, "\u2028\u2029") {
		return false
	}
	for _, line := range strings.Split(strings.TrimSuffix(s, "\n"), "\n") {
		if strings.HasSuffix(line, " ") || strings.HasSuffix(line, "\t") {
			return false
		}
	}
	return true
}
