package launch

import (
	"context"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/vmshim/vmshim/config"
	"github.com/vmshim/vmshim/image"
)

// TestFetchDiskRefused shows a disk by URL is refused in one line, before
// any connection, when config url_disks is off and when the container has
// no network namespace of its own to fetch from.
func TestFetchDiskRefused(t *testing.T) {
	for _, tc := range []struct {
		name   string
		off    bool
		nsPath string
		want   string
	}{
		{"url_disks off", true, "", "disk-url: disks by URL and pointer images are turned off on this node (config url_disks)"},
		{"no netns", false, "", "disk-url: the container has no network namespace to fetch from"},
		{"the shim's netns", false, "/proc/self/ns/net", "disk-url: the container has no network namespace to fetch from"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.Default()
			cfg.URLDisks = !tc.off
			c := &build{cfg: cfg, spec: &specs.Spec{}, nsPath: tc.nsPath,
				boot: &image.Boot{URL: "http://127.0.0.1:1/d", SHA256: strings.Repeat("ab", 32)}}
			err := c.fetchDisk(context.Background())
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) || !errdefs.IsFailedPrecondition(err) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("error %v, want one line starting %q", err, tc.want)
			}
		})
	}
}
