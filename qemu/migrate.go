package qemu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// stateFD is the name the fd of a saved state goes by in QEMU (getfd).
const stateFD = "vmshim-state"

// saveBandwidth is the bandwidth a save may use, in bytes per second:
// as much as the volume takes.
const saveBandwidth = int64(1) << 40

// migratePoll is how often the state of a save or a load is asked for.
const migratePoll = 50 * time.Millisecond

// MigrationInfo is what query-migrate reports of a save or a load.
type MigrationInfo struct {
	Status    string `json:"status"`
	ErrorDesc string `json:"error-desc"`
	RAM       *struct {
		Transferred int64 `json:"transferred"`
		Total       int64 `json:"total"`
	} `json:"ram"`
}

// SaveState writes the stopped VM's state (RAM and devices, QEMU's
// migration stream) to f from its current offset: QEMU gets f as an fd,
// never a path. It returns once QEMU has written it all; the VM then
// stays stopped ("postmigrate"), for Quit. When ctx ends first, the save
// is cancelled and what f holds is not a state.
func (c *Client) SaveState(ctx context.Context, f *os.File) (MigrationInfo, error) {
	// QEMU throttles a migration to 128 MiB/s unless told otherwise: a
	// save to a file of a stopped VM has no link to spare.
	if err := c.Execute(ctx, "migrate-set-parameters", map[string]any{"max-bandwidth": saveBandwidth}, nil); err != nil {
		return MigrationInfo{}, fmt.Errorf("save state: %w", err)
	}
	info, err := c.migrateFD(ctx, "migrate", f)
	if err != nil && ctx.Err() != nil {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = c.Execute(cctx, "migrate_cancel", nil, nil)
	}
	if err != nil {
		return info, fmt.Errorf("save state: %w", err)
	}
	return info, nil
}

// LoadState reads a state SaveState wrote from f, at its current offset,
// into a VM QEMU started with Incoming. It returns once the state is
// loaded; the VM is then paused, for Cont.
func (c *Client) LoadState(ctx context.Context, f *os.File) (MigrationInfo, error) {
	info, err := c.migrateFD(ctx, "migrate-incoming", f)
	if err != nil {
		return info, fmt.Errorf("load state: %w", err)
	}
	return info, nil
}

// migrateFD passes f to QEMU and runs cmd (migrate or migrate-incoming)
// on it, until the migration ends.
func (c *Client) migrateFD(ctx context.Context, cmd string, f *os.File) (MigrationInfo, error) {
	if err := c.SendFD(ctx, stateFD, f); err != nil {
		return MigrationInfo{}, err
	}
	if err := c.Execute(ctx, cmd, map[string]string{"uri": "fd:" + stateFD}, nil); err != nil {
		c.closeFD(stateFD)
		return MigrationInfo{}, err
	}
	return c.waitMigration(ctx)
}

// closeFD drops an fd passed with SendFD that no command took.
func (c *Client) closeFD(name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = c.Execute(ctx, "closefd", map[string]string{"fdname": name}, nil)
}

// waitMigration polls query-migrate until the save or load ends.
func (c *Client) waitMigration(ctx context.Context) (MigrationInfo, error) {
	var info MigrationInfo
	err := wait.PollUntilContextCancel(ctx, migratePoll, true, func(ctx context.Context) (bool, error) {
		info = MigrationInfo{}
		if err := c.Execute(ctx, "query-migrate", nil, &info); err != nil {
			return false, err
		}
		switch info.Status {
		case "completed":
			return true, nil
		case "failed", "cancelled":
			if info.ErrorDesc != "" {
				return false, errors.New(info.ErrorDesc)
			}
			return false, fmt.Errorf("migration %s", info.Status)
		}
		return false, nil
	})
	return info, err
}

// SetLink sets the link of the guest NIC nicID (a Spec NIC's ID) up or
// down, as a cable put back or pulled: the guest sees its carrier change.
func (c *Client) SetLink(ctx context.Context, nicID string, up bool) error {
	return c.Execute(ctx, "set_link", map[string]any{"name": NICDeviceID(nicID), "up": up}, nil)
}
