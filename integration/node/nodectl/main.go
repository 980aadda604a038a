// Command vmshim-nodectl drives containerd inside the node guest of `make
// test-cgroupv2`: it creates VM tasks without starting them (so QEMU stays
// paused and no nested guest boots), deletes them, and makes a paused QEMU
// exceed its cgroup's memory limit while it watches containerd's events. It
// prints what it did as one JSON object on stdout.
//
//	vmshim-nodectl create -id ID -cgroup PATH -memory BYTES -cpu-quota Q -cpu-period P [-config FILE] [-sandbox]
//	vmshim-nodectl oom    -id ID -cgroup PATH -memory BYTES [-config FILE] [-cgroup-dir DIR]
//	vmshim-nodectl delete -id ID
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	runtimeoptions "github.com/containerd/containerd/api/types/runtimeoptions/v1"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	"github.com/containerd/typeurl/v2"

	"github.com/vmshim/vmshim/integration/node/nodeapi"
)

const (
	runtimeName = "io.containerd.vm.v2"
	shimBinary  = "containerd-shim-vm-v2"
	// fillChunk is how much of guest RAM one write to /proc/PID/mem covers.
	fillChunk = 1 << 20
	// exitWait bounds how long oom waits for the task's exit once its
	// writes have stopped.
	exitWait = time.Minute
)

// options are the flags every command shares.
type options struct {
	address   string
	namespace string
	image     string
	id        string
	cgroup    string
	memory    int64
	cpuQuota  int64
	cpuPeriod uint64
	config    string
	cgroupDir string
	sandbox   bool
	timeout   time.Duration
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: vmshim-nodectl create|oom|delete [flags]")
		os.Exit(2)
	}
	var o options
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	fs.StringVar(&o.address, "address", "/run/containerd/containerd.sock", "containerd's socket")
	fs.StringVar(&o.namespace, "namespace", "vmshim-node", "containerd namespace")
	fs.StringVar(&o.image, "image", "localhost/vmshim-test/disk:wait", "VM image")
	fs.StringVar(&o.id, "id", "", "container and task id")
	fs.StringVar(&o.cgroup, "cgroup", "", "OCI cgroupsPath")
	fs.Int64Var(&o.memory, "memory", 0, "memory limit in bytes (0: none)")
	fs.Int64Var(&o.cpuQuota, "cpu-quota", 0, "CFS quota in µs (0: none)")
	fs.Uint64Var(&o.cpuPeriod, "cpu-period", 100000, "CFS period in µs")
	fs.StringVar(&o.config, "config", "", "shim config file (runtime option ConfigPath)")
	fs.StringVar(&o.cgroupDir, "cgroup-dir", "", "oom: the cgroup's directory, to report memory.max and memory.events")
	fs.BoolVar(&o.sandbox, "sandbox", false, "create: a CRI pod sandbox (its pause process, no VM), whose shim joins the pod's cgroup")
	fs.DurationVar(&o.timeout, "timeout", 3*time.Minute, "how long the command may take")
	_ = fs.Parse(os.Args[2:])
	if o.id == "" {
		fmt.Fprintln(os.Stderr, "vmshim-nodectl: -id is required")
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	var out any
	var err error
	switch os.Args[1] {
	case "create":
		out, err = create(ctx, o)
	case "oom":
		out, err = oom(ctx, o)
	case "delete":
		out, err = remove(ctx, o)
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if out != nil {
		_ = json.NewEncoder(os.Stdout).Encode(out)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "vmshim-nodectl %s %s: %v\n", os.Args[1], o.id, err)
		os.Exit(1)
	}
}

// connect returns a client of containerd in the options' namespace.
func connect(o options) (*client.Client, error) {
	c, err := client.New(o.address, client.WithDefaultNamespace(o.namespace))
	if err != nil {
		return nil, fmt.Errorf("connect to containerd at %s: %w", o.address, err)
	}
	return c, nil
}

// create creates the container and its task, which it leaves created:
// QEMU runs with its vCPUs stopped.
func create(ctx context.Context, o options) (*nodeapi.Created, error) {
	c, err := connect(o)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return newTask(ctx, c, o)
}

// newTask creates container o.id from o.image with o's cgroup and limits,
// and its task.
func newTask(ctx context.Context, c *client.Client, o options) (_ *nodeapi.Created, retErr error) {
	img, err := c.GetImage(ctx, o.image)
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", o.image, err)
	}
	specOpts := []oci.SpecOpts{oci.WithImageConfig(img), oci.WithHostname(o.id), oci.WithCgroup(o.cgroup)}
	if o.memory > 0 {
		specOpts = append(specOpts, oci.WithMemoryLimit(uint64(o.memory)))
	}
	if o.cpuQuota > 0 {
		specOpts = append(specOpts, oci.WithCPUCFS(o.cpuQuota, o.cpuPeriod))
	}
	if o.sandbox {
		// As containerd's CRI marks a pod's sandbox container.
		specOpts = append(specOpts, oci.WithAnnotations(map[string]string{
			"io.kubernetes.cri.container-type": "sandbox",
			"io.kubernetes.cri.sandbox-id":     o.id,
		}))
	}
	var runtimeOpts any
	if o.config != "" {
		runtimeOpts = &runtimeoptions.Options{ConfigPath: o.config}
	}
	ctr, err := c.NewContainer(ctx, o.id,
		client.WithImage(img),
		client.WithNewSnapshot(o.id, img),
		client.WithRuntime(runtimeName, runtimeOpts),
		client.WithNewSpec(specOpts...),
	)
	if err != nil {
		return nil, fmt.Errorf("create container: %w", err)
	}
	defer func() {
		if retErr != nil {
			if err := ctr.Delete(context.WithoutCancel(ctx), client.WithSnapshotCleanup); err != nil {
				retErr = errors.Join(retErr, fmt.Errorf("delete container: %w", err))
			}
		}
	}()
	task, err := ctr.NewTask(ctx, cio.NullIO)
	if err != nil {
		return nil, fmt.Errorf("create task: %w", err)
	}
	shim, err := shimPid(o.id)
	if err != nil {
		return nil, err
	}
	return &nodeapi.Created{ID: o.id, QEMUPid: int(task.Pid()), ShimPid: shim}, nil
}

// remove deletes the task, killing QEMU, and the container with its
// snapshot; either being gone already is no error.
func remove(ctx context.Context, o options) (any, error) {
	c, err := connect(o)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	ctr, err := c.LoadContainer(ctx, o.id)
	if errdefs.IsNotFound(err) {
		return map[string]string{"id": o.id, "deleted": "nothing"}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("load container: %w", err)
	}
	status := "container"
	task, err := ctr.Task(ctx, nil)
	switch {
	case errdefs.IsNotFound(err):
	case err != nil:
		return nil, fmt.Errorf("load task: %w", err)
	default:
		st, err := task.Delete(ctx, client.WithProcessKill)
		if err != nil {
			return nil, fmt.Errorf("delete task: %w", err)
		}
		status = fmt.Sprintf("task (exit status %d) and container", st.ExitCode())
	}
	if err := ctr.Delete(ctx, client.WithSnapshotCleanup); err != nil {
		return nil, fmt.Errorf("delete container: %w", err)
	}
	return map[string]string{"id": o.id, "deleted": status}, nil
}

// oom creates the task, then writes to every page of its guest RAM
// through /proc/PID/mem, as a running guest filling its memory would:
// the pages are charged to QEMU's cgroup, whose limit (guest RAM plus the
// config's memory_overhead) a small overhead makes too small. It reports
// the container's task events, from before the create until its exit.
func oom(ctx context.Context, o options) (*nodeapi.OOMReport, error) {
	c, err := connect(o)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	subCtx, stop := context.WithCancel(ctx)
	defer stop()
	evs, errs := c.EventService().Subscribe(subCtx, fmt.Sprintf(`namespace==%s,topic~="^/tasks/"`, o.namespace))
	r := &nodeapi.OOMReport{}
	cr, err := newTask(ctx, c, o)
	if err != nil {
		return nil, err
	}
	r.Created = *cr
	r.MemoryMax = readCgroup(o.cgroupDir, "memory.max")
	r.GuestRAM, r.Filled, err = fillGuestRAM(cr.QEMUPid, o.memory>>20<<20)
	if err != nil {
		r.FillError = err.Error()
	}
	// An OOM kill ends QEMU at once; a QEMU still running after this was
	// not killed.
	wait := time.NewTimer(exitWait)
	defer wait.Stop()
	r.Waited = "exit"
	for {
		select {
		case env := <-evs:
			e, ok := decode(env.Topic, env.Event, o.id)
			if !ok {
				continue
			}
			e.At = env.Timestamp
			r.Events = append(r.Events, e)
			if e.Topic == "/tasks/exit" {
				r.MemoryEvents = readCgroup(o.cgroupDir, "memory.events")
				return r, nil
			}
		case err := <-errs:
			r.Waited = fmt.Sprintf("event stream ended: %v", err)
			return r, nil
		case <-wait.C:
			r.Waited = fmt.Sprintf("no /tasks/exit %s after the writes stopped", exitWait)
			return r, nil
		case <-ctx.Done():
			r.Waited = fmt.Sprintf("no /tasks/exit: %v", ctx.Err())
			return r, nil
		}
	}
}

// readCgroup returns the content of a control file of dir, or "" if
// there is none.
func readCgroup(dir, name string) string {
	if dir == "" {
		return ""
	}
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// decode returns the task event of container id that ev carries.
func decode(topic string, ev typeurl.Any, id string) (nodeapi.Event, bool) {
	v, err := typeurl.UnmarshalAny(ev)
	if err != nil {
		return nodeapi.Event{}, false
	}
	e := nodeapi.Event{Topic: topic}
	switch m := v.(type) {
	case *eventstypes.TaskCreate:
		return e, m.ContainerID == id
	case *eventstypes.TaskOOM:
		return e, m.ContainerID == id
	case *eventstypes.TaskExit:
		st := m.ExitStatus
		e.ExitStatus = &st
		return e, m.ContainerID == id && m.ID == id
	case *eventstypes.TaskDelete:
		return e, m.ContainerID == id
	}
	return nodeapi.Event{}, false
}

// fillGuestRAM writes to every page of the private read-write mapping of
// exactly size bytes in process pid (QEMU maps guest RAM in one piece). It
// returns the mapping as /proc/PID/maps shows it and how much it wrote;
// the writes stop with an error once the process is gone.
func fillGuestRAM(pid int, size int64) (string, int64, error) {
	if size <= 0 {
		return "", 0, fmt.Errorf("no guest RAM size: give -memory")
	}
	start, line, err := findMapping(pid, size)
	if err != nil {
		return "", 0, err
	}
	f, err := os.OpenFile(fmt.Sprintf("/proc/%d/mem", pid), os.O_RDWR, 0)
	if err != nil {
		return line, 0, err
	}
	defer f.Close()
	buf := make([]byte, fillChunk)
	for i := range buf {
		buf[i] = 0x5a
	}
	var done int64
	for done < size {
		n := min(int64(len(buf)), size-done)
		w, err := f.WriteAt(buf[:n], int64(start)+done)
		done += int64(w)
		if err != nil {
			return line, done, err
		}
	}
	return line, done, nil
}

// findMapping returns the start address and the maps line of pid's
// read-write private mapping of exactly size bytes.
func findMapping(pid int, size int64) (uint64, string, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return 0, "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 || fields[1] != "rw-p" {
			continue
		}
		lo, hi, ok := strings.Cut(fields[0], "-")
		if !ok {
			continue
		}
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 == nil && err2 == nil && int64(end-start) == size {
			return start, sc.Text(), nil
		}
	}
	if err := sc.Err(); err != nil {
		return 0, "", err
	}
	return 0, "", fmt.Errorf("process %d has no read-write mapping of %d bytes (guest RAM)", pid, size)
}

// shimPid finds the shim serving task id: the containerd-shim-vm-v2
// process whose arguments hold "-id ID".
func shimPid(id string) (int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if filepath.Base(args[0]) != shimBinary {
			continue
		}
		for i := 0; i+1 < len(args); i++ {
			if args[i] == "-id" && args[i+1] == id {
				return pid, nil
			}
		}
	}
	return 0, fmt.Errorf("no %s process with -id %s", shimBinary, id)
}
