package shim

import (
	"github.com/vmshim/vmshim/thread"

	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"

	"github.com/containerd/errdefs"
	sddbus "github.com/coreos/go-systemd/v22/dbus"
	godbus "github.com/godbus/dbus/v5"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/proto"
)

// scopeCgroup is a cgroup under the systemd driver: a transient scope that
// systemd creates around the first process added, with our limits written
// into its delegated directories.
type scopeCgroup struct {
	host cgroupHost
	p    cgroupPath
	v2   bool

	mu    sync.Mutex            // guards res and inner
	res   *specs.LinuxResources // limits to apply when the scope is made
	inner taskCgroup            // the scope's directories; nil until the first Add
}

// Add starts the scope with pid in it on first use, then applies the limits.
func (c *scopeCgroup) Add(pid int) (retErr error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.inner != nil {
		return c.inner.Add(pid)
	}
	if pid <= 0 {
		return fmt.Errorf("add pid %d to cgroup %s: %w", pid, c.p.raw, errdefs.ErrInvalidArgument)
	}
	ctx, cancel := context.WithTimeout(context.Background(), systemdTimeout)
	defer cancel()
	if err := c.host.units.startScope(ctx, c.p.slice, c.p.unit, pid); err != nil {
		return cgroupError("start systemd scope "+c.p.unit+" for", c.p.raw, err, errdefs.ErrUnavailable)
	}
	var inner taskCgroup
	defer func() {
		if retErr == nil {
			return
		}
		if err := c.host.units.stopUnit(ctx, c.p.unit); err != nil {
			retErr = errors.Join(retErr, cgroupError("stop systemd scope "+c.p.unit+" of", c.p.raw, err, errdefs.ErrUnavailable))
		}
		if inner != nil {
			retErr = errors.Join(retErr, inner.Delete())
		}
	}()
	var err error
	if inner, err = c.host.newDirs(c.p, c.v2, c.res); err != nil {
		return err
	}
	// On v1 this also joins the hierarchies systemd does not manage.
	if err = inner.Add(pid); err != nil {
		return err
	}
	c.inner = inner
	return nil
}

// Start starts cmd straight into the scope's cgroup, so that all it
// touches from its first page on is charged there. systemd makes a scope
// only around a running process: a new scope is made around a placeholder
// process, which goes once cmd is in.
func (c *scopeCgroup) Start(cmd *exec.Cmd, steps ...thread.Step) error {
	c.mu.Lock()
	inner := c.inner
	c.mu.Unlock()
	if inner == nil {
		hold, err := c.host.hold()
		if err != nil {
			return cgroupError("start the placeholder process of systemd scope "+c.p.unit+" for", c.p.raw, err, errdefs.ErrUnknown)
		}
		defer stopPlaceholder(hold)
		if err := c.Add(hold.Process.Pid); err != nil {
			return err
		}
		c.mu.Lock()
		inner = c.inner
		c.mu.Unlock()
	}
	return inner.Start(cmd, steps...)
}

// startPlaceholder starts a process that waits, with no privileges, until
// it is killed: the shim binary as a pause process.
func startPlaceholder() (*exec.Cmd, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := &exec.Cmd{Path: self, Args: []string{PauseName, "scope-placeholder"}, Dir: "/"}
	return cmd, cmd.Start()
}

// stopPlaceholder kills a placeholder process and reaps it.
func stopPlaceholder(cmd *exec.Cmd) {
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
}

// Update applies r now, or when the scope is made.
func (c *scopeCgroup) Update(r *specs.LinuxResources) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.inner == nil {
		if r == nil {
			r = &specs.LinuxResources{}
		}
		c.res = r
		return nil
	}
	return c.inner.Update(r)
}

// Stats reads the scope's metrics.
func (c *scopeCgroup) Stats() (proto.Message, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.inner == nil {
		return nil, fmt.Errorf("read stats of cgroup %s: no process added yet: %w", c.p.raw, errdefs.ErrFailedPrecondition)
	}
	return c.inner.Stats()
}

// Delete stops the scope and removes what is left of its directories.
func (c *scopeCgroup) Delete() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.inner == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), systemdTimeout)
	defer cancel()
	if err := c.host.units.stopUnit(ctx, c.p.unit); err != nil {
		return cgroupError("stop systemd scope "+c.p.unit+" of", c.p.raw, err, errdefs.ErrUnavailable)
	}
	return c.inner.Delete()
}

// Path returns the cgroups path the cgroup was made from.
func (c *scopeCgroup) Path() string { return c.p.raw }

// MemoryDir is the scope's memory directory, once the scope is made.
func (c *scopeCgroup) MemoryDir() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.inner == nil {
		return ""
	}
	return c.inner.MemoryDir()
}

// systemdUnits starts and stops the scope units of the systemd driver.
type systemdUnits interface {
	// startScope starts unit in slice with pid in it, delegated to us.
	startScope(ctx context.Context, slice, unit string, pid int) error
	// stopUnit stops unit; a unit that does not exist is stopped.
	stopUnit(ctx context.Context, unit string) error
}

// dbusUnits drives systemd over D-Bus.
type dbusUnits struct{}

func (dbusUnits) startScope(ctx context.Context, slice, unit string, pid int) error {
	props := []sddbus.Property{
		sddbus.PropDescription("vmshim task " + unit),
		sddbus.PropSlice(slice),
		sddbus.PropPids(uint32(pid)),
		{Name: "Delegate", Value: godbus.MakeVariant(true)},
		{Name: "DefaultDependencies", Value: godbus.MakeVariant(false)},
	}
	return systemdJob(ctx, func(conn *sddbus.Conn, done chan<- string) (int, error) {
		return conn.StartTransientUnitContext(ctx, unit, "replace", props, done)
	})
}

func (dbusUnits) stopUnit(ctx context.Context, unit string) error {
	err := systemdJob(ctx, func(conn *sddbus.Conn, done chan<- string) (int, error) {
		return conn.StopUnitContext(ctx, unit, "replace", done)
	})
	var dbusErr godbus.Error
	if errors.As(err, &dbusErr) && dbusErr.Name == "org.freedesktop.systemd1.NoSuchUnit" {
		return nil
	}
	return err
}

// systemdJob connects to systemd, queues a job with call and waits for it.
func systemdJob(ctx context.Context, call func(*sddbus.Conn, chan<- string) (int, error)) error {
	conn, err := sddbus.NewWithContext(ctx)
	if err != nil {
		return fmt.Errorf("connect to systemd: %w", err)
	}
	defer conn.Close()
	done := make(chan string, 1) // buffered: go-systemd must not block if we stop waiting
	if _, err := call(conn, done); err != nil {
		return err
	}
	select {
	case result := <-done:
		if result != "done" {
			return fmt.Errorf("systemd job result %q", result)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
