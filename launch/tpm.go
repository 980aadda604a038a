package launch

import (
	"context"
	"fmt"
	"os"
	"os/exec"

	"github.com/containerd/errdefs"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/vmshim/vmshim/config"
	"github.com/vmshim/vmshim/image"
	"github.com/vmshim/vmshim/jail"
	"github.com/vmshim/vmshim/rootdisk"
	"github.com/vmshim/vmshim/tpm"
)

// tpmStateTarget is where swtpm's jail shows the TPM's state file.
const tpmStateTarget = jail.VMDir + "/" + tpm.StateName

// tpm gives a VM that asks for one a TPM 2.0, emulated by swtpm: started
// here, before QEMU, in the VM's cgroup and network namespace, in a jail
// of its own with the VM's ids, no capabilities and no_new_privs. It and
// QEMU share a socketpair, each inheriting one end, so that neither opens
// a path the other controls; swtpm ends when QEMU closes its end. The
// state file is checked, then bound into swtpm's jail: swtpm never opens
// a host path.
func (c *build) tpm(context.Context) error {
	if c.desc.TPM == "" {
		return nil
	}
	if c.j == nil {
		return fmt.Errorf("annotation %s: a TPM needs config jail on: swtpm runs as the VM's own user: %w", config.AnnotationTPM, errdefs.ErrFailedPrecondition)
	}
	if err := tpmFitsKernel(c.boot); err != nil {
		return err
	}
	binary, err := program("config swtpm", c.cfg.SWTPM)
	if err != nil {
		return err
	}
	state, where, err := c.openTPMState()
	if err != nil {
		return err
	}
	if err := tpm.CheckState(state); err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	c.tpmState = where
	// swtpm opens the state by its name in the jail, as the VM's user.
	if err := state.Chown(int(c.rec.JailID), int(c.rec.JailID)); err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("tpm socketpair: %w", err)
	}
	swtpmEnd := os.NewFile(uintptr(fds[0]), "tpm-swtpm")
	defer swtpmEnd.Close()
	qemuEnd := c.keep(os.NewFile(uintptr(fds[1]), "tpm-qemu"))

	j := c.newJail("tpm")
	j.Binds = []jail.Bind{{Target: tpmStateTarget, File: state}}
	if err := os.Mkdir(j.Root, 0o700); err != nil {
		return fmt.Errorf("tpm jail: %w", err)
	}
	cmd := exec.Command(binary, tpm.Args(tpmStateTarget)...)
	cmd.ExtraFiles = []*os.File{swtpmEnd} // tpm.CtrlFD
	stderr := c.logger.WithField("program", "swtpm").WriterLevel(logrus.WarnLevel)
	cmd.Stdout, cmd.Stderr = stderr, stderr
	j.Apply(cmd)
	if err := c.limits.start(cmd, append(netnsSteps(c.nsPath), j.Enter)...); err != nil {
		stderr.Close()
		return fmt.Errorf("start swtpm: %w", err)
	}
	pid := cmd.Process.Pid
	done := make(chan struct{})
	go func() {
		defer close(done)
		err := cmd.Wait()
		stderr.Close()
		c.logger.WithError(err).Debug("swtpm exited")
	}()
	start, _ := processStart(pid)
	if err := c.rec.push(madeTPM, func(r *Record) { r.TPMPid, r.TPMPidStart = pid, start }); err != nil {
		_ = cmd.Process.Kill()
		<-done
		return err
	}
	c.qs.TPMFD = c.fds.Add(qemuEnd)
	return nil
}

// tpmFitsKernel refuses a TPM for a kernel booted directly from its ELF
// (PVH) with an initrd. QEMU 7.2 puts such an initrd just below the room
// it keeps for the firmware's ACPI tables at the top of guest RAM, which
// a TPM outgrows (SeaBIOS's TPM event log): the initrd then overwrites
// the tables, and the guest boots with neither its TPM nor its power
// button. A bzImage's initrd is placed lower.
func tpmFitsKernel(boot *image.Boot) error {
	if boot.KernelFile == nil || boot.InitrdFile == nil {
		return nil
	}
	magic := make([]byte, 4)
	if _, err := boot.KernelFile.ReadAt(magic, 0); err != nil {
		return fmt.Errorf("kernel: %w", err)
	}
	if string(magic) != "\x7fELF" {
		return nil
	}
	return fmt.Errorf("annotation %s: the image's kernel is an ELF vmlinux booted with an initrd, whose initrd QEMU would load over the ACPI tables the TPM needs: pack a bzImage (vmlinuz) instead: %w",
		config.AnnotationTPM, errdefs.ErrInvalidArgument)
}

// openTPMState opens the VM's TPM state, read-write, and says where it is:
// kept on the root disk's filesystem volume, beside the disk and the UEFI
// variables, or, with none, made empty in the VM's files directory, where
// it lives and dies with the container.
func (c *build) openTPMState() (_ *os.File, where string, _ error) {
	if v := c.desc.RootVolume; v != nil && !v.Block {
		f, err := rootdisk.KeptOnDirectory(v.HostDir, v.Path, tpm.StateName)
		if err != nil {
			return nil, "", err
		}
		return c.keep(f), fmt.Sprintf("root disk volume %s: %s", v.Path, tpm.StateName), nil
	}
	f, err := c.create(tpm.StateName)
	if err != nil {
		return nil, "", fmt.Errorf("tpm state: %w", err)
	}
	return f, "tpm state " + f.Name(), nil
}

// undoTPM stops the VM's swtpm (madeTPM), if it still runs: it ends by
// itself once QEMU is gone, but not if QEMU never started.
func undoTPM(ctx context.Context, r *Record) error { return killProcess(ctx, r.TPMPid, r.TPMPidStart) }
