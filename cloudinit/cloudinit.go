package cloudinit

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

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
// (version 2, matched by MAC, interfaces keep their names), else nil.
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
		ethernets[fmt.Sprintf("nic%d", i)] = map[string]any{
			"match": map[string]any{"macaddress": mac.String()},
			"dhcp4": true,
		}
	}
	return yamlDoc(map[string]any{"version": 2, "ethernets": ethernets}), nil
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
	var b strings.Builder
	writeYAML(&b, v, 0, false)
	return []byte(b.String())
}

// writeYAML writes v at column indent; inline means the current line
// already holds "- " and v's first line continues it.
func writeYAML(b *strings.Builder, v any, indent int, inline bool) {
	pad := strings.Repeat(" ", indent)
	switch v := v.(type) {
	case map[string]any:
		if len(v) == 0 {
			b.WriteString("{}\n")
			return
		}
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for i, k := range keys {
			if i > 0 || !inline {
				b.WriteString(pad)
			}
			b.WriteString(yamlKey(k) + ":")
			if yamlLen(v[k]) > 0 {
				b.WriteString("\n")
				writeYAML(b, v[k], indent+2, false)
				continue
			}
			b.WriteString(" ")
			writeYAML(b, v[k], indent+2, true)
		}
	case []any:
		if len(v) == 0 {
			b.WriteString("[]\n")
			return
		}
		for i, item := range v {
			if i > 0 || !inline {
				b.WriteString(pad)
			}
			b.WriteString("- ")
			writeYAML(b, item, indent+2, true)
		}
	default:
		b.WriteString(yamlScalar(v, pad))
	}
}

// yamlLen is the length of a mapping or list, 0 for a scalar.
func yamlLen(v any) int {
	switch v := v.(type) {
	case map[string]any:
		return len(v)
	case []any:
		return len(v)
	}
	return 0
}

// yamlWords are plain scalars YAML 1.1 reads as booleans or null.
var yamlWords = regexp.MustCompile(`^(?i:y|yes|n|no|true|false|on|off|null)$`)

var plainKey = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_-]*$`)

// yamlKey leaves identifier-like keys bare and quotes the rest.
func yamlKey(k string) string {
	if plainKey.MatchString(k) && !yamlWords.MatchString(k) {
		return k
	}
	return yamlQuote(k)
}

// yamlScalar renders a scalar and its line break; a literal block's lines
// start with pad.
func yamlScalar(v any, pad string) string {
	switch v := v.(type) {
	case nil:
		return "null\n"
	case bool:
		return strconv.FormatBool(v) + "\n"
	case int:
		return strconv.Itoa(v) + "\n"
	case json.Number:
		s := v.String()
		// PyYAML reads an exponent without a decimal point as a string.
		if i := strings.IndexAny(s, "eE"); i >= 0 && !strings.Contains(s, ".") {
			s = s[:i] + ".0" + s[i:]
		}
		return s + "\n"
	case string:
		if literalOK(v) {
			return literalBlock(v, pad)
		}
		return yamlQuote(v) + "\n"
	}
	return yamlQuote(fmt.Sprint(v)) + "\n"
}

// literalOK reports whether s reads back unchanged as a literal block: it
// has a line break, printable characters only, no trailing blanks, no
// leading blank and at most one final line break.
func literalOK(s string) bool {
	if !strings.Contains(s, "\n") || strings.HasSuffix(s, "\n\n") || strings.HasPrefix(s, "\n") ||
		strings.HasPrefix(s, " ") || strings.HasPrefix(s, "\t") || !utf8.ValidString(s) {
		return false
	}
	for _, line := range strings.Split(strings.TrimSuffix(s, "\n"), "\n") {
		if strings.HasSuffix(line, " ") || strings.HasSuffix(line, "\t") {
			return false
		}
		for _, r := range line {
			if r != '\t' && !yamlPrintable(r) {
				return false
			}
		}
	}
	return true
}

// literalBlock renders s as a literal block scalar with lines at pad.
func literalBlock(s, pad string) string {
	var b strings.Builder
	body, clip := strings.CutSuffix(s, "\n")
	if clip {
		b.WriteString("|\n")
	} else {
		b.WriteString("|-\n")
	}
	for _, line := range strings.Split(body, "\n") {
		if line != "" {
			b.WriteString(pad + line)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// yamlPrintable reports whether PyYAML takes r unescaped and not as a line
// break.
func yamlPrintable(r rune) bool {
	switch {
	case r == 0x2028 || r == 0x2029 || r == 0xfeff:
		return false
	case r >= 0x20 && r <= 0x7e, r >= 0xa0 && r <= 0xd7ff, r >= 0xe000 && r <= 0xfffd, r >= 0x10000 && r <= 0x10ffff:
		return true
	}
	return false
}

// yamlQuote double-quotes s, escaping everything PyYAML would not take
// literally; invalid UTF-8 becomes U+FFFD.
func yamlQuote(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range strings.ToValidUTF8(s, "\uFFFD") {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\t':
			b.WriteString(`\t`)
		case yamlPrintable(r):
			b.WriteRune(r)
		case r <= 0xff:
			fmt.Fprintf(&b, `\x%02x`, r)
		case r <= 0xffff:
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			fmt.Fprintf(&b, `\U%08x`, r)
		}
	}
	b.WriteByte('"')
	return b.String()
}
