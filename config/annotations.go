package config

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"sigs.k8s.io/yaml"
)

// AnnotationPrefix is the prefix of every annotation the shim reads.
const AnnotationPrefix = "vmshim.io/"

// Annotations the shim understands; any other key with AnnotationPrefix is an error.
const (
	AnnotationVCPUs             = AnnotationPrefix + "vcpus"
	AnnotationMemory            = AnnotationPrefix + "memory"
	AnnotationDiskDriver        = AnnotationPrefix + "disk-driver"
	AnnotationRootDiskSize      = AnnotationPrefix + "root-disk-size"
	AnnotationUserData          = AnnotationPrefix + "user-data"
	AnnotationSSHAuthorizedKeys = AnnotationPrefix + "ssh-authorized-keys"
	AnnotationKernelCmdline     = AnnotationPrefix + "kernel-cmdline"
	AnnotationNetworkConfig     = AnnotationPrefix + "network-config"
)

// MaxUserData is the largest vmshim.io/user-data value, in bytes.
const MaxUserData = 64 << 10

// MaxNetworkConfig is the largest vmshim.io/network-config value, in bytes.
const MaxNetworkConfig = 64 << 10

func knownAnnotation(k string) bool {
	switch k {
	case AnnotationVCPUs, AnnotationMemory, AnnotationDiskDriver, AnnotationRootDiskSize,
		AnnotationUserData, AnnotationSSHAuthorizedKeys, AnnotationKernelCmdline, AnnotationNetworkConfig,
		AnnotationRootDiskVolume, AnnotationRootDiskPolicy, AnnotationDiskURL, AnnotationDiskSHA256,
		AnnotationFirmware, AnnotationGraphics, AnnotationNICModel, AnnotationOS, AnnotationCPUTopology, AnnotationMaxMemory,
		AnnotationMachine, AnnotationMesh, AnnotationOnStop, AnnotationOnResumeError, AnnotationBalloon, AnnotationTPM:
		return true
	}
	return false
}

var (
	digits     = regexp.MustCompile(`^[0-9]+$`)
	sshKeyType = regexp.MustCompile(`^[a-z0-9][a-z0-9@._+-]*$`)
)

// annotations are the parsed vmshim.io/* values; zero values mean unset.
type annotations struct {
	vcpus          int
	memoryBytes    int64
	maxMemoryBytes int64
	diskDriver     string
	rootDiskSize   int64
	userData       string
	sshKeys        []string
	kernelCmdline  string
	networkConfig  string

	rootDiskVolume string // clean absolute path
	rootDiskPolicy string
	diskURL        string
	diskSHA256     string // lowercase hex

	guest guestAnnotations
}

func annotationErr(key, format string, args ...any) error {
	return invalidf("annotation %s: %s", key, fmt.Sprintf(format, args...))
}

// parseAnnotations validates every vmshim.io/* annotation against cfg.
func parseAnnotations(cfg Config, in map[string]string) (annotations, error) {
	var a annotations
	var unknown []string
	for k := range in {
		if strings.HasPrefix(k, AnnotationPrefix) && !knownAnnotation(k) {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		for i, k := range unknown {
			unknown[i] = quoteKey(k)
		}
		return a, invalidf("unknown annotation %s", strings.Join(unknown, ", "))
	}
	if v, ok := in[AnnotationVCPUs]; ok {
		if !digits.MatchString(v) {
			return a, annotationErr(AnnotationVCPUs, "%q is not a whole number", v)
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > cfg.MaxVCPUs {
			return a, annotationErr(AnnotationVCPUs, "%s is not in 1..%d (max_vcpus)", v, cfg.MaxVCPUs)
		}
		a.vcpus = n
	}
	for _, q := range []struct {
		key string
		to  *int64
	}{{AnnotationMemory, &a.memoryBytes}, {AnnotationMaxMemory, &a.maxMemoryBytes}} {
		key, to := q.key, q.to
		v, ok := in[key]
		if !ok {
			continue
		}
		n, err := parseBytes(v)
		if err != nil {
			return a, annotationErr(key, "%v", err)
		}
		if n < MinMemory || n > mustBytes(cfg.MaxMemory) {
			return a, annotationErr(key, "%q is not in 64Mi..%s (max_memory)", v, cfg.MaxMemory)
		}
		*to = n
	}
	if v, ok := in[AnnotationDiskDriver]; ok {
		if !validDiskDriver(v) {
			return a, annotationErr(AnnotationDiskDriver, "%q is not one of virtio-blk, virtio-scsi, nvme, sata, ide", v)
		}
		a.diskDriver = v
	}
	if v, ok := in[AnnotationRootDiskSize]; ok {
		n, err := parseBytes(v)
		if err != nil {
			return a, annotationErr(AnnotationRootDiskSize, "%v", err)
		}
		if n == 0 {
			return a, annotationErr(AnnotationRootDiskSize, "%q must be greater than zero", v)
		}
		if n > mustBytes(cfg.MaxDiskSize) {
			return a, annotationErr(AnnotationRootDiskSize, "%q is more than %s (max_disk_size)", v, cfg.MaxDiskSize)
		}
		a.rootDiskSize = n
	}
	if v, ok := in[AnnotationSSHAuthorizedKeys]; ok {
		keys, err := parseSSHKeys(v)
		if err != nil {
			return a, annotationErr(AnnotationSSHAuthorizedKeys, "%v", err)
		}
		a.sshKeys = keys
	}
	if v, ok := in[AnnotationUserData]; ok {
		if len(v) > MaxUserData {
			return a, annotationErr(AnnotationUserData, "%d bytes, more than %d", len(v), MaxUserData)
		}
		if err := checkUserData(v, len(a.sshKeys) > 0); err != nil {
			return a, annotationErr(AnnotationUserData, "%v", err)
		}
		if strings.TrimSpace(v) != "" {
			a.userData = v
		}
	}
	if v, ok := in[AnnotationNetworkConfig]; ok {
		if len(v) > MaxNetworkConfig {
			return a, annotationErr(AnnotationNetworkConfig, "%d bytes, more than %d", len(v), MaxNetworkConfig)
		}
		if err := checkNetworkConfig(v); err != nil {
			return a, annotationErr(AnnotationNetworkConfig, "%v", err)
		}
		if strings.TrimSpace(v) != "" {
			a.networkConfig = v
		}
	}
	if v, ok := in[AnnotationKernelCmdline]; ok {
		if msg := checkCmdline(v); msg != "" {
			return a, annotationErr(AnnotationKernelCmdline, "%s", msg)
		}
		a.kernelCmdline = strings.TrimSpace(v)
	}
	if err := parseDiskAnnotations(in, &a); err != nil {
		return a, err
	}
	var err error
	a.guest, err = parseGuestAnnotations(in)
	return a, err
}

// quoteKey returns an annotation key as it is when it is printable UTF-8
// without blanks, else quoted, so that errors stay one line of UTF-8.
func quoteKey(k string) string {
	if utf8.ValidString(k) && strings.IndexFunc(k, func(r rune) bool { return !unicode.IsGraphic(r) || unicode.IsSpace(r) }) < 0 {
		return k
	}
	return strconv.Quote(k)
}

// parseSSHKeys splits newline-separated public keys, dropping blank lines,
// and checks each has the shape "type base64 [comment]".
func parseSSHKeys(v string) ([]string, error) {
	var keys []string
	for i, line := range strings.Split(v, "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		if !looksLikeSSHKey(line) {
			return nil, fmt.Errorf("line %d is not an ssh public key (\"type base64 [comment]\")", i+1)
		}
		keys = append(keys, line)
	}
	return keys, nil
}

// looksLikeSSHKey reports whether line is "type base64 [comment]" where the
// base64 blob is an SSH wire-format key that starts with the same type.
func looksLikeSSHKey(line string) bool {
	if strings.ContainsAny(line, "\x00\r") {
		return false
	}
	fields := strings.Fields(line)
	if len(fields) < 2 || !sshKeyType.MatchString(fields[0]) {
		return false
	}
	blob, err := base64.StdEncoding.DecodeString(fields[1])
	if err != nil || len(blob) < 4 {
		return false
	}
	n := binary.BigEndian.Uint32(blob)
	if uint64(n) > uint64(len(blob)-4) {
		return false
	}
	return string(blob[4:4+n]) == fields[0]
}

// cloudConfigLists are the cloud-config keys the shim appends to, so they
// must be lists when the user's cloud-config has them.
var cloudConfigLists = []string{"ssh_authorized_keys", "write_files", "mounts"}

// checkUserData accepts a #cloud-config YAML mapping, a #! script or a MIME
// multipart message (not with ssh keys, which the shim cannot merge into it);
// blank means none.
func checkUserData(v string, hasSSHKeys bool) error {
	if strings.TrimSpace(v) == "" {
		return nil
	}
	first, _, _ := strings.Cut(v, "\n")
	first = strings.TrimRight(first, " \t\r")
	switch {
	case first == "#cloud-config":
		doc, err := parseYAML(v)
		if err != nil {
			return fmt.Errorf("cloud-config is not valid YAML: %w", err)
		}
		if doc == nil {
			return nil
		}
		m, ok := doc.(map[string]any)
		if !ok {
			return fmt.Errorf("cloud-config must be a YAML mapping, not %s", yamlKind(doc))
		}
		for _, k := range cloudConfigLists {
			if x, ok := m[k]; ok && x != nil {
				if _, ok := x.([]any); !ok {
					return fmt.Errorf("cloud-config key %s must be a list, not %s", k, yamlKind(x))
				}
			}
		}
		return nil
	case strings.HasPrefix(v, "#!"):
		return nil
	case isMIMEMultipart(v):
		if hasSSHKeys {
			return fmt.Errorf("MIME multipart user-data cannot be combined with %s", AnnotationSSHAuthorizedKeys)
		}
		if !hasMIMEVersion(v) {
			return fmt.Errorf("MIME multipart user-data has no MIME-Version header (cloud-init needs it)")
		}
		return nil
	}
	return fmt.Errorf("user-data must start with #cloud-config or #!")
}

// isMIMEMultipart reports whether v starts with a multipart Content-Type header.
func isMIMEMultipart(v string) bool {
	const prefix = "content-type: multipart/"
	return len(v) >= len(prefix) && strings.EqualFold(v[:len(prefix)], prefix)
}

// hasMIMEVersion reports whether the header block of the MIME message v has
// a MIME-Version field.
func hasMIMEVersion(v string) bool {
	for _, line := range strings.Split(v, "\n") {
		line = strings.TrimRight(line, "\r")
		if line == "" {
			return false
		}
		if k, _, ok := strings.Cut(line, ":"); ok && strings.EqualFold(strings.TrimSpace(k), "mime-version") {
			return true
		}
	}
	return false
}

// checkNetworkConfig accepts cloud-init network-config: a YAML mapping whose
// version is 1 or 2; blank means none.
func checkNetworkConfig(v string) error {
	if strings.TrimSpace(v) == "" {
		return nil
	}
	doc, err := parseYAML(v)
	if err != nil {
		return fmt.Errorf("not valid YAML: %w", err)
	}
	m, ok := doc.(map[string]any)
	if !ok {
		return fmt.Errorf("must be a YAML mapping with a version key, not %s", yamlKind(doc))
	}
	version, ok := m["version"]
	if !ok {
		return fmt.Errorf("has no version key (1 or 2)")
	}
	if n, ok := version.(json.Number); !ok || (n.String() != "1" && n.String() != "2") {
		return fmt.Errorf("version must be 1 or 2")
	}
	return nil
}

// parseYAML decodes one YAML document the way sigs.k8s.io/yaml does (through
// JSON, numbers kept as json.Number); errors are one line and name the line.
func parseYAML(v string) (any, error) {
	var doc any
	useNumber := func(d *json.Decoder) *json.Decoder { d.UseNumber(); return d }
	if err := yaml.Unmarshal([]byte(v), &doc, useNumber); err != nil {
		msg := err.Error()
		if i := strings.Index(msg, "yaml: "); i >= 0 {
			msg = msg[i+len("yaml: "):]
		}
		return nil, errors.New(oneLine(msg))
	}
	return doc, nil
}

// yamlKind names the YAML type of a decoded value for error messages.
func yamlKind(v any) string {
	switch v.(type) {
	case nil:
		return "empty"
	case map[string]any:
		return "a mapping"
	case []any:
		return "a list"
	case string:
		return "a string"
	case json.Number:
		return "a number"
	case bool:
		return "a boolean"
	}
	return fmt.Sprintf("%T", v)
}
