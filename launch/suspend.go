package launch

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/vmshim/vmshim/config"
	"github.com/vmshim/vmshim/network"
	"github.com/vmshim/vmshim/qemu"
	"github.com/vmshim/vmshim/rootdisk"
)

// defaultStopGrace is the stop's grace period when the kubelet has not
// said (config.AnnotationTerminationGracePeriod): its default.
const defaultStopGrace = 30 * time.Second

// saveBudget bounds a save at a stop whose grace period is grace: two
// thirds of it, so that a save not done by then falls back to the power
// button while the guest still has a third to shut down in.
func saveBudget(grace time.Duration) time.Duration {
	if grace <= 0 {
		grace = defaultStopGrace
	}
	return grace * 2 / 3
}

// stateShape is what a state saved from a VM of qs holds, and what a VM
// that resumes it must be.
func stateShape(qs *qemu.Spec) rootdisk.StateInfo {
	info := rootdisk.StateInfo{
		Machine:   qs.Machine,
		Firmware:  firmwareName(qs),
		VCPUs:     qs.CPUs,
		Plugged:   max(qs.CPUs, qs.PluggedCPUs),
		MaxVCPUs:  max(qs.CPUs, qs.MaxCPUs),
		MemoryMiB: qs.MemoryMiB,
		ResizeMiB: qs.ResizeMiB,
	}
	if info.Machine == "" {
		info.Machine = config.MachineQ35
	}
	for _, n := range qs.NICs {
		info.MACs = append(info.MACs, n.MAC)
	}
	return info
}

// firmwareName names the firmware of qs, as the state records it.
func firmwareName(qs *qemu.Spec) string {
	switch {
	case qs.Firmware == nil:
		return config.FirmwareBIOS
	case qs.Firmware.SecureBoot:
		return config.FirmwareUEFISecure
	}
	return config.FirmwareUEFI
}

// stateDiffers names, in one line, what of now differs from the VM the
// state saved was saved from; "" when nothing that a resume needs does.
// The MACs may differ: the guest keeps the ones it had.
func stateDiffers(saved, now rootdisk.StateInfo) string {
	var d []string
	if saved.Machine != now.Machine {
		d = append(d, fmt.Sprintf("machine %s, not %s", now.Machine, saved.Machine))
	}
	if saved.Firmware != now.Firmware {
		d = append(d, fmt.Sprintf("firmware %s, not %s", now.Firmware, saved.Firmware))
	}
	if saved.VCPUs != now.VCPUs {
		d = append(d, fmt.Sprintf("%d vCPUs, not %d", now.VCPUs, saved.VCPUs))
	} else if saved.Plugged != now.Plugged {
		d = append(d, fmt.Sprintf("%d vCPUs present, not %d", now.Plugged, saved.Plugged))
	}
	if saved.MaxVCPUs != now.MaxVCPUs {
		d = append(d, fmt.Sprintf("room for %d vCPUs, not %d", now.MaxVCPUs, saved.MaxVCPUs))
	}
	if saved.MemoryMiB != now.MemoryMiB {
		d = append(d, fmt.Sprintf("%d MiB of guest RAM, not %d", now.MemoryMiB, saved.MemoryMiB))
	}
	if saved.ResizeMiB != now.ResizeMiB {
		d = append(d, fmt.Sprintf("guest RAM that can grow by %d MiB, not %d", now.ResizeMiB, saved.ResizeMiB))
	}
	if len(saved.MACs) != len(now.MACs) {
		d = append(d, fmt.Sprintf("%d NICs, not %d", len(now.MACs), len(saved.MACs)))
	}
	return strings.Join(d, ", ")
}

// openSavedState finds the state a suspend left on the VM's filesystem
// root-disk volume, if any, and checks that it goes with the disk just
// claimed (disk). It is loaded once QEMU runs (loadState). A
// state that does not go with the disk refuses the VM: booting would
// change the disk, and the state with it would never be resumable.
func (c *build) openSavedState(disk *os.File) error {
	v := c.desc.RootVolume
	if v == nil || v.Block {
		return nil
	}
	s, err := rootdisk.OpenState(v.HostDir, v.Path)
	if err != nil {
		return c.resumeError(err)
	}
	if s == nil {
		return nil
	}
	c.saved = s // closed by closeFiles
	if err := s.CheckDisk(disk); err != nil {
		return c.resumeError(err)
	}
	return nil
}

// resumeError is what becomes of a VM whose saved state it cannot resume
// (err says why): refused, with the state left on the volume, or, with
// vmshim.io/on-resume-error boot, the state removed and the disk booted.
// Errors of the host, not of the state, refuse the VM either way.
func (c *build) resumeError(err error) error {
	if !c.desc.ResumeErrorBoots || !(errdefs.IsInvalidArgument(err) || errdefs.IsFailedPrecondition(err)) {
		return err
	}
	v := c.desc.RootVolume
	if c.saved != nil {
		c.saved.Close()
		c.saved = nil
	}
	if rerr := rootdisk.RemoveState(v.HostDir, v.Path); rerr != nil {
		return fmt.Errorf("%w; and it could not be removed to boot the disk: %v", err, rerr)
	}
	c.log(fmt.Sprintf("vmshim: the state saved on volume %s cannot be resumed and is removed (%s: %s); booting the disk: %v",
		v.Path, config.AnnotationOnResumeError, config.OnResumeErrorBoot, err))
	c.logger.WithError(err).Warn("saved state removed; booting the disk")
	return nil
}

// incoming readies QEMU to load the saved state instead of booting,
// refusing a VM that differs from the one the state was saved from.
func (c *build) incoming() error {
	if c.saved == nil {
		return nil
	}
	now := stateShape(&c.qs)
	if d := stateDiffers(c.saved.Info, now); d != "" {
		err := fmt.Errorf("root disk volume %s holds a state saved %s from another VM: this one has %s: %w",
			c.desc.RootVolume.Path, c.saved.Info.Saved.Format(time.RFC3339), d, errdefs.ErrFailedPrecondition)
		if err := c.resumeError(err); err != nil || c.saved == nil {
			return err
		}
	}
	c.qs.Incoming = true
	return nil
}

// adoptMACs gives the pod's interfaces the MACs of the guest a saved
// state holds, before the network step reads them: the resumed guest's
// NICs keep their MACs, and the taps and the responders must serve
// those.
func (c *build) adoptMACs() error {
	if c.saved == nil || c.nsPath == "" {
		return nil
	}
	if err := network.AdoptMACs(c.nsPath, c.saved.Info.MACs); err != nil {
		return c.resumeError(fmt.Errorf("root disk volume %s holds a saved state, and its NICs cannot join the pod's network: %w", c.desc.RootVolume.Path, err))
	}
	return nil
}

// loadState loads the saved state into the QEMU just started, and takes
// it off the volume before the guest runs: it is resumed once. The
// guest's NICs are taken down, to come back up once it runs (relinker),
// so that it asks the new pod's network for its addresses.
func (c *build) loadState(ctx context.Context, vm *qemu.VM) (*relinker, error) {
	if c.saved == nil {
		return nil, nil
	}
	start := time.Now()
	if _, err := vm.QMP().LoadState(ctx, c.saved.File); err != nil {
		err = fmt.Errorf("root disk volume %s: resume the saved state: %w", c.desc.RootVolume.Path, err)
		if !c.desc.ResumeErrorBoots || ctx.Err() != nil {
			return nil, err
		}
		// QEMU waits for a state, and cannot boot now; the next start
		// boots the disk.
		if terr := c.saved.Take(); terr != nil {
			return nil, fmt.Errorf("%w; and it could not be removed: %v", err, terr)
		}
		return nil, fmt.Errorf("%w; it is removed (%s: %s), and the next start boots the disk", err, config.AnnotationOnResumeError, config.OnResumeErrorBoot)
	}
	if err := c.saved.Take(); err != nil {
		return nil, err
	}
	r := &relinker{logger: c.logger}
	for _, n := range c.qs.NICs {
		if err := vm.QMP().SetLink(ctx, n.ID, false); err != nil {
			return nil, fmt.Errorf("take the resumed guest's %s down: %w", n.ID, err)
		}
		r.nics = append(r.nics, n.ID)
	}
	c.log(fmt.Sprintf("vmshim: resumed the state saved on volume %s at %s, in %.1f s", c.desc.RootVolume.Path,
		c.saved.Info.Saved.Format(time.RFC3339), time.Since(start).Seconds()))
	return r, nil
}

// relinkDelay is how long a resumed guest runs with its NICs down before
// they come up: long enough for its kernel to have seen the carrier go,
// so that its network manager sees it come back and asks for addresses.
const relinkDelay = time.Second

// relinker brings a resumed guest's NICs up once it runs.
type relinker struct {
	nics   []string
	logger *log.Entry
	once   sync.Once
}

// start brings the NICs up relinkDelay from now, in the background. A
// nil relinker does nothing.
func (r *relinker) start(ctx context.Context, vm *qemu.VM) {
	if r == nil {
		return
	}
	r.once.Do(func() {
		ctx := context.WithoutCancel(ctx)
		go func() {
			select {
			case <-vm.Done():
				return
			case <-time.After(relinkDelay):
			}
			ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			for _, id := range r.nics {
				if err := vm.QMP().SetLink(ctx, id, true); err != nil {
					r.logger.WithError(err).WithField("nic", id).Warn("bring the resumed guest's nic up")
				}
			}
		}()
	})
}

// suspender saves a running VM onto its root-disk volume at a stop.
type suspender struct {
	vol    *config.RootVolume
	shape  rootdisk.StateInfo
	log    func(string)
	budget time.Duration // how long the save may take (saveBudget)

	once sync.Once
}

// newSuspender is the suspender of a VM that suspends on stop, nil for
// one that powers off.
func (c *build) newSuspender() *suspender {
	if !c.desc.Suspend || c.desc.RootVolume == nil || c.desc.RootVolume.Block {
		return nil
	}
	return &suspender{vol: c.desc.RootVolume, shape: stateShape(&c.qs), log: c.log, budget: saveBudget(c.desc.StopGrace)}
}

// start saves the VM in the background, once: the stop returns at once,
// and QEMU ends when the state is whole, or the guest powers off when it
// cannot be saved.
func (s *suspender) start(ctx context.Context, vm *qemu.VM) {
	s.once.Do(func() {
		ctx := context.WithoutCancel(ctx)
		go s.run(ctx, vm)
	})
}

func (s *suspender) run(ctx context.Context, vm *qemu.VM) {
	logger := log.G(ctx).WithField("volume", s.vol.Path)
	start := time.Now()
	size, err := s.save(ctx, vm)
	if err == nil {
		// Said before QEMU ends, while the container's log still takes
		// lines.
		s.log(fmt.Sprintf("vmshim: suspended: %.1f MiB written to volume %s in %.1f s", float64(size)/(1<<20), s.vol.Path, time.Since(start).Seconds()))
		logger.WithField("bytes", size).Info("vm suspended")
		qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := vm.QMP().Quit(qctx); err != nil {
			logger.WithError(err).Warn("quit after the save; killing qemu")
			_ = vm.Kill()
		}
		return
	}
	select {
	case <-vm.Done():
		logger.WithError(err).Warn("the vm ended while it was saved; nothing resumable is left")
		return
	default:
	}
	s.log(fmt.Sprintf("vmshim: suspend failed, nothing is left on volume %s: %v; pressing the power button", s.vol.Path, err))
	logger.WithError(err).Warn("suspend failed; powering down")
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := vm.Resume(cctx); err != nil {
		logger.WithError(err).Warn("cont after a failed suspend")
	}
	if err := vm.Powerdown(cctx); err != nil {
		logger.WithError(err).Warn("power button after a failed suspend")
	}
}

// save stops the vCPUs and writes the state; QEMU, its vCPUs stopped
// for good ("postmigrate"), is for the caller to end.
func (s *suspender) save(ctx context.Context, vm *qemu.VM) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, s.budget)
	defer cancel()
	var version struct {
		QEMU struct{ Major, Minor, Micro int } `json:"qemu"`
	}
	if err := vm.QMP().Execute(ctx, "query-version", nil, &version); err != nil {
		return 0, err
	}
	if err := vm.Pause(ctx); err != nil {
		return 0, err
	}
	st, err := rootdisk.CreateState(s.vol.HostDir, s.vol.Path)
	if err != nil {
		return 0, err
	}
	if _, err := vm.QMP().SaveState(ctx, st.File); err != nil {
		st.Abort()
		if errors.Is(err, context.DeadlineExceeded) {
			return 0, fmt.Errorf("the save did not finish within %.1f s, two thirds of the stop's grace period", s.budget.Seconds())
		}
		return 0, err
	}
	// QEMU writes the disks no more once the save is complete (it has
	// flushed and let go of them), so the disk's stamp is the one the
	// state goes with; the state is committed before QEMU ends.
	info := s.shape
	info.QEMU = fmt.Sprintf("%d.%d.%d", version.QEMU.Major, version.QEMU.Minor, version.QEMU.Micro)
	info.Saved = time.Now().UTC()
	return st.Commit(info)
}
