package image

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"github.com/vmshim/vmshim/jail"
	"github.com/vmshim/vmshim/thread"
)

const (
	// maxOutput bounds what is kept of qemu-img's stdout and stderr.
	maxOutput = 1 << 20
	// maxMessage bounds a qemu-img message quoted in an error.
	maxMessage = 400
)

// Limits on one qemu-img run, as OpenStack sets them after its fuzzing
// findings: an image crafted to make qemu-img spin or allocate without
// end fails the create instead of hurting the node.
const (
	// QEMUImgCPUTime is the CPU time a qemu-img run may use.
	QEMUImgCPUTime = 30 * time.Second
	// QEMUImgAddressSpace is the address space a qemu-img run may map.
	QEMUImgAddressSpace = 1 << 30
)

// qemuImgEnv is qemu-img's whole environment. One malloc arena: glibc
// reserves 64 MiB of address space for each arena it makes, up to eight
// a CPU, and qemu-img's I/O threads would each make one; a convert's
// address space then grows past QEMUImgAddressSpace (1.2 GiB measured
// against 140 MiB with one arena) and a thread it starts fails.
var qemuImgEnv = []string{"MALLOC_ARENA_MAX=1"}

// QEMUImg runs qemu-img for the shim, confined (see jail.Confine): under
// QEMUImgCPUTime and QEMUImgAddressSpace, under a seccomp filter that
// denies exec, id changes and every socket but AF_UNIX, in an empty
// network namespace and a PID namespace of its own (nothing it forks
// outlives it), in the VM's cgroup once Start is set, and, with a Jail,
// inside it: as the VM's unprivileged ids, with no capabilities, in a
// mount namespace that holds only /usr and the files of the call.
type QEMUImg struct {
	// CPUTime replaces QEMUImgCPUTime for a run that copies a whole disk
	// Inspect accepted; 0 keeps it.
	CPUTime time.Duration
	Path    string     // qemu-img, an absolute path (under /usr with a Jail)
	Jail    *jail.Jail // nil runs qemu-img as the shim's user, in its mount namespace
	// Start starts a qemu-img run's process, forked from a thread the
	// steps moved first: into the VM's cgroup (see thread.Fork); nil
	// starts it in the shim's.
	Start func(cmd *exec.Cmd, steps ...thread.Step) error

	stdout io.Writer // also gets qemu-img's stdout as it comes (progress), when set
}

// result is the outcome of one qemu-img run that started and exited.
type result struct {
	stdout []byte
	stderr string
	code   int
}

// imgFile is a file a qemu-img run works on, passed to it open.
type imgFile struct {
	name  string // its name in the jail, under jail.VMDir, and in args as "@name"
	label string // what messages call it ("/disk/disk.qcow2")
	f     *os.File
	rw    bool
	// device says f is a block device, which a jail cannot bind (its
	// binds are nodev): the jail gets a node of its own for it instead.
	device bool
}

// run runs qemu-img with args, in which each "@NAME" names the file of
// files with that name. A non-zero exit is reported in result.code, not as
// an error; errors mean qemu-img could not be run, was killed (by a limit,
// say) or ctx ended.
func (q QEMUImg) run(ctx context.Context, files []imgFile, groups []uint32, args ...string) (result, error) {
	var stdout, stderr capped
	cpu := QEMUImgCPUTime
	if q.CPUTime > 0 {
		cpu = q.CPUTime
	}
	argv := []string{q.Path}
	var binds []jail.Bind
	var extra []*os.File
	paths := map[string]string{}
	var devices []jail.Device
	for _, f := range files {
		switch {
		case q.Jail != nil && f.device:
			var st unix.Stat_t
			if err := unix.Fstat(int(f.f.Fd()), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFBLK {
				return result{}, preconditionf("%s is not a block device", f.label)
			}
			d := jail.Device{Path: "/dev/" + f.name, Major: unix.Major(st.Rdev), Minor: unix.Minor(st.Rdev), Block: true}
			devices = append(devices, d)
			paths["@"+f.name] = d.Path
		case q.Jail != nil:
			target := jail.VMDir + "/" + f.name
			binds = append(binds, jail.Bind{Target: target, File: f.f, ReadOnly: !f.rw})
			paths["@"+f.name] = target
		default:
			extra = append(extra, f.f)
			paths["@"+f.name] = "/dev/fd/" + strconv.Itoa(2+len(extra))
		}
	}
	for _, a := range args {
		if p, ok := paths[a]; ok {
			a = p
		}
		argv = append(argv, a)
	}
	cmd := exec.CommandContext(ctx, q.Path)
	cmd.Args = argv
	cmd.Env = qemuImgEnv
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if q.stdout != nil {
		cmd.Stdout = io.MultiWriter(&stdout, q.stdout)
	}
	cmd.WaitDelay = 5 * time.Second
	cmd.ExtraFiles = extra
	log.G(ctx).WithField("args", args).Debug("running qemu-img")
	var steps []thread.Step
	if q.Jail != nil {
		j := *q.Jail
		j.Binds = append(append([]jail.Bind(nil), j.Binds...), binds...)
		j.Devices = append(append([]jail.Device(nil), j.Devices...), devices...)
		j.Groups = append(append([]uint32(nil), j.Groups...), groups...)
		j.Apply(cmd)
		steps = append(steps, j.Enter)
	}
	err := q.start(ctx, cmd, cpu, steps)
	if err == nil {
		err = cmd.Wait()
	}
	res := result{stdout: stdout.Bytes(), stderr: stderr.String()}
	for _, f := range files {
		res.stderr = strings.ReplaceAll(res.stderr, paths["@"+f.name], f.label)
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		return res, fmt.Errorf("qemu-img %s: %w", args[0], ctxErr)
	}
	var exitErr *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exitErr) && exitErr.Exited():
		res.code = exitErr.ExitCode()
	case errors.As(err, &exitErr):
		return res, preconditionf("qemu-img %s was killed (%s); it may use %v of CPU and %s of address space: %s",
			args[0], exitErr.ProcessState, cpu, formatSize(QEMUImgAddressSpace), message(res.stderr, ""))
	default:
		return res, preconditionf("run %s %s: %v", q.Path, args[0], err)
	}
	return res, nil
}

// start starts cmd confined, forked after steps, and lets it exec
// qemu-img; on error nothing of the run is left.
func (q QEMUImg) start(ctx context.Context, cmd *exec.Cmd, cpu time.Duration, steps []thread.Step) error {
	c, err := jail.Confine(cmd, jail.Limits{CPU: cpu, AddressSpace: QEMUImgAddressSpace})
	if err != nil {
		return err
	}
	defer c.Close()
	if q.Start != nil {
		err = q.Start(cmd, steps...)
	} else {
		err = thread.Fork(cmd, steps...)
	}
	if err != nil {
		return err
	}
	if err := c.Started(ctx, cmd.Process.Pid); err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return err
	}
	return nil
}

// message condenses qemu-img's stderr to one line naming files inside root
// as rootfs paths: the first message, and how many more there were.
func message(stderr, root string) string {
	var lines []string
	for _, l := range strings.Split(stderr, "\n") {
		l = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(l), "qemu-img:"))
		if l != "" {
			lines = append(lines, l)
		}
	}
	if len(lines) == 0 {
		return "no message"
	}
	msg := lines[0]
	if root != "" && root != "/" {
		msg = strings.ReplaceAll(msg, root+"/", "/")
	}
	// qemu-img quotes names from the image byte for byte; errors go
	// through gRPC, which takes only UTF-8.
	msg = oneLine(strings.ToValidUTF8(msg, "\uFFFD"))
	if len(msg) > maxMessage {
		msg = strings.ToValidUTF8(msg[:maxMessage], "") + "…"
	}
	if n := len(lines) - 1; n > 0 {
		msg = fmt.Sprintf("%s (and %d more)", msg, n)
	}
	return msg
}

// capped is a bytes.Buffer that silently drops writes beyond maxOutput.
type capped struct {
	buf bytes.Buffer
}

func (c *capped) Write(p []byte) (int, error) {
	if room := maxOutput - c.buf.Len(); room > 0 {
		if len(p) > room {
			c.buf.Write(p[:room])
		} else {
			c.buf.Write(p)
		}
	}
	return len(p), nil
}

func (c *capped) Bytes() []byte  { return c.buf.Bytes() }
func (c *capped) String() string { return c.buf.String() }
