package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/platforms"
)

// Defaults for importing into containerd, as ctr has them.
const (
	defaultAddress   = "/run/containerd/containerd.sock"
	defaultNamespace = namespaces.Default
)

// connectTimeout bounds the first call to containerd.
const connectTimeout = 10 * time.Second

// importOptions say which containerd, and which of its namespaces, an image
// is imported into.
type importOptions struct {
	Address     string // containerd's gRPC socket
	Namespace   string // containerd namespace, e.g. "default" or "k8s.io"
	Snapshotter string // snapshotter to unpack for; empty means containerd's default
}

// importer imports archives into one containerd namespace.
type importer struct {
	opts   importOptions
	client *client.Client
}

// dialContainerd connects to the containerd of opts and checks it answers.
func dialContainerd(ctx context.Context, opts importOptions) (*importer, error) {
	if opts.Namespace == "" {
		return nil, fmt.Errorf("containerd namespace is empty: %w", errdefs.ErrInvalidArgument)
	}
	// containerd's dialer waits out its whole timeout for a socket that
	// does not exist; say so at once.
	if path, ok := strings.CutPrefix(opts.Address, "unix://"); ok || !strings.Contains(opts.Address, "://") {
		if _, err := os.Stat(path); err != nil {
			return nil, fmt.Errorf("connect to containerd at %s: %w", opts.Address, err)
		}
	}
	c, err := client.New(opts.Address,
		client.WithDefaultNamespace(opts.Namespace),
		client.WithDefaultPlatform(platforms.Only(imagePlatform())),
		client.WithTimeout(connectTimeout))
	if err != nil {
		return nil, fmt.Errorf("connect to containerd at %s: %w", opts.Address, err)
	}
	vctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	if _, err := c.Version(vctx); err != nil {
		c.Close()
		return nil, fmt.Errorf("connect to containerd at %s: %w", opts.Address, errgrpc.ToNative(err))
	}
	return &importer{opts: opts, client: c}, nil
}

// close ends the connection to containerd.
func (i *importer) close() {
	i.client.Close()
}

// importArchive imports the OCI archive read from r and unpacks the image
// name in it for the snapshotter, so that it can run at once.
func (i *importer) importArchive(ctx context.Context, r io.Reader, name string) error {
	ctx = namespaces.WithNamespace(ctx, i.opts.Namespace)
	imgs, err := i.client.Import(ctx, r, client.WithImportPlatform(platforms.Only(imagePlatform())))
	if err != nil {
		return fmt.Errorf("import %s into containerd namespace %s: %w", name, i.opts.Namespace, err)
	}
	for _, img := range imgs {
		if img.Name != name {
			continue
		}
		image := client.NewImageWithPlatform(i.client, img, platforms.Only(imagePlatform()))
		if err := image.Unpack(ctx, i.opts.Snapshotter); err != nil {
			return fmt.Errorf("unpack %s in containerd namespace %s for %s: %w", name, i.opts.Namespace, i.snapshotterName(), err)
		}
		return nil
	}
	return fmt.Errorf("import %s into containerd namespace %s: containerd made no image of that name: %w",
		name, i.opts.Namespace, errdefs.ErrNotFound)
}

// snapshotterName names the snapshotter in messages.
func (i *importer) snapshotterName() string {
	if i.opts.Snapshotter == "" {
		return "the default snapshotter"
	}
	return "snapshotter " + i.opts.Snapshotter
}
