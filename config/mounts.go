package config

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unicode/utf8"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// ShareTagPrefix starts the 9p mount tag of every share; the i-th share is
// ShareTagPrefix + i.
const ShareTagPrefix = "vmshim"

// ServiceAccountDir is where Kubernetes mounts the service account token;
// it is always shared read-only.
const ServiceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// Share is a host directory the guest mounts over virtio-9p.
type Share struct {
	Tag       string // 9p mount tag: vmshim0, vmshim1, ...
	HostPath  string // absolute, clean host directory
	GuestPath string // absolute, clean mount point in the guest (the mount's destination)
	ReadOnly  bool
}

// ResolveShares picks the mounts of spec that become 9p shares: bind mounts
// of directories, in spec order. The pod's plumbing (/proc, /sys, /dev and
// what lies under them, /etc/hosts, /etc/hostname, /etc/resolv.conf) and
// kernel filesystems are dropped without a word; every other mount that is
// not shared is listed in skipped as "DESTINATION: reason", for a log line.
func ResolveShares(spec *specs.Spec) (shares []Share, skipped []string) {
	if spec == nil {
		return nil, nil
	}
	for _, m := range spec.Mounts {
		if isPlumbing(m) {
			continue
		}
		sh, reason := shareOf(m)
		if reason != "" {
			skipped = append(skipped, fmt.Sprintf("%q: %s", m.Destination, reason))
			continue
		}
		sh.Tag = ShareTagPrefix + strconv.Itoa(len(shares))
		shares = append(shares, sh)
	}
	return shares, skipped
}

// isPlumbing reports whether m is part of every container's setup rather
// than something the pod asked for.
func isPlumbing(m specs.Mount) bool {
	dst := filepath.Clean(m.Destination)
	switch dst {
	case "/etc/hosts", "/etc/hostname", "/etc/resolv.conf":
		return true
	}
	for _, dir := range []string{"/proc", "/sys", "/dev"} {
		if dst == dir || strings.HasPrefix(dst, dir+"/") {
			return true
		}
	}
	switch m.Type {
	case "proc", "sysfs", "devpts", "mqueue", "cgroup", "cgroup2":
		return true
	}
	return false
}

// shareOf returns the share m becomes (without its tag), or why it does not.
func shareOf(m specs.Mount) (Share, string) {
	bind, readOnly := mountOptions(m)
	if !bind {
		typ := "untyped"
		if m.Type != "" {
			// The type is the runtime's to set, and a hostile one must
			// not break the one-line message it lands in.
			typ = quoteKey(m.Type)
		}
		return Share{}, fmt.Sprintf("%s mount, not a bind mount", typ)
	}
	for _, p := range []string{m.Source, m.Destination} {
		if !filepath.IsAbs(p) {
			return Share{}, fmt.Sprintf("path %q is not absolute", p)
		}
		if strings.IndexFunc(p, func(r rune) bool { return r < ' ' || r == 0x7f }) >= 0 {
			return Share{}, fmt.Sprintf("path %q has a control character", p)
		}
	}
	src := filepath.Clean(m.Source)
	fi, err := os.Stat(src)
	if err != nil {
		return Share{}, fmt.Sprintf("source: %v", err)
	}
	if !fi.IsDir() {
		return Share{}, fmt.Sprintf("source %q is not a directory (only directories are shared)", src)
	}
	dst := filepath.Clean(m.Destination)
	if strings.ContainsAny(dst, " \t\\") {
		// The guest mounts shares through fstab, which cannot hold these.
		return Share{}, fmt.Sprintf("path %q has whitespace or a backslash", dst)
	}
	if !utf8.ValidString(dst) || strings.ContainsRune(dst, utf8.RuneError) {
		// The fstab entry reaches the guest through YAML, which holds only UTF-8.
		return Share{}, fmt.Sprintf("path %q has invalid UTF-8 or U+FFFD", dst)
	}
	if dst == "/" {
		return Share{}, "the guest's root is not replaced"
	}
	if dst == ServiceAccountDir {
		readOnly = true
	}
	return Share{HostPath: src, GuestPath: dst, ReadOnly: readOnly}, ""
}

// mountOptions reads a mount's kind and access from its type and options;
// the last of ro/rro and rw wins, as for mount(8).
func mountOptions(m specs.Mount) (bind, readOnly bool) {
	bind = m.Type == "bind" || m.Type == "rbind"
	for _, o := range m.Options {
		switch o {
		case "bind", "rbind":
			bind = true
		case "ro", "rro":
			readOnly = true
		case "rw":
			readOnly = false
		}
	}
	return bind, readOnly
}
