package config

import (
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
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
)

// MaxUserData is the largest vmshim.io/user-data value, in bytes.
const MaxUserData = 64 << 10

func knownAnnotation(k string) bool {
	switch k {
	case AnnotationVCPUs, AnnotationMemory, AnnotationDiskDriver, AnnotationRootDiskSize,
		AnnotationUserData, AnnotationSSHAuthorizedKeys, AnnotationKernelCmdline:
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
	vcpus         int
	memoryBytes   int64
	diskDriver    string
	rootDiskSize  int64
	userData      string
	sshKeys       []string
	kernelCmdline string
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
	if v, ok := in[AnnotationMemory]; ok {
		n, err := parseBytes(v)
		if err != nil {
			return a, annotationErr(AnnotationMemory, "%v", err)
		}
		if n < MinMemory || n > mustBytes(cfg.MaxMemory) {
			return a, annotationErr(AnnotationMemory, "%q is not in 64Mi..%s (max_memory)", v, cfg.MaxMemory)
		}
		a.memoryBytes = n
	}
	if v, ok := in[AnnotationDiskDriver]; ok {
		if !validDiskDriver(v) {
			return a, annotationErr(AnnotationDiskDriver, "%q is not one of virtio-blk, virtio-scsi, nvme", v)
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
	if v, ok := in[AnnotationUserData]; ok {
		if len(v) > MaxUserData {
			return a, annotationErr(AnnotationUserData, "%d bytes, more than %d", len(v), MaxUserData)
		}
		a.userData = v
	}
	if v, ok := in[AnnotationSSHAuthorizedKeys]; ok {
		keys, err := parseSSHKeys(v)
		if err != nil {
			return a, annotationErr(AnnotationSSHAuthorizedKeys, "%v", err)
		}
		a.sshKeys = keys
	}
	if v, ok := in[AnnotationKernelCmdline]; ok {
		if msg := checkCmdline(v); msg != "" {
			return a, annotationErr(AnnotationKernelCmdline, "%s", msg)
		}
		a.kernelCmdline = strings.TrimSpace(v)
	}
	return a, nil
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
