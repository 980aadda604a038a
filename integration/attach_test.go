package integration

import (
	"context"
	"io"
	"net/url"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestCRIAttach attaches to a VM container's serial console with stdin and
// a tty, as `kubectl attach -it` does: a line written reaches the guest,
// its answer comes back, and detaching leaves the VM running.
func TestCRIAttach(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*bootTimeout)
	defer cancel()
	c := newCRI(t, env.daemon)
	p := c.runPod(ctx, t, "attach")
	vm := p.createVMWith(ctx, t, imageKernelWaitCRI, func(cfg *runtimeapi.ContainerConfig) {
		cfg.Stdin, cfg.Tty = true, true
	})
	if _, err := c.runtime.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: vm.id}); err != nil {
		t.Fatalf("StartContainer: %v", err)
	}
	vm.waitLog(ctx, t, markerBooted)

	resp, err := c.runtime.Attach(ctx, &runtimeapi.AttachRequest{ContainerId: vm.id, Stdin: true, Stdout: true, Tty: true})
	if err != nil {
		t.Fatalf("Attach: %v", err)
	}
	u, err := url.Parse(resp.Url)
	if err != nil {
		t.Fatal(err)
	}
	stdinR, stdinW := io.Pipe()
	out := newConsoleOut()
	streamCtx, stopStream := context.WithCancel(ctx)
	streamed := make(chan error, 1)
	// The stream server listens in the daemon's network namespace; the
	// SPDY connection is dialled by the goroutine that starts the stream.
	go func() {
		streamed <- inNetns("/run/netns/"+env.daemon.netns, func() error {
			exec, err := remotecommand.NewSPDYExecutor(&rest.Config{}, "POST", u)
			if err != nil {
				return err
			}
			return exec.StreamWithContext(streamCtx, remotecommand.StreamOptions{Stdin: stdinR, Stdout: out, Tty: true})
		})
	}()
	// Write until the guest answers: the stream may still be connecting.
	answered := make(chan struct{})
	go func() {
		for {
			if _, err := io.WriteString(stdinW, "hello-vmshim\n"); err != nil {
				return
			}
			select {
			case <-answered:
				return
			case <-time.After(time.Second):
			}
		}
	}()
	out.waitFor(ctx, t, "VMSHIM-ECHO: hello-vmshim")
	close(answered)

	// Detach.
	stopStream()
	stdinW.Close()
	select {
	case <-streamed:
	case <-ctx.Done():
		t.Fatal("the attach stream did not end")
	}
	if st := vm.status(ctx, t); st.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Errorf("after detaching: state %v, want running", st.State)
	}
	if !strings.Contains(out.String(), "VMSHIM-ECHO") {
		t.Errorf("attach output: %q", out.String())
	}
	p.remove(t)
}
