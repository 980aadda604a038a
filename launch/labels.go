package launch

import (
	"context"
	"fmt"
	"time"

	containersapi "github.com/containerd/containerd/api/services/containers/v1"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// labelTimeout bounds the one call that reads a container's labels; the
// caller of Create is containerd itself, so it answers at once or not at
// all.
const labelTimeout = 10 * time.Second

// containerLabels reads the labels of container id in namespace ns from
// containerd's containers service at address (its gRPC socket). The
// task API does not carry them, and they are where containerd puts an
// image's OCI labels: CRI merges them into every container it creates,
// and ctr run copies them. A container containerd does not know (a
// caller that is not containerd) has none.
func containerLabels(ctx context.Context, address, ns, id string) (map[string]string, error) {
	if address == "" {
		return nil, nil
	}
	conn, err := grpc.NewClient("unix://"+address,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20)))
	if err != nil {
		return nil, fmt.Errorf("reading container %s's labels from containerd at %s: %w", id, address, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(namespaces.WithNamespace(ctx, ns), labelTimeout)
	defer cancel()
	resp, err := containersapi.NewContainersClient(conn).Get(ctx, &containersapi.GetContainerRequest{ID: id})
	if err != nil {
		if err = errgrpc.ToNative(err); errdefs.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("reading container %s's labels from containerd at %s: %w", id, address, err)
	}
	return resp.GetContainer().GetLabels(), nil
}
