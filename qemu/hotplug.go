package qemu

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// Resizing a running VM over QMP: vCPUs added as CPU devices and removed
// with the guest's consent, and guest RAM grown or shrunk through the
// virtio-mem device.

// CPUInfo is one vCPU as query-cpus-fast reports it.
type CPUInfo struct {
	Index    int    `json:"cpu-index"`
	ThreadID int    `json:"thread-id"`
	QOMPath  string `json:"qom-path"`
}

// QueryCPUs lists the vCPUs with their host thread ids.
func (c *Client) QueryCPUs(ctx context.Context) ([]CPUInfo, error) {
	var cpus []CPUInfo
	if err := c.Execute(ctx, "query-cpus-fast", nil, &cpus); err != nil {
		return nil, err
	}
	return cpus, nil
}

// AddCPU hot-plugs vCPU i of topology t (a vCPU the guest does not have),
// as the device CPUDeviceID(i). The guest is told through ACPI; it brings
// the vCPU online itself or when asked (Agent.OnlineVCPUs).
func (c *Client) AddCPU(ctx context.Context, accel Accel, t Topology, i int) error {
	socket, core, thread := t.IDs(i)
	return c.Execute(ctx, "device_add", map[string]any{
		"driver": cpuType(accel), "id": CPUDeviceID(i),
		"socket-id": socket, "core-id": core, "thread-id": thread,
	}, nil)
}

// cpuPoll is how often DeleteCPU checks whether the vCPU has gone.
const cpuPoll = 100 * time.Millisecond

// DeleteCPU asks the guest to release hot-pluggable vCPU i and waits
// until QEMU no longer lists it. (QEMU 7.2 reports DEVICE_DELETED for the
// vCPU's local APIC but not always for the vCPU, so its list is what
// counts.) A guest that does not release it within ctx leaves the request
// pending: the vCPU goes whenever the guest lets it go.
func (c *Client) DeleteCPU(ctx context.Context, i int) error {
	id := CPUDeviceID(i)
	if err := c.Execute(ctx, "device_del", map[string]string{"id": id}, nil); err != nil {
		return err
	}
	t := time.NewTicker(cpuPoll)
	defer t.Stop()
	for {
		cpus, err := c.QueryCPUs(ctx)
		if err != nil {
			return err
		}
		if !slices.ContainsFunc(cpus, func(c CPUInfo) bool { return c.QOMPath == "/machine/peripheral/"+id }) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("vcpu %d: the guest has not released it: %w", i, ctx.Err())
		case <-t.C:
		}
	}
}

// virtioMemPath is the QOM path of the virtio-mem device.
const virtioMemPath = "/machine/peripheral/" + VirtioMemDevice

// VirtioMemSize reports how much memory the guest has plugged from the
// virtio-mem device, and how much it was asked to, in bytes.
func (c *Client) VirtioMemSize(ctx context.Context) (size, requested int64, err error) {
	if err := c.Execute(ctx, "qom-get", map[string]string{"path": virtioMemPath, "property": "size"}, &size); err != nil {
		return 0, 0, err
	}
	if err := c.Execute(ctx, "qom-get", map[string]string{"path": virtioMemPath, "property": "requested-size"}, &requested); err != nil {
		return 0, 0, err
	}
	return size, requested, nil
}

// virtioMemPoll is how often ResizeVirtioMem checks the guest's progress.
const virtioMemPoll = 100 * time.Millisecond

// ResizeVirtioMem asks the guest to hold requested bytes of the
// virtio-mem device's memory and waits until it does. When ctx ends
// first, the request is set back to what it was, so the guest plugs back
// what it had unplugged (or unplugs what it had plugged), and the error
// says how far it got.
func (c *Client) ResizeVirtioMem(ctx context.Context, requested int64) error {
	bg := context.WithoutCancel(ctx)
	size, before, err := c.VirtioMemSize(ctx)
	if err != nil {
		return err
	}
	if err := c.setVirtioMem(ctx, requested); err != nil {
		return err
	}
	t := time.NewTicker(virtioMemPoll)
	defer t.Stop()
	for size != requested {
		select {
		case <-ctx.Done():
			revertCtx, cancel := context.WithTimeout(bg, 5*time.Second)
			defer cancel()
			if rerr := c.setVirtioMem(revertCtx, before); rerr != nil {
				return fmt.Errorf("guest holds %d MiB of %d MiB asked: %w (and setting the request back failed: %v)", size>>20, requested>>20, ctx.Err(), rerr)
			}
			return fmt.Errorf("guest holds %d MiB of %d MiB asked; the request is set back to %d MiB: %w", size>>20, requested>>20, before>>20, ctx.Err())
		case <-t.C:
		}
		// A poll cut short by ctx leaves size as last seen; the next
		// turn sets the request back.
		s, _, err := c.VirtioMemSize(ctx)
		if err != nil && ctx.Err() == nil {
			return err
		}
		if err == nil {
			size = s
		}
	}
	return nil
}

func (c *Client) setVirtioMem(ctx context.Context, requested int64) error {
	return c.Execute(ctx, "qom-set", map[string]any{"path": virtioMemPath, "property": "requested-size", "value": requested}, nil)
}
