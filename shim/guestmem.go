package shim

import (
	"context"
	"maps"
	"os"
	"os/signal"
	"slices"
	"time"

	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"github.com/vmshim/vmshim/launch"
)

// guestMemoryTimeout bounds the reading of one guest's statistics.
const guestMemoryTimeout = 5 * time.Second

// reportGuestMemoryOnSignal logs the memory statistics of the shim's
// guests (launch.GuestMemoryReporter) at each SIGUSR2, until ctx ends:
// an operator's way to see the guest's view beside the cgroup's.
func (s *service) reportGuestMemoryOnSignal(ctx context.Context) {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, unix.SIGUSR2)
	go func() {
		defer signal.Stop(sig)
		for {
			select {
			case <-ctx.Done():
				return
			case <-sig:
				s.reportGuestMemory(ctx)
			}
		}
	}()
}

// reportGuestMemory logs each guest's memory statistics at info level.
func (s *service) reportGuestMemory(ctx context.Context) {
	for _, r := range s.guestMemory(ctx) {
		logger := log.G(ctx).WithField("id", r.id)
		if r.err != nil {
			logger.WithError(r.err).Warn("guest memory")
			continue
		}
		logger.Infof("guest memory: %s", r.line)
	}
}

// guestMemoryReport is one guest's statistics, or why there are none.
type guestMemoryReport struct {
	id, line string
	err      error
}

// guestMemory reads the statistics of the guests that report them, in
// the order of the tasks' ids; a guest that reported none is said to.
func (s *service) guestMemory(ctx context.Context) []guestMemoryReport {
	s.mu.Lock()
	vms := make(map[string]launch.VM, len(s.tasks))
	for id, t := range s.tasks {
		vms[id] = t.vm
	}
	s.mu.Unlock()
	var out []guestMemoryReport
	for _, id := range slices.Sorted(maps.Keys(vms)) {
		r, ok := vms[id].(launch.GuestMemoryReporter)
		if !ok {
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, guestMemoryTimeout)
		line, err := r.GuestMemory(rctx)
		cancel()
		if err == nil && line == "" {
			line = "none reported (no balloon, statistics off, or no balloon driver in the guest)"
		}
		out = append(out, guestMemoryReport{id: id, line: line, err: err})
	}
	return out
}
