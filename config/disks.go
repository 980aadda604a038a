package config

import (
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/vmshim/vmshim/diskcache"
)

// Annotations that say where the VM's root disk comes from and where it
// lives.
const (
	// AnnotationRootDiskVolume names the volume that keeps the VM's root
	// disk across boots: a volume's mountPath, or a block device's
	// devicePath.
	AnnotationRootDiskVolume = AnnotationPrefix + "root-disk-volume"
	// AnnotationRootDiskPolicy says what a kept root disk does when the
	// image changes: RootDiskKeep or RootDiskRecreate.
	AnnotationRootDiskPolicy = AnnotationPrefix + "root-disk-policy"
	// AnnotationDiskURL is an http or https URL of the VM's disk, which
	// then need not be in the image.
	AnnotationDiskURL = AnnotationPrefix + "disk-url"
	// AnnotationDiskSHA256 is the sha256 of the file at AnnotationDiskURL.
	AnnotationDiskSHA256 = AnnotationPrefix + "disk-sha256"
)

// Root disk policies.
const (
	RootDiskKeep     = "keep"     // a kept disk stays when the image changes
	RootDiskRecreate = "recreate" // a kept disk is made again from a changed image
)

// maxVolumePath is the longest volume path accepted, in bytes.
const maxVolumePath = 4096

// RootVolume is the volume of the container that keeps the VM's root disk.
type RootVolume struct {
	Path    string // as the container names it: the mount's destination or the device's path
	HostDir string // a filesystem volume's host directory; "" for a block device
	Block   bool   // a block device of the container (its host node is resolved with the other devices)
}

// parseDiskAnnotations reads the annotations on the root disk's source and
// home into a.
func parseDiskAnnotations(in map[string]string, a *annotations) error {
	if v, ok := in[AnnotationRootDiskVolume]; ok {
		p, err := checkVolumePath(v)
		if err != nil {
			return annotationErr(AnnotationRootDiskVolume, "%v", err)
		}
		a.rootDiskVolume = p
	}
	if v, ok := in[AnnotationRootDiskPolicy]; ok {
		if v != RootDiskKeep && v != RootDiskRecreate {
			return annotationErr(AnnotationRootDiskPolicy, "%q is not keep or recreate", v)
		}
		if a.rootDiskVolume == "" {
			return annotationErr(AnnotationRootDiskPolicy, "needs %s: only a kept root disk has a policy", AnnotationRootDiskVolume)
		}
		a.rootDiskPolicy = v
	}
	u, hasURL := in[AnnotationDiskURL]
	sum, hasSum := in[AnnotationDiskSHA256]
	switch {
	case hasURL && !hasSum:
		return annotationErr(AnnotationDiskURL, "needs %s, the sha256 of the file at the URL", AnnotationDiskSHA256)
	case hasSum && !hasURL:
		return annotationErr(AnnotationDiskSHA256, "is set without %s", AnnotationDiskURL)
	case !hasURL:
		return nil
	}
	parsed, err := diskcache.ParseURL(u)
	if err != nil {
		return annotationErr(AnnotationDiskURL, "%v", err)
	}
	digest, err := diskcache.ParseDigest(strings.TrimSpace(sum))
	if err != nil {
		return annotationErr(AnnotationDiskSHA256, "%v", err)
	}
	a.diskURL, a.diskSHA256 = parsed.String(), digest
	return nil
}

// checkVolumePath checks a volume's path as the container sees it.
func checkVolumePath(v string) (string, error) {
	switch {
	case strings.ContainsAny(v, "\x00\n\r"):
		return "", invalidf("%s contains a newline or NUL", quoteValue(v))
	case len(v) > maxVolumePath:
		return "", invalidf("%d bytes, more than %d", len(v), maxVolumePath)
	case !path.IsAbs(v):
		return "", invalidf("%s is not an absolute path (a volume's mountPath or devicePath)", quoteValue(v))
	case path.Clean(v) == "/":
		return "", invalidf("%s is the container's root, not a volume", quoteValue(v))
	}
	return path.Clean(v), nil
}

// quoteValue quotes a value for an error message, cut to 200 bytes.
func quoteValue(v string) string {
	if len(v) > 200 {
		v = strings.ToValidUTF8(v[:200], "") + "…"
	}
	return strconv.Quote(v)
}

// resolveRootVolume finds the volume p names: a bind mount of a host
// directory at p, read-write, or a block device at p.
func resolveRootVolume(spec *specs.Spec, p string) (*RootVolume, error) {
	for _, m := range spec.Mounts {
		if path.Clean(m.Destination) != p {
			continue
		}
		bind := m.Type == "bind" || slices.Contains(m.Options, "bind") || slices.Contains(m.Options, "rbind")
		switch {
		case !bind || !filepath.IsAbs(m.Source):
			return nil, annotationErr(AnnotationRootDiskVolume, "the mount at %s is a %s mount, not a volume of a host directory", quoteKey(p), quoteKey(m.Type))
		case slices.Contains(m.Options, "ro"):
			return nil, annotationErr(AnnotationRootDiskVolume, "the volume at %s is mounted read-only", quoteKey(p))
		}
		return &RootVolume{Path: p, HostDir: filepath.Clean(m.Source)}, nil
	}
	if spec.Linux != nil {
		for _, d := range spec.Linux.Devices {
			if path.Clean(d.Path) == p && d.Type == "b" {
				return &RootVolume{Path: p, Block: true}, nil
			}
		}
	}
	return nil, annotationErr(AnnotationRootDiskVolume, "%s is neither a volume mounted in the container nor one of its block devices", quoteKey(p))
}
