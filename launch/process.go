package launch

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/vmshim/vmshim/config"
	"github.com/vmshim/vmshim/guestconsole"
	"github.com/vmshim/vmshim/oom"
	"github.com/vmshim/vmshim/procmem"
	"github.com/vmshim/vmshim/qemu"
	"github.com/vmshim/vmshim/tsc"
)

// qemu starts QEMU paused, in the VM's cgroup, network namespace and jail,
// with its QMP and agent sockets as listening fds.
func (c *build) qemu(ctx context.Context) (err error) {
	c.qs.Name = c.r.ID
	c.qs.Sandbox, c.qs.Paused = c.cfg.Sandbox, true
	c.qs.VNC, c.qs.Windows, c.qs.Machine = c.desc.VNC, c.desc.Windows, c.desc.Machine
	if c.qs.Machine == config.MachineMicroVM && c.qs.Kernel == "" {
		return fmt.Errorf("annotation %s: %s boots a kernel directly, and the image boots a disk: %w",
			config.AnnotationMachine, config.MachineMicroVM, errdefs.ErrInvalidArgument)
	}
	c.qs.Append = microVMTSC(c.qs.Machine, c.qs.Accel, c.qs.Append, tsc.KHz)
	if err := c.incoming(); err != nil {
		return err
	}
	c.qs.QMPSocket = filepath.Join(c.rec.RuntimeDir, "qmp.sock")
	// Exec runs through qemu-guest-agent; a guest without one simply
	// never opens the port.
	c.qs.AgentSocket = filepath.Join(c.rec.RuntimeDir, "agent.sock")
	for _, l := range []struct {
		path string
		fd   *int
	}{{c.qs.QMPSocket, &c.qs.QMPFD}, {c.qs.AgentSocket, &c.qs.AgentFD}} {
		f, err := qemu.Listen(l.path)
		if err != nil {
			return err
		}
		*l.fd = c.fds.Add(c.keep(f))
	}
	steps := netnsSteps(c.nsPath)
	if c.j != nil {
		steps = append(steps, c.j.Enter)
	}
	death := newDeathWatch(c.logger)
	bootCtx, cancel := context.WithTimeout(ctx, c.desc.BootTimeout)
	defer cancel()
	stderr := c.logger.WriterLevel(logrus.WarnLevel)
	vm, err := qemu.Launch(bootCtx, qemu.LaunchConfig{
		Binary: c.binary, Spec: c.qs, Files: c.fds.Files(), Stderr: stderr, Dir: c.rec.RuntimeDir,
		// QEMU starts in the VM's cgroup: all it allocates, the kernel
		// it loads into guest RAM included, is charged there. It runs in
		// the VM's network namespace, where /proc/PID/ns/net leads
		// tools such as `nerdctl inspect` and `nsenter -t PID -n`.
		Start: func(cmd *exec.Cmd) error {
			if c.j != nil {
				c.j.Apply(cmd)
			}
			return c.limits.start(cmd, steps...)
		},
		Span:       func(phase string, begin time.Time) { Span(c.logger, phase, begin) },
		GuestReset: death.reset,
	})
	if err != nil {
		stderr.Close()
		if c.tpmState != "" && strings.Contains(err.Error(), "tpm-emulator") {
			// QEMU names neither swtpm's state nor where it is.
			return fmt.Errorf("start vm %s, its TPM's state in %s: %w", c.r.ID, c.tpmState, err)
		}
		return fmt.Errorf("start vm %s: %w", c.r.ID, err)
	}
	pidStart, _ := processStart(vm.Pid())
	if err := c.rec.push(madeProcess, func(r *Record) { r.Pid, r.PidStart = vm.Pid(), pidStart }); err != nil {
		_ = vm.Kill()
		<-vm.Done()
		stderr.Close()
		return err
	}
	if err := setOOMScoreAdj(vm.Pid(), c.spec); err != nil {
		stderr.Close()
		return err // the rollback stops QEMU
	}
	relink, err := c.loadState(bootCtx, vm)
	if err != nil {
		stderr.Close()
		return err // the rollback stops QEMU
	}
	guestMem, err := c.watchGuestMemory(bootCtx, vm)
	if err != nil {
		stderr.Close()
		return fmt.Errorf("start vm %s: the balloon's statistics: %w", c.r.ID, err) // the rollback stops QEMU
	}
	var pace *pacer
	if !c.qs.Incoming {
		// A resumed guest is past its boot.
		if pace, err = newPacer(c.cfg, c.qs.Accel, c.logger); err != nil {
			stderr.Close()
			return fmt.Errorf("start vm %s: %w", c.r.ID, err) // the rollback stops QEMU
		}
	}
	console := c.watchConsole(vm, death, pace, c.pageOutBootFiles(vm))
	saver := c.newSaver()
	c.vm = &qemuVM{proc: vm, limits: c.limits, console: console, rec: c.rec, stderr: stderr, hooks: c.hooks, oom: c.watchOOM(),
		saver: saver, suspend: c.newSuspender(saver), relink: relink, guestMem: guestMem, death: death, pace: pace}
	if c.vnc != nil {
		c.vnc.vm.Store(vm)
	}
	return nil
}

// watchConsole has the guest's console watched (guestconsole) for a
// dead guest, which death then stops, and for its kernel's clock, which
// tells pace, if any, that the guest is past its early boot. firstOutput,
// if not nil, is called once, at the guest's first output.
func (c *build) watchConsole(vm *qemu.VM, death *deathWatch, pace *pacer, firstOutput func()) *watchedConsole {
	death.setKill(vm.Kill)
	go func() {
		<-vm.Done()
		death.stop()
		if pace != nil {
			pace.close()
		}
	}()
	seen := onConsole(death, pace, firstOutput)
	final := func() string {
		if reason := death.verdict(); reason != "" {
			return "the guest is dead, its vm stopped: " + reason
		}
		return ""
	}
	console := newWatchedConsole(c.console, guestconsole.New(), seen, final)
	if pace != nil {
		pace.note = console.note
	}
	return console
}

// onConsole returns what is told of each chunk of the guest's console
// output: death of a verdict, pace (if any) of the kernel's clock, and
// firstOutput (if any) of the first chunk.
func onConsole(death *deathWatch, pace *pacer, firstOutput func()) func(*guestconsole.Watcher) {
	var first sync.Once
	return func(w *guestconsole.Watcher) {
		if firstOutput != nil {
			first.Do(firstOutput)
		}
		if reason, ok := w.Dead(); ok {
			death.dead(reason)
		}
		if pace != nil {
			pace.seen(w)
		}
	}
}

// pageOutBootFiles has the kernel reclaim, off the way to the guest
// running, QEMU's pages of the kernel and initrd of a direct kernel boot
// (procmem.PageOut): the guest has its copy by now. The firmware then
// reads the initrd (and a compressed kernel) through fw_cfg, which brings
// their pages back, until it starts the kernel: the shim does it again
// at the guest's first console output, which comes from the kernel, and
// once more bootFilesRead later, for a kernel that prints nothing. It
// returns what to call at that first output, or nil for a VM without
// boot files.
func (c *build) pageOutBootFiles(vm *qemu.VM) (firstOutput func()) {
	var ids []procmem.FileID
	for _, f := range []*os.File{c.boot.KernelFile, c.boot.InitrdFile} {
		if f == nil {
			continue
		}
		id, err := procmem.FileIDOf(f)
		if err != nil {
			c.logger.WithError(err).Debug("page out boot files")
			return nil
		}
		ids = append(ids, id)
	}
	if len(ids) == 0 {
		return nil
	}
	logger := c.logger
	pageOut := func(when string) {
		begin := time.Now()
		if err := procmem.PageOut(vm.Pid(), ids...); err != nil {
			logger.WithError(err).WithField("when", when).Debug("page out boot files")
			return
		}
		logger.WithFields(log.Fields{"when": when, "ms": time.Since(begin).Milliseconds()}).Debug("boot files paged out")
	}
	go func() {
		pageOut("qemu started")
		select {
		case <-vm.Done():
		case <-time.After(bootFilesRead):
			pageOut("after boot")
		}
	}()
	return func() { go pageOut("guest output") }
}

// microVMTSC gives a microvm guest under TCG its time stamp counter's
// rate on the kernel command line (tsc_early_khz), unless the line sets
// one: microvm has no HPET or ACPI PM timer, so a Linux guest whose PIT
// calibration fails, as it does now and then under TCG on a busy host,
// finds no rate, marks the TSC unstable and hangs in its boot. Under TCG
// the guest's counter is the host's (rate from khz). Other machines and
// KVM keep the line as it is; so does a host whose rate is unknown.
func microVMTSC(machine string, accel qemu.Accel, cmdline string, khz func() (uint64, error)) string {
	if machine != config.MachineMicroVM || accel != qemu.AccelTCG || strings.Contains(" "+cmdline, " tsc_early_khz=") {
		return cmdline
	}
	rate, err := khz()
	if err != nil {
		return cmdline
	}
	return strings.TrimSpace(cmdline + " tsc_early_khz=" + strconv.FormatUint(rate, 10))
}

// bootFilesRead is how long after QEMU's start a guest's firmware is done
// reading the kernel and initrd through fw_cfg, with room to spare.
const bootFilesRead = 30 * time.Second

// watchOOM watches the VM's memory cgroup for OOM kills, so that the task
// reports them; without a cgroup, or if it cannot be watched, the VM
// runs unwatched.
func (c *build) watchOOM() *oom.Watcher {
	if c.limits.memoryDir() == "" {
		return nil
	}
	w, err := oom.Watch(context.Background(), c.limits.memoryDir())
	if err != nil {
		c.logger.WithError(err).Warn("oom kills of this vm will not be reported")
		return nil
	}
	return w
}

// killProcess sends SIGKILL to pid if it is still the process that started
// at the given time, and waits until it is gone.
func killProcess(ctx context.Context, pid int, start uint64) error {
	if st, err := processStart(pid); err != nil || (start != 0 && st != start) {
		return nil // gone, or the pid now belongs to someone else
	}
	if err := unix.Kill(pid, unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
		return err
	}
	// A process that is not our child stays a zombie until its parent
	// reaps it; count a zombie as gone.
	err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		st, err := processState(pid)
		return err != nil || st == 'Z' || st == 'X', nil
	})
	if err != nil {
		return fmt.Errorf("process %d still alive after SIGKILL: %w", pid, err)
	}
	return nil
}

// procStat returns the fields of /proc/PID/stat after the command name.
func procStat(pid int) ([]string, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil, err
	}
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 {
		return nil, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	fields := strings.Fields(string(data[i+1:]))
	if len(fields) < 20 {
		return nil, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	return fields, nil
}

// processStart returns a process's start time in clock ticks since boot.
func processStart(pid int) (uint64, error) {
	f, err := procStat(pid)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(f[19], 10, 64) // field 22 of stat
}

// processState returns a process's state letter (R, S, Z, ...).
func processState(pid int) (byte, error) {
	f, err := procStat(pid)
	if err != nil {
		return 0, err
	}
	return f[0][0], nil
}

// undoProcess stops the task's process (madeProcess), QEMU or a
// sandbox's pause process, if it still runs.
func undoProcess(ctx context.Context, r *Record) error { return killProcess(ctx, r.Pid, r.PidStart) }
