package launch

import (
	"context"
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

// openSavedState finds the state a suspend left on the VM's filesystem
// root-disk volume, if any, or the one in the checkpoint the task is
// created from, and checks that it goes with the disk just claimed
// (disk). It is loaded once QEMU runs (loadState). A state that does
// not go with the disk refuses the VM: booting would change the disk,
// and the state with it would never be resumable.
func (c *build) openSavedState(disk *os.File) error {
	v := c.desc.RootVolume
	if v == nil || v.Block {
		return nil
	}
	dir, name := v.HostDir, v.Path
	if c.r.Checkpoint != "" {
		dir, name = c.r.Checkpoint, v.Path+" (checkpoint)"
	}
	s, err := rootdisk.OpenState(dir, name)
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

// stateWhere names where the state resumed is: the root-disk volume, or
// the checkpoint the task is created from.
func (c *build) stateWhere() string {
	if c.r.Checkpoint != "" {
		return "the checkpoint"
	}
	return "root disk volume " + c.desc.RootVolume.Path
}

// resumeError is what becomes of a VM whose saved state it cannot resume
// (err says why): refused, with the state left on the volume, or, with
// vmshim.io/on-resume-error boot, the state removed and the disk booted.
// Errors of the host, not of the state, refuse the VM either way.
func (c *build) resumeError(err error) error {
	if !c.desc.ResumeErrorBoots || c.r.Checkpoint != "" || !(errdefs.IsInvalidArgument(err) || errdefs.IsFailedPrecondition(err)) {
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
// refusing a VM that differs from the one the state was saved from, and
// a task created from a checkpoint that holds no state it can resume.
func (c *build) incoming() error {
	if c.saved == nil && c.r.Checkpoint != "" {
		return fmt.Errorf("the checkpoint holds no VM state to resume: a VM is checkpointed, and restored, with its root disk on a filesystem volume (%s): %w",
			config.AnnotationRootDiskVolume, errdefs.ErrInvalidArgument)
	}
	if c.saved == nil {
		return nil
	}
	now := stateShape(&c.qs)
	if d := stateDiffers(c.saved.Info, now); d != "" {
		err := fmt.Errorf("%s holds a state saved %s from another VM: this one has %s: %w",
			c.stateWhere(), c.saved.Info.Saved.Format(time.RFC3339), d, errdefs.ErrFailedPrecondition)
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
		return c.resumeError(fmt.Errorf("%s holds a saved state, and its NICs cannot join the pod's network: %w", c.stateWhere(), err))
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
		err = fmt.Errorf("%s: resume the saved state: %w", c.stateWhere(), err)
		if !c.desc.ResumeErrorBoots || c.r.Checkpoint != "" || ctx.Err() != nil {
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
	c.log(fmt.Sprintf("vmshim: resumed the state saved on %s at %s, in %.1f s", strings.TrimPrefix(c.stateWhere(), "root disk "),
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
