package qemu

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// Accelerator modes accepted by ChooseAccel.
const (
	// AccelModeAuto picks KVM when it is usable and fast, TCG otherwise.
	AccelModeAuto = "auto"
	// AccelModeKVM requires KVM.
	AccelModeKVM = "kvm"
	// AccelModeTCG always uses TCG.
	AccelModeTCG = "tcg"
)

// Host paths the accelerator checks look at.
const (
	// KVMDevice is the KVM device node.
	KVMDevice = "/dev/kvm"
	// PVMModule exists when the kvm_pvm module (KVM without hardware
	// virtualization) is loaded; a normal kernel runs far too slowly on it.
	PVMModule = "/sys/module/kvm_pvm"
)

// Speed probe parameters.
const (
	// ProbeIterations is how many loop iterations the probe firmware runs.
	ProbeIterations = 5_000_000
	// ProbeBudget is how long those iterations may take under KVM; real
	// hardware virtualization needs a few milliseconds, PVM seconds.
	ProbeBudget = 250 * time.Millisecond
	// ProbeExitCode is QEMU's exit status when the probe firmware finishes.
	ProbeExitCode = probeExitValue<<1 | 1
	// probeStartTimeout bounds QEMU's own start-up before the loop begins.
	probeStartTimeout = 10 * time.Second
	// probeExitValue is written to isa-debug-exit, which exits (v<<1)|1.
	probeExitValue = 0x31
	// probeExitPort is the isa-debug-exit I/O port.
	probeExitPort = 0xf4
	// probeMarker is written to COM1 as the loop starts.
	probeMarker = 'S'
	// kvmAPIVersion is the only KVM API version Linux has shipped.
	kvmAPIVersion = 12
	// kvmGetAPIVersion is the KVM_GET_API_VERSION ioctl.
	kvmGetAPIVersion = 0xAE00
)

// AccelProbes are the host checks behind ChooseAccel, replaceable in tests.
type AccelProbes struct {
	// KVMUsable returns nil when the KVM device opens read-write.
	KVMUsable func() error
	// PVMLoaded reports whether the kvm_pvm module is loaded.
	PVMLoaded func() bool
	// Speed runs the speed probe under KVM and returns the loop time.
	Speed func(ctx context.Context) (time.Duration, error)
}

// HostProbes returns the probes for this host, using binary for the speed probe.
func HostProbes(binary string) AccelProbes {
	return AccelProbes{
		KVMUsable: func() error { return checkKVM(KVMDevice) },
		PVMLoaded: func() bool {
			_, err := os.Stat(PVMModule)
			return err == nil
		},
		Speed: func(ctx context.Context) (time.Duration, error) {
			return SpeedProbe(ctx, binary, AccelKVM)
		},
	}
}

// ChooseAccel picks the accelerator for mode (auto, kvm or tcg; empty means
// auto) and says why, including why KVM was rejected.
func ChooseAccel(ctx context.Context, mode string, binary string) (Accel, string, error) {
	return HostProbes(binary).Choose(ctx, mode)
}

// Choose picks the accelerator for mode using p and says why.
func (p AccelProbes) Choose(ctx context.Context, mode string) (Accel, string, error) {
	switch mode {
	case AccelModeTCG:
		return AccelTCG, "accel tcg configured", nil
	case AccelModeKVM:
		if err := p.KVMUsable(); err != nil {
			return "", "", fmt.Errorf("accel kvm configured but %s is unusable: %w: %w", KVMDevice, err, errdefs.ErrFailedPrecondition)
		}
		if p.PVMLoaded() {
			return AccelKVM, "accel kvm configured (kvm_pvm is loaded: expect a very slow guest)", nil
		}
		return AccelKVM, "accel kvm configured", nil
	case AccelModeAuto, "":
	default:
		return "", "", fmt.Errorf("invalid accel mode %q: want auto, kvm or tcg: %w", mode, errdefs.ErrInvalidArgument)
	}
	if err := p.KVMUsable(); err != nil {
		return AccelTCG, fmt.Sprintf("kvm rejected: %s is unusable: %v", KVMDevice, err), nil
	}
	if p.PVMLoaded() {
		return AccelTCG, fmt.Sprintf("kvm rejected: %s is loaded (pvm runs guests far too slowly)", PVMModule), nil
	}
	d, err := p.Speed(ctx)
	if ctx.Err() != nil {
		return "", "", fmt.Errorf("choose accel: %w", ctx.Err())
	}
	if err != nil {
		return AccelTCG, fmt.Sprintf("kvm rejected: speed probe: %v", err), nil
	}
	return AccelKVM, fmt.Sprintf("kvm passed the speed probe (%d iterations in %s)", ProbeIterations, d.Round(time.Microsecond)), nil
}

// checkKVM opens the KVM device read-write and checks its API version.
func checkKVM(path string) error {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	v, err := unix.IoctlRetInt(fd, kvmGetAPIVersion)
	if err != nil {
		return fmt.Errorf("KVM_GET_API_VERSION on %s: %w", path, err)
	}
	if v != kvmAPIVersion {
		return fmt.Errorf("%s has kvm api version %d, want %d", path, v, kvmAPIVersion)
	}
	return nil
}

// probeFirmware builds a 64 KiB BIOS image. Its reset vector jumps to code
// that writes banner to COM1, counts down iterations (>= 1) and writes to
// isa-debug-exit, so QEMU exits with ProbeExitCode.
func probeFirmware(iterations uint32, banner string) []byte {
	const size, codeAt, resetAt = 64 << 10, 0xf000, 0xfff0
	img := make([]byte, size)
	for i := range img {
		img[i] = 0xff
	}
	code := []byte{0xba, 0xf8, 0x03} // mov dx, 0x3f8
	for i := 0; i < len(banner); i++ {
		code = append(code, 0xb0, banner[i], 0xee) // mov al, c; out dx, al
	}
	code = append(code, 0x66, 0xb9) // mov ecx, iterations
	code = binary.LittleEndian.AppendUint32(code, iterations)
	code = append(code,
		0x66, 0x49, // loop: dec ecx
		0x75, 0xfc, // jnz loop
		0xb0, probeExitValue, // mov al, value
		0xe6, probeExitPort, // out port, al
		0xfa,       // cli
		0xf4,       // halt: hlt
		0xeb, 0xfd, // jmp halt
	)
	copy(img[codeAt:], code)
	// At reset CS:IP is f000:fff0; a near jump stays in that segment.
	rel := codeAt - (resetAt + 3)
	img[resetAt] = 0xe9
	binary.LittleEndian.PutUint16(img[resetAt+1:], uint16(rel))
	return img
}

// SpeedProbe boots the probe firmware under accel and returns how long its
// ProbeIterations-iteration loop took; it fails when the loop takes longer
// than ProbeBudget or QEMU does not exit with ProbeExitCode.
func SpeedProbe(ctx context.Context, binary string, accel Accel) (time.Duration, error) {
	return runProbe(ctx, binary, accel, ProbeIterations, ProbeBudget)
}

func runProbe(ctx context.Context, binary string, accel Accel, iterations uint32, budget time.Duration) (_ time.Duration, retErr error) {
	if iterations == 0 {
		return 0, fmt.Errorf("invalid probe iterations: 0: %w", errdefs.ErrInvalidArgument)
	}
	dir, err := os.MkdirTemp("", "vmshim-probe-")
	if err != nil {
		return 0, fmt.Errorf("speed probe: %w", err)
	}
	defer os.RemoveAll(dir)
	fw := filepath.Join(dir, "probe.bin")
	if err = os.WriteFile(fw, probeFirmware(iterations, string(rune(probeMarker))), 0o600); err != nil {
		return 0, fmt.Errorf("speed probe: %w", err)
	}
	cpu := "max"
	if accel == AccelKVM {
		cpu = "host"
	}
	r, w, err := os.Pipe()
	if err != nil {
		return 0, fmt.Errorf("speed probe: %w", err)
	}
	defer r.Close()
	stderr := &tailWriter{max: stderrTailSize}
	cmd := exec.Command(binary,
		"-nodefaults", "-no-user-config", "-display", "none",
		"-machine", MachineType, "-accel", string(accel), "-cpu", cpu, "-m", "16",
		"-bios", fw,
		"-device", fmt.Sprintf("isa-debug-exit,iobase=%#x,iosize=1", probeExitPort),
		"-serial", "stdio")
	cmd.Stdout = w
	cmd.Stderr = stderr
	err = cmd.Start()
	w.Close()
	if err != nil {
		return 0, fmt.Errorf("speed probe: start %s: %w", binary, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	defer func() {
		if retErr != nil {
			_ = cmd.Process.Kill()
		}
		<-exited
	}()

	started := make(chan time.Time, 1)
	read := make(chan struct{}) // closed once the first read returned
	go func() {
		defer close(read)
		b := make([]byte, 1)
		if n, _ := r.Read(b); n == 1 && b[0] == probeMarker {
			started <- time.Now()
		}
	}()
	startTimer := time.NewTimer(probeStartTimeout)
	defer startTimer.Stop()
	var t0 time.Time
	select {
	case t0 = <-started:
	case <-exited:
		// The marker may still be on its way from the pipe: once the
		// process is gone, the read returns soon.
		select {
		case <-read:
		case <-time.After(time.Second):
		}
		select {
		case t0 = <-started:
		default:
			return 0, fmt.Errorf("speed probe: qemu exited with status %d before the loop started: %s",
				exitCode(cmd.ProcessState), stderr.lastLines(2))
		}
	case <-startTimer.C:
		return 0, fmt.Errorf("speed probe: firmware did not start within %s: %s", probeStartTimeout, stderr.lastLines(2))
	case <-ctx.Done():
		return 0, fmt.Errorf("speed probe: %w", ctx.Err())
	}
	budgetTimer := time.NewTimer(budget)
	defer budgetTimer.Stop()
	select {
	case <-exited:
	case <-budgetTimer.C:
		return 0, fmt.Errorf("speed probe: %d iterations took longer than %s under %s", iterations, budget, accel)
	case <-ctx.Done():
		return 0, fmt.Errorf("speed probe: %w", ctx.Err())
	}
	d := time.Since(t0)
	if code := exitCode(cmd.ProcessState); code != ProbeExitCode {
		return 0, fmt.Errorf("speed probe: qemu exited with status %d, want %d: %s", code, ProbeExitCode, stderr.lastLines(2))
	}
	return d, nil
}
