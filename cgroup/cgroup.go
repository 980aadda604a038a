// Package cgroup is the control group a process runs in: made from an
// OCI cgroupsPath on cgroupfs v1 or v2, or as a systemd scope; its limits
// applied and changed, its usage read, its processes started in it, and
// removed again.
package cgroup

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/cgroups/v3"
	"github.com/containerd/cgroups/v3/cgroup1"
	"github.com/containerd/cgroups/v3/cgroup2"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/vmshim/vmshim/thread"
)

const (
	// cgroupRoot is where the cgroup hierarchies are mounted.
	cgroupRoot = "/sys/fs/cgroup"
	// cgroupDeleteTimeout bounds how long Delete waits for exiting processes to leave.
	cgroupDeleteTimeout = 2 * time.Second
	// cgroupDeleteInterval is the pause between removal attempts.
	cgroupDeleteInterval = 50 * time.Millisecond
	// systemdTimeout bounds one systemd job (starting or stopping a scope).
	systemdTimeout = 30 * time.Second
)

// Cgroup is the control group a process runs in.
type Cgroup interface {
	// Add moves a process, with all its threads, into the cgroup.
	Add(pid int) error
	// Start starts cmd in the cgroup, forking it from a thread the steps
	// moved first (see thread.Fork).
	Start(cmd *exec.Cmd, steps ...thread.Step) error
	// Update applies limits.
	Update(r *specs.LinuxResources) error
	// Stats reports usage as *cgroup1stats.Metrics or *cgroup2stats.Metrics.
	Stats() (proto.Message, error)
	// Delete removes the cgroup, waiting briefly for exiting processes to
	// leave; a cgroup that no longer exists is deleted successfully.
	Delete() error
	// Path is the cgroups path the cgroup was made from.
	Path() string
	// MemoryDir is the cgroup's directory in the memory hierarchy (the
	// unified one on v2), where OOM kills are counted; "" until a systemd
	// scope is made.
	MemoryDir() string
}

// Host is the machine's cgroup setup; tests replace its fields.
type Host struct {
	mode    func() cgroups.CGMode     // which cgroup version is in use
	root    string                    // where the hierarchies are mounted
	systemd func() bool               // whether systemd is the running init system
	units   systemdUnits              // starts and stops scope units
	hold    func() (*exec.Cmd, error) // starts a placeholder process a new scope is made around
}

// NewHost describes this machine. placeholder starts the process a new
// systemd scope is made around (see scopeCgroup.Start): one that waits,
// with no privileges and an oom_score_adj of -1000, until it is told to
// end; nil when the caller never starts a process into a new scope with
// Start.
func NewHost(placeholder func() (*exec.Cmd, error)) Host {
	if placeholder == nil {
		placeholder = func() (*exec.Cmd, error) {
			return nil, fmt.Errorf("no placeholder process for a new systemd scope: %w", errdefs.ErrNotImplemented)
		}
	}
	return Host{mode: cgroups.Mode, root: cgroupRoot, systemd: systemdRunning, units: dbusUnits{}, hold: placeholder}
}

// systemdRunning reports whether systemd is the init system (sd_booted).
func systemdRunning() bool {
	_, err := os.Lstat("/run/systemd/system")
	return err == nil
}

// driver is the way a cgroup is managed.
type driver int

const (
	cgroupfsV1 driver = iota + 1
	cgroupfsV2
	systemdV1
	systemdV2
)

// v2 reports whether the driver works on the unified hierarchy.
func (d driver) v2() bool { return d == cgroupfsV2 || d == systemdV2 }

// systemd reports whether the driver goes through systemd.
func (d driver) systemd() bool { return d == systemdV1 || d == systemdV2 }

// cgPath is a parsed OCI cgroupsPath.
type cgPath struct {
	raw   string // as given
	dir   string // directory below each hierarchy's root, starting with "/"
	slice string // systemd form only: the parent slice
	unit  string // systemd form only: the scope unit
}

// parsePath parses a cgroupfs path or the systemd form slice:prefix:name.
func parsePath(raw string) (cgPath, error) {
	if !strings.Contains(raw, ":") {
		dir := path.Clean("/" + raw)
		if raw == "" || dir == "/" {
			return cgPath{}, fmt.Errorf("cgroup path %q names no cgroup below the root: %w", raw, errdefs.ErrInvalidArgument)
		}
		return cgPath{raw: raw, dir: dir}, nil
	}
	parts := strings.Split(raw, ":")
	if len(parts) != 3 || parts[2] == "" {
		return cgPath{}, fmt.Errorf("cgroup path %q: want slice:prefix:name for the systemd cgroup driver: %w", raw, errdefs.ErrInvalidArgument)
	}
	slice, prefix, name := parts[0], parts[1], parts[2]
	sliceDir, err := expandSlice(slice)
	if err != nil {
		return cgPath{}, fmt.Errorf("cgroup path %q: %w", raw, err)
	}
	unit := name + ".scope"
	if prefix != "" {
		unit = prefix + "-" + unit
	}
	if strings.Contains(unit, "/") {
		return cgPath{}, fmt.Errorf("cgroup path %q: unit name %q contains a slash: %w", raw, unit, errdefs.ErrInvalidArgument)
	}
	return cgPath{raw: raw, dir: path.Join(sliceDir, unit), slice: slice, unit: unit}, nil
}

// expandSlice turns a systemd slice name into its cgroup directory:
// a-b.slice lives at /a.slice/a-b.slice.
func expandSlice(slice string) (string, error) {
	const suffix = ".slice"
	if len(slice) <= len(suffix) || !strings.HasSuffix(slice, suffix) || strings.Contains(slice, "/") {
		return "", fmt.Errorf("invalid systemd slice %q: %w", slice, errdefs.ErrInvalidArgument)
	}
	if slice == "-"+suffix {
		return "/", nil
	}
	var dir, prefix string
	for _, part := range strings.Split(strings.TrimSuffix(slice, suffix), "-") {
		if part == "" {
			return "", fmt.Errorf("invalid systemd slice %q: empty part between dashes: %w", slice, errdefs.ErrInvalidArgument)
		}
		dir += "/" + prefix + part + suffix
		prefix += part + "-"
	}
	return dir, nil
}

// resolve parses raw and picks the driver for it on this host.
func (h Host) resolve(raw string) (cgPath, driver, error) {
	p, err := parsePath(raw)
	if err != nil {
		return cgPath{}, 0, err
	}
	var v2 bool
	switch h.mode() {
	case cgroups.Unified:
		v2 = true
	case cgroups.Legacy, cgroups.Hybrid:
	default:
		return cgPath{}, 0, fmt.Errorf("cgroup path %s: no cgroup hierarchy is mounted: %w", raw, errdefs.ErrFailedPrecondition)
	}
	switch {
	case p.unit != "" && !h.systemd():
		return cgPath{}, 0, fmt.Errorf("cgroup path %s uses the systemd cgroup driver, but systemd is not running: %w", raw, errdefs.ErrFailedPrecondition)
	case p.unit != "" && v2:
		return p, systemdV2, nil
	case p.unit != "":
		return p, systemdV1, nil
	case v2:
		return p, cgroupfsV2, nil
	}
	return p, cgroupfsV1, nil
}

// Create makes the cgroup an OCI cgroupsPath names and applies r. Under
// the systemd driver the scope unit is made by the first Add or Start,
// because systemd refuses a scope without a process.
func (h Host) Create(ctx context.Context, raw string, r *specs.LinuxResources) (Cgroup, error) {
	p, d, err := h.resolve(raw)
	if err != nil {
		return nil, err
	}
	if r == nil {
		r = &specs.LinuxResources{}
	}
	if d.systemd() {
		return &scopeCgroup{host: h, p: p, v2: d.v2(), res: r}, nil
	}
	cg, err := h.newDirs(p, d.v2(), r)
	if err != nil {
		return nil, err
	}
	log.G(ctx).WithField("cgroup", raw).Debug("created cgroup")
	return cg, nil
}

// Load opens the existing cgroup an OCI cgroupsPath names, for cleanup
// after a crash; one that is not there is errdefs.ErrNotFound.
func (h Host) Load(ctx context.Context, raw string) (Cgroup, error) {
	p, d, err := h.resolve(raw)
	if err != nil {
		return nil, err
	}
	cg, err := h.loadDirs(p, d.v2())
	if err != nil {
		return nil, err
	}
	log.G(ctx).WithField("cgroup", raw).Debug("loaded cgroup")
	if d.systemd() {
		return &scopeCgroup{host: h, p: p, v2: d.v2(), inner: cg}, nil
	}
	return cg, nil
}

// newDirs creates the cgroup's directories (mkdir -p) and applies r; on
// error it removes the directories it made.
func (h Host) newDirs(p cgPath, v2 bool, r *specs.LinuxResources) (_ Cgroup, retErr error) {
	if v2 {
		created := missingDirs(h.root, p.dir)
		defer undoDirs(&retErr, created)
		res := cgroup2.ToResources(r)
		res.Devices = r.Devices
		mgr, err := cgroup2.NewManager(h.root, p.dir, res)
		if err != nil {
			return nil, wrapError("create", p.raw, err, errdefs.ErrUnknown)
		}
		return &v2Cgroup{path: p.raw, dir: filepath.Join(h.root, p.dir), mgr: mgr}, nil
	}
	subs, err := h.v1Subsystems()
	if err != nil {
		return nil, wrapError("create", p.raw, err, errdefs.ErrUnknown)
	}
	var created []string
	for _, s := range subs {
		created = append(created, missingDirs(s.(pather).Path("/"), p.dir)...)
	}
	defer undoDirs(&retErr, created)
	swap := h.v1Swap()
	cg, err := cgroup1.New(cgroup1.StaticPath(p.dir), withoutSwap(r, swap), cgroup1.WithHierarchy(fixedHierarchy(subs)))
	if err != nil {
		return nil, wrapError("create", p.raw, err, errdefs.ErrUnknown)
	}
	return &v1Cgroup{path: p.raw, cg: cg, swap: swap, memDir: filepath.Join(h.root, "memory", p.dir)}, nil
}

// loadDirs opens the cgroup's existing directories.
func (h Host) loadDirs(p cgPath, v2 bool) (Cgroup, error) {
	if v2 {
		if _, err := os.Stat(filepath.Join(h.root, p.dir)); err != nil {
			return nil, wrapError("load", p.raw, err, errdefs.ErrUnknown)
		}
		mgr, err := cgroup2.Load(p.dir, cgroup2.WithMountpoint(h.root))
		if err != nil {
			return nil, wrapError("load", p.raw, err, errdefs.ErrUnknown)
		}
		return &v2Cgroup{path: p.raw, dir: filepath.Join(h.root, p.dir), mgr: mgr}, nil
	}
	subs, err := h.v1Subsystems()
	if err != nil {
		return nil, wrapError("load", p.raw, err, errdefs.ErrUnknown)
	}
	cg, err := cgroup1.Load(cgroup1.StaticPath(p.dir), cgroup1.WithHierarchy(fixedHierarchy(subs)))
	if err != nil {
		return nil, wrapError("load", p.raw, err, errdefs.ErrUnknown)
	}
	return &v1Cgroup{path: p.raw, cg: cg, swap: h.v1Swap(), memDir: filepath.Join(h.root, "memory", p.dir)}, nil
}

// pather is a v1 subsystem with a directory per cgroup.
type pather interface {
	Path(path string) string
}

// v1Subsystems lists the v1 subsystems mounted under the root; missing
// ones (rdma, hugetlb, net_cls, ...) are left out.
func (h Host) v1Subsystems() ([]cgroup1.Subsystem, error) {
	all := []cgroup1.Subsystem{
		cgroup1.NewNamed(h.root, "systemd"),
		cgroup1.NewFreezer(h.root),
		cgroup1.NewPids(h.root),
		cgroup1.NewNetCls(h.root),
		cgroup1.NewNetPrio(h.root),
		cgroup1.NewPerfEvent(h.root),
		cgroup1.NewCpuset(h.root),
		cgroup1.NewCpu(h.root),
		cgroup1.NewCpuacct(h.root),
		cgroup1.NewMemory(h.root, cgroup1.OptionalSwap()),
		cgroup1.NewBlkio(h.root),
		cgroup1.NewRdma(h.root),
	}
	if !cgroups.RunningInUserNS() {
		all = append(all, cgroup1.NewDevices(h.root))
	}
	if hugetlb, err := cgroup1.NewHugetlb(h.root); err == nil {
		all = append(all, hugetlb)
	}
	var mounted []cgroup1.Subsystem
	for _, s := range all {
		if _, err := os.Lstat(s.(pather).Path("/")); err == nil {
			mounted = append(mounted, s)
		}
	}
	if len(mounted) == 0 {
		return nil, fmt.Errorf("no cgroup v1 hierarchy under %s: %w", h.root, errdefs.ErrFailedPrecondition)
	}
	return mounted, nil
}

// v1Swap reports whether the v1 memory controller accounts swap.
func (h Host) v1Swap() bool {
	_, err := os.Stat(filepath.Join(h.root, string(cgroup1.Memory), "memory.memsw.limit_in_bytes"))
	return err == nil
}

// fixedHierarchy hands cgroup1 an already chosen list of subsystems.
func fixedHierarchy(subs []cgroup1.Subsystem) cgroup1.Hierarchy {
	return func() ([]cgroup1.Subsystem, error) { return subs, nil }
}

// withoutSwap drops the swap limit when swap accounting is off (there is
// no memory.memsw.limit_in_bytes to write it to).
func withoutSwap(r *specs.LinuxResources, swap bool) *specs.LinuxResources {
	if r == nil {
		return &specs.LinuxResources{}
	}
	if swap || r.Memory == nil || r.Memory.Swap == nil {
		return r
	}
	rc, mem := *r, *r.Memory
	mem.Swap = nil
	rc.Memory = &mem
	return &rc
}

// v1Cgroup is a cgroup on the v1 hierarchies.
type v1Cgroup struct {
	path   string
	cg     cgroup1.Cgroup
	swap   bool   // the memory controller accounts swap
	memDir string // its directory in the memory hierarchy
}

// Add moves pid into every hierarchy.
func (c *v1Cgroup) Add(pid int) error {
	if err := c.cg.Add(cgroup1.Process{Pid: pid}); err != nil {
		return wrapError(fmt.Sprintf("add pid %d to", pid), c.path, err, errdefs.ErrUnknown)
	}
	return nil
}

// Start starts cmd inside the cgroup, so that everything the process
// allocates, from its first page, is charged here. v1 places threads, not
// processes: the forking thread joins the cgroup, before the steps (a
// jail's leaves it no view of /sys/fs/cgroup), and goes back to its own
// cgroups once the child is started (see thread.Fork).
func (c *v1Cgroup) Start(cmd *exec.Cmd, steps ...thread.Step) error {
	return thread.Fork(cmd, append([]thread.Step{c.join}, steps...)...)
}

// join is the thread.Step that moves the calling thread into the cgroup.
// The way back is opened first: the steps after it may take the thread
// where the node's cgroup directories cannot be seen (the jail's root),
// and a thread that cannot go back stays in the VM's cgroup for good (the
// runtime parks its main thread rather than ending it).
func (c *v1Cgroup) join() (func() bool, error) {
	orig, err := cgroup1.ParseCgroupFile("/proc/thread-self/cgroup")
	if err != nil {
		return nil, wrapError("read the shim's cgroups for", c.path, err, errdefs.ErrUnknown)
	}
	tid := unix.Gettid()
	ways, ok := c.waysBack(orig)
	if !ok {
		for _, f := range ways {
			f.Close()
		}
		return nil, wrapError("join", c.path, fmt.Errorf("the shim's own cgroups cannot be opened"), errdefs.ErrUnknown)
	}
	back := func() bool { return rejoin(tid, ways) }
	if err := c.cg.AddTask(cgroup1.Process{Pid: tid}); err != nil {
		back()
		return nil, wrapError("join", c.path, err, errdefs.ErrUnknown)
	}
	return back, nil
}

// waysBack opens, for writing, the tasks file of each cgroup orig lists
// (as read from /proc/thread-self/cgroup) in each of c's hierarchies;
// false if any could not be opened.
func (c *v1Cgroup) waysBack(orig map[string]string) ([]*os.File, bool) {
	var ways []*os.File
	ok := true
	for _, s := range c.cg.Subsystems() {
		p, isPather := s.(pather)
		name := string(s.Name())
		dir, found := orig[name]
		if !found {
			dir, found = orig["name="+name]
		}
		if !isPather || !found {
			ok = false
			continue
		}
		f, err := os.OpenFile(filepath.Join(p.Path(dir), "tasks"), os.O_WRONLY, 0)
		if err != nil {
			ok = false
			continue
		}
		ways = append(ways, f)
	}
	return ways, ok
}

// rejoin moves thread tid back through the tasks files waysBack opened,
// and closes them; false if any move failed.
func rejoin(tid int, ways []*os.File) bool {
	ok := true
	for _, f := range ways {
		if _, err := f.WriteString(strconv.Itoa(tid)); err != nil {
			ok = false
		}
		f.Close()
	}
	return ok
}

// Update applies r.
func (c *v1Cgroup) Update(r *specs.LinuxResources) error {
	if err := c.raiseMemsw(r); err != nil {
		return wrapError("update", c.path, err, errdefs.ErrUnknown)
	}
	if err := c.cg.Update(withoutSwap(r, c.swap)); err != nil {
		return wrapError("update", c.path, err, errdefs.ErrUnknown)
	}
	return nil
}

// raiseMemsw writes a higher memory+swap limit before the library
// writes the memory limit: the kernel refuses a memory limit above
// memory.memsw.limit_in_bytes, and the cgroups library writes the memory
// limit first (its reordering for this case swaps the wrong files).
func (c *v1Cgroup) raiseMemsw(r *specs.LinuxResources) error {
	if !c.swap || c.memDir == "" || r == nil || r.Memory == nil || r.Memory.Swap == nil || *r.Memory.Swap <= 0 {
		return nil
	}
	file := filepath.Join(c.memDir, "memory.memsw.limit_in_bytes")
	b, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	current, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil || uint64(*r.Memory.Swap) <= current {
		return err
	}
	return os.WriteFile(file, []byte(strconv.FormatInt(*r.Memory.Swap, 10)), 0)
}

// Stats reads the v1 metrics, skipping files this kernel lacks.
func (c *v1Cgroup) Stats() (proto.Message, error) {
	m, err := c.cg.Stat(cgroup1.IgnoreNotExist)
	if err != nil {
		return nil, wrapError("read stats of", c.path, err, errdefs.ErrUnknown)
	}
	return m, nil
}

// Delete removes the cgroup from every hierarchy.
func (c *v1Cgroup) Delete() error {
	return removeWithin(c.path, func() error {
		if err := c.cg.Delete(); err != nil && !errors.Is(err, cgroup1.ErrCgroupDeleted) {
			return err
		}
		return nil
	})
}

// Path returns the cgroups path the cgroup was made from.
func (c *v1Cgroup) Path() string { return c.path }

// MemoryDir is the cgroup's directory in the memory hierarchy.
func (c *v1Cgroup) MemoryDir() string { return c.memDir }

// v2Cgroup is a cgroup on the unified hierarchy.
type v2Cgroup struct {
	path string
	dir  string // its directory
	mgr  *cgroup2.Manager
}

// Start starts cmd inside the cgroup (clone3 with CLONE_INTO_CGROUP).
func (c *v2Cgroup) Start(cmd *exec.Cmd, steps ...thread.Step) error {
	fd, err := unix.Open(c.dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return wrapError("open", c.path, err, errdefs.ErrUnknown)
	}
	defer unix.Close(fd)
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, fd
	return thread.Fork(cmd, steps...)
}

// Add moves pid into the cgroup.
func (c *v2Cgroup) Add(pid int) error {
	if pid <= 0 {
		return fmt.Errorf("add pid %d to cgroup %s: %w", pid, c.path, errdefs.ErrInvalidArgument)
	}
	if err := c.mgr.AddProc(uint64(pid)); err != nil {
		return wrapError(fmt.Sprintf("add pid %d to", pid), c.path, err, errdefs.ErrUnknown)
	}
	return nil
}

// Update applies r.
func (c *v2Cgroup) Update(r *specs.LinuxResources) error {
	if r == nil {
		return nil
	}
	res := cgroup2.ToResources(r)
	res.Devices = r.Devices
	if err := c.mgr.Update(res); err != nil {
		return wrapError("update", c.path, err, errdefs.ErrUnknown)
	}
	return nil
}

// Stats reads the v2 metrics.
func (c *v2Cgroup) Stats() (proto.Message, error) {
	m, err := c.mgr.Stat()
	if err != nil {
		return nil, wrapError("read stats of", c.path, err, errdefs.ErrUnknown)
	}
	return m, nil
}

// Delete removes the cgroup's directory.
func (c *v2Cgroup) Delete() error {
	return removeWithin(c.path, c.mgr.Delete)
}

// Path returns the cgroups path the cgroup was made from.
func (c *v2Cgroup) Path() string { return c.path }

// MemoryDir is the cgroup's directory.
func (c *v2Cgroup) MemoryDir() string { return c.dir }

// removeWithin retries remove until it succeeds or cgroupDeleteTimeout
// passes, so processes that are exiting can leave first.
func removeWithin(path string, remove func() error) error {
	var last error
	err := wait.PollUntilContextTimeout(context.Background(), cgroupDeleteInterval, cgroupDeleteTimeout, true, func(context.Context) (bool, error) {
		last = remove()
		return last == nil || errors.Is(last, fs.ErrNotExist), nil
	})
	if err != nil {
		return wrapError("delete", path, last, errdefs.ErrFailedPrecondition)
	}
	return nil
}

// missingDirs lists the directories from root down to root+dir that do
// not exist yet, shallowest first.
func missingDirs(root, dir string) []string {
	var missing []string
	cur := root
	for _, part := range strings.Split(strings.Trim(dir, "/"), "/") {
		cur = filepath.Join(cur, part)
		if len(missing) == 0 {
			if _, err := os.Lstat(cur); err == nil {
				continue
			}
		}
		missing = append(missing, cur)
	}
	return missing
}

// undoDirs removes dirs, deepest first, when *retErr is set.
func undoDirs(retErr *error, dirs []string) {
	if *retErr == nil {
		return
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := os.RemoveAll(dirs[i]); err != nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, unix.ENOTDIR) {
			*retErr = errors.Join(*retErr, fmt.Errorf("remove %s: %w", dirs[i], err))
		}
	}
}

// wrapError wraps err from op on the cgroup at path with the errdefs
// class that fits it, or fallback.
func wrapError(op, path string, err, fallback error) error {
	if errdefs.Resolve(err) != errdefs.ErrUnknown {
		return fmt.Errorf("%s cgroup %s: %w", op, path, err)
	}
	class := fallback
	switch {
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, cgroup1.ErrCgroupDeleted):
		class = errdefs.ErrNotFound
	case errors.Is(err, fs.ErrPermission):
		class = errdefs.ErrPermissionDenied
	case errors.Is(err, unix.EINVAL), errors.Is(err, cgroup1.ErrInvalidPid), errors.Is(err, cgroup2.ErrInvalidGroupPath):
		class = errdefs.ErrInvalidArgument
	}
	if class == errdefs.ErrUnknown {
		return fmt.Errorf("%s cgroup %s: %w", op, path, err)
	}
	return fmt.Errorf("%s cgroup %s: %w: %w", op, path, class, err)
}
