package launch

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/vmshim/vmshim/config"
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
		Balloon:   qs.Balloon,
		TPM:       qs.TPMFD != 0,
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
	if saved.Balloon != now.Balloon {
		d = append(d, fmt.Sprintf("%s, not %s", balloonName(now.Balloon), balloonName(saved.Balloon)))
	}
	if saved.TPM != now.TPM {
		d = append(d, fmt.Sprintf("%s, not %s", tpmName(now.TPM), tpmName(saved.TPM)))
	}
	if len(saved.MACs) != len(now.MACs) {
		d = append(d, fmt.Sprintf("%d NICs, not %d", len(now.MACs), len(saved.MACs)))
	}
	return strings.Join(d, ", ")
}

// balloonName says whether a VM has a balloon, for stateDiffers.
func balloonName(has bool) string {
	if has {
		return "a balloon"
	}
	return "no balloon"
}

// tpmName says whether a VM has a TPM, for stateDiffers.
func tpmName(has bool) string {
	if has {
		return "a TPM"
	}
	return "no TPM"
}

// errSaved is a save of a VM saved already, which ends.
var errSaved = fmt.Errorf("the VM is saved already, and ends: %w", errdefs.ErrFailedPrecondition)

// saver saves a running VM's state, once: onto its root-disk volume at
// a stop (suspender), or into a checkpoint (Checkpoint). A VM is saved
// with its disk as the save leaves it, so it runs no more after a save:
// QEMU ends.
type saver struct {
	vol   *config.RootVolume
	shape rootdisk.StateInfo
	log   func(string)

	mu    sync.Mutex // held through a save
	saved bool
}

// newSaver is the saver of a VM whose root disk is on a filesystem
// volume, nil for any other.
func (c *build) newSaver() *saver {
	if c.desc.RootVolume == nil || c.desc.RootVolume.Block {
		return nil
	}
	return &saver{vol: c.desc.RootVolume, shape: stateShape(&c.qs), log: c.log}
}

// save stops the vCPUs and writes the state into what create makes,
// within ctx; once it is whole, said is told its size, and QEMU ends.
// On failure nothing is left, and the VM is paused, for the caller to
// run again or power off.
func (s *saver) save(ctx context.Context, vm *qemu.VM, create func() (*rootdisk.SavingState, error), said func(size int64)) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.saved {
		return 0, errSaved
	}
	var version struct {
		QEMU struct{ Major, Minor, Micro int } `json:"qemu"`
	}
	if err := vm.QMP().Execute(ctx, "query-version", nil, &version); err != nil {
		return 0, err
	}
	if err := vm.Pause(ctx); err != nil {
		return 0, err
	}
	st, err := create()
	if err != nil {
		return 0, err
	}
	if _, err := vm.QMP().SaveState(ctx, st.File); err != nil {
		st.Abort()
		return 0, err
	}
	// QEMU writes the disks no more once the save is complete (it has
	// flushed and let go of them), so the disk's stamp is the one the
	// state goes with; the state is committed before QEMU ends.
	info := s.shape
	info.QEMU = fmt.Sprintf("%d.%d.%d", version.QEMU.Major, version.QEMU.Minor, version.QEMU.Micro)
	info.Saved = time.Now().UTC()
	size, err := st.Commit(info)
	if err != nil {
		return 0, err
	}
	s.saved = true
	said(size)
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := vm.QMP().Quit(qctx); err != nil {
		log.G(ctx).WithError(err).Warn("quit after the save; killing qemu")
		_ = vm.Kill()
	}
	return size, nil
}

// checkpoint saves the VM into dir, a checkpoint containerd made, in
// the state format a suspend writes; QEMU then ends, and the task exits
// 0. On failure the VM is left paused.
func (s *saver) checkpoint(ctx context.Context, vm *qemu.VM, dir string) error {
	start := time.Now()
	_, err := s.save(ctx, vm, func() (*rootdisk.SavingState, error) {
		return rootdisk.CreateCheckpoint(dir, s.vol.HostDir, s.vol.Path)
	}, func(size int64) {
		s.log(fmt.Sprintf("vmshim: checkpointed: %.1f MiB written in %.1f s; the checkpoint goes with the disk on volume %s as it is now, and the VM ends",
			float64(size)/(1<<20), time.Since(start).Seconds(), s.vol.Path))
	})
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	return nil
}

// suspender saves a running VM onto its root-disk volume at a stop.
type suspender struct {
	*saver
	budget time.Duration // how long the save may take (saveBudget)

	once sync.Once
}

// newSuspender is the suspender of a VM that suspends on stop, nil for
// one that powers off.
func (c *build) newSuspender(s *saver) *suspender {
	if !c.desc.Suspend || s == nil {
		return nil
	}
	return &suspender{saver: s, budget: saveBudget(c.desc.StopGrace)}
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
	sctx, cancel := context.WithTimeout(ctx, s.budget)
	size, err := s.save(sctx, vm, func() (*rootdisk.SavingState, error) {
		return rootdisk.CreateState(s.vol.HostDir, s.vol.Path)
	}, func(size int64) {
		// Said before QEMU ends, while the container's log still takes
		// lines.
		s.log(fmt.Sprintf("vmshim: suspended: %.1f MiB written to volume %s in %.1f s", float64(size)/(1<<20), s.vol.Path, time.Since(start).Seconds()))
	})
	cancel()
	if errors.Is(err, context.DeadlineExceeded) {
		err = fmt.Errorf("the save did not finish within %.1f s, two thirds of the stop's grace period", s.budget.Seconds())
	}
	if err == nil {
		logger.WithField("bytes", size).Info("vm suspended")
		return
	}
	if errors.Is(err, errSaved) {
		return // a checkpoint saved it as the stop came
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
