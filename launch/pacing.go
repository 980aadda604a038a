package launch

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/containerd/log"

	"github.com/vmshim/vmshim/bootslot"
	"github.com/vmshim/vmshim/config"
	"github.com/vmshim/vmshim/qemu"
)

// bootSlotsDir holds the node's boot slots, shared by every shim.
const bootSlotsDir = runtimeRoot + "/boot-slots"

// pastEarlyBoot is the guest kernel's clock past which its boot no longer
// needs a slot: Linux's timer checks, which fail when a TCG guest gets
// too little CPU, are behind it (they run in its first second).
const pastEarlyBoot = 2 * time.Second

// pacedRunTimeout bounds the call that runs the vCPUs of a VM that
// waited for its slot (QMP cont, which QEMU answers at once).
const pacedRunTimeout = 10 * time.Second

// bootSlots is how many of the node's VMs may boot at once, for the
// config's boot_slots and the accelerator: 0 when boots are not paced.
// Under TCG a guest's boot is CPU-bound, so the default is the host's
// CPUs; under KVM nothing waits unless the config says so.
func bootSlots(n int, accel qemu.Accel) int {
	switch {
	case n > 0:
		return n
	case n < 0 || accel != qemu.AccelTCG:
		return 0
	}
	return runtime.NumCPU()
}

// pacer holds a booting VM's vCPUs until it has one of the node's boot
// slots, and gives the slot back once the guest is past its early boot
// (its kernel's clock reached pastEarlyBoot), after hold at most, or when
// QEMU ends. While it waits, the task is running and the VM stopped; its
// log says that it waits, and how long it waited once it boots.
type pacer struct {
	slots  *bootslot.Slots
	n      int
	hold   time.Duration
	logger *log.Entry
	note   func(string) // writes a line into the task's log

	mu      sync.Mutex    // guards the fields below
	waiting bool          // the VM waits for a slot
	gaveUp  bool          // the wait was abandoned: the VM never boots
	paused  bool          // the task was paused while it waited
	resumed chan struct{} // closed when a paused wait may go on; nil while not paused
	cancel  context.CancelFunc
	slot    *bootslot.Slot // the slot held; nil when none is
	booted  bool           // the guest is past its early boot
}

// newPacer returns the pacer for a VM, or nil when boots are not paced.
func newPacer(cfg config.Config, accel qemu.Accel, logger *log.Entry) (*pacer, error) {
	n := bootSlots(cfg.BootSlots, accel)
	if n == 0 {
		return nil, nil
	}
	slots, err := bootslot.New(bootSlotsDir, n)
	if err != nil {
		return nil, fmt.Errorf("boot slots: %w", err)
	}
	return &pacer{slots: slots, n: n, hold: cfg.BootSlotHoldDuration(), logger: logger}, nil
}

// start runs the VM's vCPUs (run) once it holds a slot: at once when one
// is free, else in the background once one is, and start returns nil
// at once. done is closed once QEMU has exited.
func (p *pacer) start(ctx context.Context, run func(context.Context) error, done <-chan struct{}) error {
	slot, ok, err := p.slots.TryAcquire()
	if err != nil {
		// Pacing is a courtesy to the node's other guests: a broken
		// slot directory does not keep this one from booting.
		p.logger.WithError(err).Warn("boot slots, booting unpaced")
		return run(ctx)
	}
	if ok {
		if err := run(ctx); err != nil {
			slot.Release()
			return err
		}
		p.held(slot, done)
		return nil
	}
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	p.mu.Lock()
	p.waiting, p.cancel = true, cancel
	p.mu.Unlock()
	p.note(fmt.Sprintf("waiting to boot: the node's %d boot slots are taken by guests that are booting", p.n))
	p.logger.WithField("slots", p.n).Info("vm waits for a boot slot")
	go p.wait(wctx, run, done)
	return nil
}

// wait takes a slot once one is free and the task is not paused, and
// runs the vCPUs; it gives up when ctx ends or QEMU does.
func (p *pacer) wait(ctx context.Context, run func(context.Context) error, done <-chan struct{}) {
	defer p.cancelWait()
	begin := time.Now()
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		select {
		case <-done:
			stop()
		case <-ctx.Done():
		}
	}()
	for {
		if resumed := p.pausedWait(); resumed != nil {
			select {
			case <-resumed:
			case <-ctx.Done():
				return
			}
		}
		slot, err := p.slots.Acquire(ctx)
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.gaveUp {
			p.mu.Unlock()
			slot.Release()
			return
		}
		if p.paused {
			p.mu.Unlock()
			slot.Release()
			continue
		}
		p.waiting = false
		p.mu.Unlock()
		waited := time.Since(begin).Round(100 * time.Millisecond)
		runCtx, cancel := context.WithTimeout(ctx, pacedRunTimeout)
		err = run(runCtx)
		cancel()
		if err != nil {
			slot.Release()
			p.logger.WithError(err).Error("start the vm's vcpus after its wait for a boot slot")
			p.note(fmt.Sprintf("could not boot after waiting %s for a boot slot: %v", waited, err))
			return
		}
		p.note(fmt.Sprintf("booting after waiting %s for a boot slot", waited))
		p.logger.WithField("waited", waited).Info("vm boots")
		p.held(slot, done)
		return
	}
}

// pausedWait returns a channel closed when the paused task resumes, or
// nil when it is not paused.
func (p *pacer) pausedWait() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.paused {
		return nil
	}
	return p.resumed
}

// cancelWait ends the wait's context and marks it over.
func (p *pacer) cancelWait() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.waiting = false
	if p.cancel != nil {
		p.cancel()
	}
}

// held keeps slot until the guest is past its early boot, hold has
// passed, or QEMU ended (done).
func (p *pacer) held(slot *bootslot.Slot, done <-chan struct{}) {
	p.mu.Lock()
	if p.booted {
		p.mu.Unlock()
		slot.Release()
		return
	}
	p.slot = slot
	p.mu.Unlock()
	go func() {
		t := time.NewTimer(p.hold)
		defer t.Stop()
		select {
		case <-t.C:
		case <-done:
		}
		p.release()
	}()
}

// seen is told of the guest's console output: once its kernel's clock
// passed pastEarlyBoot, the slot goes back.
func (p *pacer) seen(w interface{ KernelTime() time.Duration }) {
	p.mu.Lock()
	if p.booted || w.KernelTime() < pastEarlyBoot {
		p.mu.Unlock()
		return
	}
	p.booted = true
	p.mu.Unlock()
	p.release()
}

// release gives the slot back, if one is held.
func (p *pacer) release() {
	p.mu.Lock()
	slot := p.slot
	p.slot = nil
	p.mu.Unlock()
	if slot != nil {
		slot.Release()
	}
}

// close gives back the slot and the slots' directory: QEMU has ended.
func (p *pacer) close() {
	p.release()
	_ = p.slots.Close()
}

// pause keeps a waiting VM from booting when a slot frees; it reports
// whether the VM waits (its vCPUs are stopped already).
func (p *pacer) pause() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.waiting {
		return false
	}
	if !p.paused {
		p.paused, p.resumed = true, make(chan struct{})
	}
	return true
}

// resume lets a paused waiting VM boot once a slot frees; it reports
// whether the VM waits (and so must not run yet).
func (p *pacer) resume() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.paused {
		p.paused = false
		close(p.resumed)
	}
	return p.waiting
}

// abandon ends a wait for a slot; it reports whether the VM was waiting,
// and so never booted.
func (p *pacer) abandon() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.waiting {
		return false
	}
	p.waiting, p.gaveUp = false, true
	p.cancel()
	return true
}
