package cgroup

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/big"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/containerd/errdefs"
	sddbus "github.com/coreos/go-systemd/v22/dbus"
	godbus "github.com/godbus/dbus/v5"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/proto"

	"github.com/vmshim/vmshim/thread"
)

// scopeCgroup is a cgroup under the systemd driver: a transient scope that
// systemd creates around the first process added, with our limits both
// as the unit's properties (so that systemd keeps them across a
// daemon-reload) and written into its delegated directories (exact).
type scopeCgroup struct {
	host  Host
	p     cgPath
	v2    bool
	extra []sddbus.Property // more properties of the unit, set before the first Add

	mu    sync.Mutex            // guards res and inner
	res   *specs.LinuxResources // limits to apply when the scope is made
	inner Cgroup                // the scope's directories; nil until the first Add
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
	if err := c.host.units.startScope(ctx, c.p.slice, c.p.unit, pid, append(scopeProperties(c.res, c.v2), c.extra...)); err != nil {
		return wrapError("start systemd scope "+c.p.unit+" for", c.p.raw, err, errdefs.ErrUnavailable)
	}
	var inner Cgroup
	defer func() {
		if retErr == nil {
			return
		}
		if err := c.host.units.stopUnit(ctx, c.p.unit); err != nil {
			retErr = errors.Join(retErr, wrapError("stop systemd scope "+c.p.unit+" of", c.p.raw, err, errdefs.ErrUnavailable))
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
// only around a running process, and removes it once none is left: a new
// scope is made around a placeholder process, which stays until Delete
// stops the scope, so the scope (and its OOM kill count) outlives cmd.
// For that, the placeholder must be one the OOM killer never picks
// (oom_score_adj -1000, which Host's placeholder function sees to), and
// the scope must not stop when cmd is OOM-killed (oomPolicy).
func (c *scopeCgroup) Start(cmd *exec.Cmd, steps ...thread.Step) error {
	c.mu.Lock()
	inner := c.inner
	c.mu.Unlock()
	if inner != nil {
		return inner.Start(cmd, steps...)
	}
	hold, err := c.host.hold()
	if err != nil {
		return wrapError("start the placeholder process of systemd scope "+c.p.unit+" for", c.p.raw, err, errdefs.ErrUnknown)
	}
	// Reaped whenever it ends: when Delete stops the scope, at the latest.
	reaped := make(chan struct{})
	go func() { _ = hold.Wait(); close(reaped) }()
	if err := c.Add(hold.Process.Pid); err != nil {
		_ = hold.Process.Kill()
		<-reaped
		return err
	}
	c.mu.Lock()
	inner = c.inner
	c.mu.Unlock()
	if err := inner.Start(cmd, steps...); err != nil {
		_ = hold.Process.Kill()
		<-reaped
		return err
	}
	return nil
}

// Update applies r now, or when the scope is made: to the scope's
// directories and to the unit's properties.
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
	if err := c.inner.Update(r); err != nil {
		return err
	}
	props := scopeProperties(r, c.v2)
	if len(props) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), systemdTimeout)
	defer cancel()
	if err := c.host.units.setProperties(ctx, c.p.unit, props); err != nil {
		return wrapError("set the limits of systemd scope "+c.p.unit+" of", c.p.raw, err, errdefs.ErrUnavailable)
	}
	return nil
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
		return wrapError("stop systemd scope "+c.p.unit+" of", c.p.raw, err, errdefs.ErrUnavailable)
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
	// startScope starts unit in slice with pid in it, delegated to us,
	// with the resource properties given.
	startScope(ctx context.Context, slice, unit string, pid int, res []sddbus.Property) error
	// setProperties changes a running unit's resource properties.
	setProperties(ctx context.Context, unit string, res []sddbus.Property) error
	// stopUnit stops unit; a unit that does not exist is stopped.
	stopUnit(ctx context.Context, unit string) error
}

// dbusUnits drives systemd over D-Bus.
type dbusUnits struct{}

func (dbusUnits) startScope(ctx context.Context, slice, unit string, pid int, res []sddbus.Property) error {
	props := append([]sddbus.Property{
		sddbus.PropDescription("vmshim task " + unit),
		sddbus.PropSlice(slice),
		sddbus.PropPids(uint32(pid)),
		{Name: "Delegate", Value: godbus.MakeVariant(true)},
		{Name: "DefaultDependencies", Value: godbus.MakeVariant(false)},
	}, res...)
	return systemdJob(ctx, func(conn *sddbus.Conn, done chan<- string) (int, error) {
		version, err := conn.GetManagerProperty("Version")
		if err != nil {
			return 0, fmt.Errorf("read systemd's version: %w", err)
		}
		return conn.StartTransientUnitContext(ctx, unit, "replace", append(props, oomPolicy(version)...), done)
	})
}

// oomPolicy keeps a scope running when the kernel's OOM killer kills one
// of its processes (OOMPolicy=continue), on systemd 253 and later, whose
// scopes otherwise stop on an OOM kill (the default policy, stop). A
// stopped scope loses its cgroup, and with it the oom_kill count the
// task has yet to read: the scope must outlive the VM's process until the
// task is deleted (see Start). Older systemd never stops a scope for an
// OOM kill and has no such property for scopes. version is the manager's
// Version property as go-systemd gives it ("\"252.30-1~deb12u2\"").
func oomPolicy(version string) []sddbus.Property {
	major, ok := systemdMajor(version)
	if !ok || major < 253 {
		return nil
	}
	return []sddbus.Property{{Name: "OOMPolicy", Value: godbus.MakeVariant("continue")}}
}

// systemdMajor reads the leading number of systemd's version.
func systemdMajor(version string) (int, bool) {
	v := strings.Trim(strings.TrimSpace(version), `"`)
	end := strings.IndexFunc(v, func(r rune) bool { return r < '0' || r > '9' })
	if end < 0 {
		end = len(v)
	}
	n, err := strconv.Atoi(v[:end])
	return n, err == nil
}

func (dbusUnits) setProperties(ctx context.Context, unit string, res []sddbus.Property) error {
	conn, err := sddbus.NewWithContext(ctx)
	if err != nil {
		return fmt.Errorf("connect to systemd: %w", err)
	}
	defer conn.Close()
	return conn.SetUnitPropertiesContext(ctx, unit, true, res...)
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

// scopeProperties are r's limits as systemd unit properties, as runc's
// systemd driver sets them, so that systemd writes the same limits when it
// reloads. A CPU quota is given per second, rounded up to 10 ms (systemd
// keeps whole percents); the period only when it is not the default, and
// the cpuset only when one is given, as older systemd lacks both.
func scopeProperties(r *specs.LinuxResources, v2 bool) []sddbus.Property {
	if r == nil {
		return nil
	}
	var props []sddbus.Property
	add := func(name string, v any) {
		props = append(props, sddbus.Property{Name: name, Value: godbus.MakeVariant(v)})
	}
	if m := r.Memory; m != nil && m.Limit != nil && *m.Limit > 0 {
		if v2 {
			add("MemoryMax", uint64(*m.Limit))
			switch {
			case m.Swap != nil && *m.Swap == -1:
				add("MemorySwapMax", uint64(math.MaxUint64))
			case m.Swap != nil && *m.Swap >= *m.Limit:
				add("MemorySwapMax", uint64(*m.Swap-*m.Limit))
			}
		} else {
			add("MemoryLimit", uint64(*m.Limit))
		}
	}
	if c := r.CPU; c != nil {
		if c.Shares != nil && *c.Shares > 0 {
			if v2 {
				add("CPUWeight", cpuWeight(*c.Shares))
			} else {
				add("CPUShares", *c.Shares)
			}
		}
		if c.Quota != nil && *c.Quota > 0 {
			period := uint64(defaultCPUPeriod)
			if c.Period != nil && *c.Period > 0 {
				period = *c.Period
			}
			if period != defaultCPUPeriod {
				add("CPUQuotaPeriodUSec", period)
			}
			perSec := uint64(*c.Quota) * 1_000_000 / period
			if perSec%10_000 != 0 {
				perSec = (perSec/10_000 + 1) * 10_000
			}
			add("CPUQuotaPerSecUSec", perSec)
		}
		if v2 && c.Cpus != "" {
			if bits, err := cpusetBits(c.Cpus); err == nil {
				add("AllowedCPUs", bits)
			}
		}
		if v2 && c.Mems != "" {
			if bits, err := cpusetBits(c.Mems); err == nil {
				add("AllowedMemoryNodes", bits)
			}
		}
	}
	if p := r.Pids; p != nil && p.Limit != nil && *p.Limit > 0 {
		add("TasksMax", uint64(*p.Limit))
	}
	return props
}

// defaultCPUPeriod is the CFS period, in µs, the kernel and systemd use
// unless told otherwise.
const defaultCPUPeriod = 100_000

// cpuWeight maps cgroup v1 CPU shares (2..262144) to a cgroup v2 weight
// (1..10000), as runc and the kubelet do.
func cpuWeight(shares uint64) uint64 {
	if shares < 2 {
		shares = 2
	}
	if shares > 262144 {
		shares = 262144
	}
	return 1 + ((shares-2)*9999)/262142
}

// cpusetBits turns a cpuset list ("0-3,8") into the byte mask systemd's
// AllowedCPUs and AllowedMemoryNodes take: bit n of the mask's byte n/8,
// lowest byte first.
func cpusetBits(list string) ([]byte, error) {
	bits := new(big.Int)
	for _, part := range strings.Split(list, ",") {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(part), "-")
		first, err := strconv.ParseUint(lo, 10, 16)
		if err != nil {
			return nil, fmt.Errorf("cpuset %q: %w", list, errdefs.ErrInvalidArgument)
		}
		last := first
		if isRange {
			if last, err = strconv.ParseUint(hi, 10, 16); err != nil || last < first {
				return nil, fmt.Errorf("cpuset %q: %w", list, errdefs.ErrInvalidArgument)
			}
		}
		for i := first; i <= last; i++ {
			bits.SetBit(bits, int(i), 1)
		}
	}
	out := bits.Bytes() // highest byte first
	if len(out) == 0 {
		out = []byte{0}
	}
	slices.Reverse(out)
	return out, nil
}
