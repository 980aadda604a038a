package guest_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// The OVMF firmware of Debian's ovmf package: the code, read-only, and a
// template of its variable store, copied for each VM.
const (
	ovmfCode       = "/usr/share/OVMF/OVMF_CODE_4M.fd"
	ovmfVars       = "/usr/share/OVMF/OVMF_VARS_4M.fd"
	ovmfSecureCode = "/usr/share/OVMF/OVMF_CODE_4M.secboot.fd" // needs SMM
	ovmfSecureVars = "/usr/share/OVMF/OVMF_VARS_4M.ms.fd"      // Microsoft's keys enrolled: Secure Boot on
)

// markerEFI starts the line init.sh prints on an EFI boot only.
const markerEFI = "VMSHIM-EFI "

// uefiMemory is the guest memory of the UEFI boots: with 256 MiB, Debian's
// GRUB 2.06 runs out of memory loading the kernel (its heap takes a
// quarter of the RAM and the kernel asks for 63 MiB), and under Secure
// Boot the kernel's EFI stub fails to decompress it up to 288 MiB.
const uefiMemory = "384"

// uefiGuestDir builds the guests of build.sh and uefi.sh (both
// idempotent) and returns the output dir; it skips without OVMF.
func uefiGuestDir(t *testing.T) string {
	t.Helper()
	guestDir(t)
	for _, f := range []string{ovmfCode, ovmfVars, ovmfSecureCode, ovmfSecureVars} {
		if _, err := os.Stat(f); err != nil {
			t.Skipf("OVMF firmware missing (package ovmf): %v", err)
		}
	}
	return buildGuest(t, "uefi.sh", 10*time.Minute)
}

// firmware returns QEMU's arguments for OVMF: uefiMemory, the code
// read-only and a private copy of the variable store; with secure, the
// Secure Boot build, which needs SMM and flash that only SMM may write.
func firmware(t *testing.T, secure bool) []string {
	t.Helper()
	code, vars := ovmfCode, ovmfVars
	args := []string{"-m", uefiMemory} // overrides startVM's
	if secure {
		code, vars = ovmfSecureCode, ovmfSecureVars
		args = append(args, "-machine", "smm=on", "-global", "driver=cfi.pflash01,property=secure,value=on")
	}
	data, err := os.ReadFile(vars)
	if err != nil {
		t.Fatal(err)
	}
	copied := filepath.Join(t.TempDir(), "vars.fd")
	if err := os.WriteFile(copied, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return append(args,
		"-drive", "if=pflash,format=raw,unit=0,readonly=on,file="+code,
		"-drive", "if=pflash,format=raw,unit=1,file="+copied)
}

// noMarker fails the test if a console line so far starts with prefix.
func (v *vm) noMarker(prefix string) {
	v.t.Helper()
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, line := range v.log {
		if strings.HasPrefix(line, prefix) {
			v.t.Errorf("unexpected console line %q", line)
		}
	}
}

func TestGuestUEFI(t *testing.T) {
	dir := uefiGuestDir(t)
	tests := []struct {
		name, disk string
		secure     bool
		want       string
	}{
		{"uefi", "disk-uefi.qcow2", false, markerEFI + "secureboot=0"},
		{"uefi-secure", "disk-uefi-secure.qcow2", true, markerEFI + "secureboot=1"},
		// Without Secure Boot, shim runs any GRUB.
		{"uefi-unsigned-no-secure-boot", "disk-uefi-unsigned.qcow2", false, markerEFI + "secureboot=0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			boot := append(firmware(t, tt.secure),
				"-drive", "file="+filepath.Join(dir, tt.disk)+",format=qcow2,if=virtio,snapshot=on")
			v := startVM(t, ctx, boot...)
			// Before BOOTED, which booted then waits for.
			if got := v.waitFor(markerEFI, 3*time.Minute); got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
			if got := v.waitFor("VMSHIM-DISK-BOOTS ", 10*time.Second); got != "VMSHIM-DISK-BOOTS 0" {
				t.Errorf("got %q, want VMSHIM-DISK-BOOTS 0", got)
			}
			v.booted(tt.name)
			poweroffByConsole(ctx, v)
			v.waitExit(30 * time.Second)
			v.wholeLines()
			v.noMarker("VMSHIM-GUEST-WARNING")
		})
	}
}

// rawVM is QEMU whose console is kept as bytes: what firmware and boot
// loaders print need not end in a newline.
type rawVM struct {
	cmd   *exec.Cmd
	start time.Time
	mu    sync.Mutex // guards out
	out   bytes.Buffer
}

// Write keeps console output.
func (r *rawVM) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.out.Write(p)
}

func (r *rawVM) contains(s string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return bytes.Contains(r.out.Bytes(), []byte(s))
}

// startRawVM runs QEMU like startVM, killed at the end of the test.
func startRawVM(t *testing.T, ctx context.Context, boot ...string) *rawVM {
	t.Helper()
	args := append([]string{
		"-accel", "tcg", "-nodefaults", "-display", "none", "-machine", "q35", "-m", "256", "-serial", "stdio",
	}, boot...)
	r := &rawVM{cmd: exec.CommandContext(ctx, "qemu-system-x86_64", args...)}
	r.cmd.Stdout, r.cmd.Stderr = r, r
	r.start = time.Now()
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = r.cmd.Process.Kill()
		_ = r.cmd.Wait()
		if t.Failed() {
			r.mu.Lock()
			t.Logf("console:\n%q", r.out.String())
			r.mu.Unlock()
		}
	})
	return r
}

// waitFor polls the console until it holds s or timeout passes.
func (r *rawVM) waitFor(s string, timeout time.Duration) bool {
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if r.contains(s) {
			return true
		}
	}
	return r.contains(s)
}

func TestGuestUEFIRefused(t *testing.T) {
	dir := uefiGuestDir(t)
	t.Run("unsigned-grub-under-secure-boot", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		r := startRawVM(t, ctx, append(firmware(t, true),
			"-drive", "file="+filepath.Join(dir, "disk-uefi-unsigned.qcow2")+",format=qcow2,if=virtio,snapshot=on")...)
		// shim's dialog: "Verification failed: (0x1A) Security Violation".
		if !r.waitFor("Security Violation", 3*time.Minute) {
			t.Fatal("shim did not refuse the unsigned GRUB")
		}
		t.Logf("shim refused the unsigned GRUB after %.1fs", time.Since(r.start).Seconds())
		if r.waitFor(markerBooted, 5*time.Second) {
			t.Error("the unsigned GRUB booted the guest under Secure Boot")
		}
	})
	t.Run("uefi-disk-under-seabios", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		r := startRawVM(t, ctx,
			"-drive", "file="+filepath.Join(dir, "disk-uefi.qcow2")+",format=qcow2,if=virtio,snapshot=on")
		// A BIOS disk boots in about 10 s under TCG; this one has no
		// boot code.
		if r.waitFor(markerBooted, 20*time.Second) {
			t.Error("the UEFI disk booted under SeaBIOS")
		}
	})
}

func TestGuestCDROM(t *testing.T) {
	dir := uefiGuestDir(t)
	iso := filepath.Join(dir, "cdrom-wait.iso")
	tests := []struct {
		name     string
		boot     []string
		diskBus  string // the empty disk's if=
		wantDisk string // in VMSHIM-DISKS, besides sr0
	}{
		// q35: if=ide is the ICH9 AHCI controller (ahci).
		{"q35-ahci", []string{"-drive", "file=" + iso + ",media=cdrom,if=ide"}, "virtio", "vda:131072"},
		// i440FX: the PIIX IDE controller (ata_piix) for both.
		{"pc-ide", []string{"-machine", "pc", "-drive", "file=" + iso + ",media=cdrom,if=ide,index=2"}, "ide,index=0", "sda:131072"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			defer cancel()
			// The install-any-OS case: an empty root disk and the CD.
			empty := filepath.Join(t.TempDir(), "empty.raw")
			if err := os.WriteFile(empty, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(empty, 64<<20); err != nil {
				t.Fatal(err)
			}
			boot := append([]string{"-drive", "file=" + empty + ",format=raw,if=" + tt.diskBus, "-boot", "order=d"}, tt.boot...)
			v := startVM(t, ctx, boot...)
			disks := strings.Fields(v.waitFor("VMSHIM-DISKS ", 3*time.Minute))
			if !slices.Contains(disks, tt.wantDisk) {
				t.Errorf("%q lacks %s", disks, tt.wantDisk)
			}
			if !slices.ContainsFunc(disks, func(d string) bool {
				return strings.HasPrefix(d, "sr0:") && strings.HasSuffix(d, ":ro")
			}) {
				t.Errorf("%q lacks the read-only sr0", disks)
			}
			if cmdline := v.waitFor("VMSHIM-CMDLINE ", 10*time.Second); !strings.Contains(cmdline, "vmshim.mode=wait") {
				t.Errorf("%q lacks vmshim.mode=wait", cmdline)
			}
			v.booted(tt.name)
			poweroffByConsole(ctx, v)
			v.waitExit(30 * time.Second)
			v.wholeLines()
			v.noMarker(markerEFI) // a BIOS boot
			v.noMarker("VMSHIM-GUEST-WARNING")
		})
	}
}

// TestGuestNoVirtio boots the BIOS disk from a SATA (AHCI) controller with
// the three emulated NICs the initramfs drives besides virtio. Each gets a
// lease from its own restricted user-mode network, which reaches nothing
// outside QEMU.
func TestGuestNoVirtio(t *testing.T) {
	dir := guestDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	boot := []string{
		"-device", "ahci,id=ahci",
		"-drive", "id=d,file=" + filepath.Join(dir, "disk-wait.qcow2") + ",if=none,format=qcow2,snapshot=on",
		"-device", "ide-hd,drive=d,bus=ahci.0,bootindex=1",
	}
	for i, nic := range []string{"e1000", "e1000e", "rtl8139"} {
		id := fmt.Sprintf("n%d", i)
		boot = append(boot, "-netdev", "user,id="+id+",restrict=on", "-device", nic+",netdev="+id)
	}
	v := startVM(t, ctx, boot...)
	if got := v.waitFor("VMSHIM-DISKS ", 3*time.Minute); got != "VMSHIM-DISKS sda:67584" {
		t.Errorf("got %q, want VMSHIM-DISKS sda:67584", got)
	}
	v.booted("sata-e1000-e1000e-rtl8139")
	v.waitForAll(time.Minute, "VMSHIM-LEASE if=eth0 ", "VMSHIM-LEASE if=eth1 ", "VMSHIM-LEASE if=eth2 ")
	poweroffByConsole(ctx, v)
	v.waitExit(30 * time.Second)
	v.wholeLines()
	v.noMarker("VMSHIM-GUEST-WARNING")
}
