package launch

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/vmshim/vmshim/config"
	"github.com/vmshim/vmshim/qemu"
)

// balloon gives the VM its balloon, as its description asks, unless it
// has a passed-through device, whose DMA pins all of guest RAM: then it
// has none, or, when the annotation asked for one, it is refused.
func (c *build) balloon() error {
	c.qs.Balloon = c.desc.Balloon
	if !c.qs.Balloon || len(c.qs.VFIO) == 0 {
		return nil
	}
	if c.desc.BalloonAsked {
		return fmt.Errorf("annotation %s: %s: guest RAM of a VM with a passed-through device (%s) is pinned and cannot be given back: %w",
			config.AnnotationBalloon, config.BalloonOn, c.qs.VFIO[0], errdefs.ErrInvalidArgument)
	}
	c.qs.Balloon = false
	return nil
}

// guestMemory is the guest's own view of its memory, through the VM's
// balloon: QEMU asks the guest for its statistics every interval, and
// the shim reads them from QEMU at most as often, whoever asks.
type guestMemory struct {
	stats func(context.Context) (qemu.GuestMemory, error) // reads QEMU's
	every time.Duration

	mu   sync.Mutex
	last qemu.GuestMemory
	read time.Time // when last was read from QEMU; zero before
}

// watchGuestMemory has QEMU poll the guest's memory statistics, for a VM
// with a balloon whose config asks for them; nil otherwise.
func (c *build) watchGuestMemory(ctx context.Context, vm *qemu.VM) (*guestMemory, error) {
	if !c.qs.Balloon || c.desc.BalloonStatsInterval == 0 {
		return nil, nil
	}
	if err := vm.QMP().SetBalloonStatsInterval(ctx, c.desc.BalloonStatsInterval); err != nil {
		return nil, err
	}
	return &guestMemory{stats: vm.QMP().GuestMemoryStats, every: c.desc.BalloonStatsInterval}, nil
}

// get returns the guest's statistics, read from QEMU again when the
// last read is older than the interval: a caller that asks more often
// gets the same figures.
func (g *guestMemory) get(ctx context.Context) (qemu.GuestMemory, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.read.IsZero() && time.Since(g.read) < g.every {
		return g.last, nil
	}
	m, err := g.stats(ctx)
	if err != nil {
		return qemu.GuestMemory{}, err
	}
	g.last, g.read = m, time.Now()
	return m, nil
}

// GuestMemory returns the guest's memory statistics as one line, for the
// shim's log: "" for a VM without them (no balloon, statistics off) or
// whose guest never reported (no balloon driver).
func (v *qemuVM) GuestMemory(ctx context.Context) (string, error) {
	if v.guestMem == nil {
		return "", nil
	}
	m, err := v.guestMem.get(ctx)
	if err != nil || m.Updated.IsZero() {
		return "", err
	}
	return m.String() + " reported=" + m.Updated.UTC().Format(time.RFC3339), nil
}

// logGuestMemory logs the guest's statistics at debug level, as each
// metrics request reads them.
func (v *qemuVM) logGuestMemory(ctx context.Context) {
	if v.guestMem == nil || !log.G(ctx).Logger.IsLevelEnabled(log.DebugLevel) {
		return
	}
	line, err := v.GuestMemory(ctx)
	switch {
	case err != nil:
		log.G(ctx).WithError(err).Debug("guest memory")
	case line != "":
		log.G(ctx).Debugf("guest memory: %s", line)
	}
}
