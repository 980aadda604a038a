package launch

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	containersapi "github.com/containerd/containerd/api/services/containers/v1"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// fakeContainers is containerd's containers service as far as the shim
// uses it: Get, which can answer, fail or hang.
type fakeContainers struct {
	containersapi.UnimplementedContainersServer
	labels map[string]map[string]string // by namespace/id
	err    error                        // returned by Get when set
	hang   bool                         // Get waits for its context
}

func (f *fakeContainers) Get(ctx context.Context, r *containersapi.GetContainerRequest) (*containersapi.GetContainerResponse, error) {
	if f.hang {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	if f.err != nil {
		return nil, errgrpc.ToGRPC(f.err)
	}
	md, _ := metadata.FromIncomingContext(ctx)
	ns := md.Get("containerd-namespace")
	if len(ns) != 1 {
		return nil, errgrpc.ToGRPC(errdefs.ErrFailedPrecondition)
	}
	l, ok := f.labels[ns[0]+"/"+r.ID]
	if !ok {
		return nil, errgrpc.ToGRPCf(errdefs.ErrNotFound, "container %q", r.ID)
	}
	return &containersapi.GetContainerResponse{Container: &containersapi.Container{ID: r.ID, Labels: l}}, nil
}

// serveContainers serves f on a unix socket and returns its path.
func serveContainers(t *testing.T, f *fakeContainers) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "containerd.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	containersapi.RegisterContainersServer(s, f)
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
	return sock
}

func TestContainerLabels(t *testing.T) {
	f := &fakeContainers{labels: map[string]map[string]string{
		"k8s.io/c1":  {"io.vmshim.firmware": "uefi", "io.kubernetes.pod.name": "p"},
		"default/c1": {"other": "x"},
	}}
	sock := serveContainers(t, f)
	ctx := context.Background()

	l, err := containerLabels(ctx, sock, "k8s.io", "c1")
	if err != nil || l["io.vmshim.firmware"] != "uefi" || len(l) != 2 {
		t.Errorf("k8s.io/c1: %v, %v", l, err)
	}
	if l, err = containerLabels(ctx, sock, "default", "c1"); err != nil || l["other"] != "x" || len(l) != 1 {
		t.Errorf("default/c1 (the namespace reaches containerd): %v, %v", l, err)
	}
	if l, err = containerLabels(ctx, sock, "k8s.io", "unknown"); err != nil || l != nil {
		t.Errorf("a container containerd does not know has no labels, got %v, %v", l, err)
	}
	if l, err = containerLabels(ctx, "", "k8s.io", "c1"); err != nil || l != nil {
		t.Errorf("no containerd address: %v, %v", l, err)
	}

	f.err = errdefs.ErrUnavailable
	if _, err = containerLabels(ctx, sock, "k8s.io", "c1"); err == nil || !strings.Contains(err.Error(), "reading container c1's labels from containerd at "+sock) {
		t.Errorf("a failing containerd: %v", err)
	}
}

func TestContainerLabelsHangingContainerd(t *testing.T) {
	sock := serveContainers(t, &fakeContainers{hang: true})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := containerLabels(ctx, sock, "k8s.io", "c1")
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil || !errdefs.IsDeadlineExceeded(err) {
			t.Errorf("a hanging containerd: %v, want a deadline error", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("containerLabels did not return once its context ended")
	}
}

func TestContainerLabelsNoContainerd(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "none.sock")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := containerLabels(ctx, sock, "k8s.io", "c1"); err == nil || !strings.Contains(err.Error(), "labels from containerd") {
		t.Errorf("no socket: %v", err)
	}
}
