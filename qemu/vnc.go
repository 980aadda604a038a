package qemu

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/containerd/errdefs"
)

// VNCPort is the port of the pod's loopback at which the shim hands
// connections to a VM's VNC server (see the shim's port-forward relay).
const VNCPort = 5900

// AddVNCClient hands f, a client's connection the shim accepted, to the
// VM's VNC server (a Spec with VNC): QMP getfd, then add_client. QEMU then
// owns the connection; the caller closes its own f. ctx bounds the calls.
func (v *VM) AddVNCClient(ctx context.Context, f *os.File) error {
	if v.qmp == nil {
		return fmt.Errorf("vnc client: the vm has no qmp connection: %w", errdefs.ErrFailedPrecondition)
	}
	name := fmt.Sprintf("vnc-client-%d", v.vncClients.Add(1))
	if err := v.qmp.SendFD(ctx, name, f); err != nil {
		if errors.Is(err, ErrNoReply) {
			_ = v.qmp.Execute(ctx, "closefd", map[string]string{"fdname": name}, nil)
		}
		return fmt.Errorf("vnc client: %w", err)
	}
	args := map[string]any{"protocol": "vnc", "fdname": name, "skipauth": false}
	if err := v.qmp.Execute(ctx, "add_client", args, nil); err != nil {
		_ = v.qmp.Execute(ctx, "closefd", map[string]string{"fdname": name}, nil)
		return fmt.Errorf("vnc client: %w", err)
	}
	return nil
}
