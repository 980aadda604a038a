package launch

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/vmshim/vmshim/config"
	"github.com/vmshim/vmshim/qemu"
	"github.com/vmshim/vmshim/rootdisk"
)

// TestStateDiffers: what a resume needs the same is named, each in a few
// words on one line; MACs may differ.
func TestStateDiffers(t *testing.T) {
	spec := qemu.Spec{CPUs: 1, PluggedCPUs: 2, MaxCPUs: 16, MemoryMiB: 512, ResizeMiB: 1536, Balloon: true,
		NICs: []qemu.NIC{{ID: "net0", MAC: "02:00:00:00:00:01"}}}
	saved := stateShape(&spec)
	if saved.Machine != config.MachineQ35 || saved.Firmware != config.FirmwareBIOS || saved.VCPUs != 1 || saved.Plugged != 2 || saved.MaxVCPUs != 16 {
		t.Fatalf("stateShape %+v", saved)
	}
	for _, tc := range []struct {
		name string
		edit func(s *qemu.Spec)
		want string
	}{
		{"same", func(*qemu.Spec) {}, ""},
		{"another mac", func(s *qemu.Spec) { s.NICs[0].MAC = "02:00:00:00:00:09" }, ""},
		{"2 vcpus", func(s *qemu.Spec) { s.CPUs = 2 }, "2 vCPUs, not 1"},
		{"plugged", func(s *qemu.Spec) { s.PluggedCPUs = 4 }, "4 vCPUs present, not 2"},
		{"max", func(s *qemu.Spec) { s.MaxCPUs = 8 }, "room for 8 vCPUs, not 16"},
		{"ram", func(s *qemu.Spec) { s.MemoryMiB = 1024 }, "1024 MiB of guest RAM, not 512"},
		{"resize", func(s *qemu.Spec) { s.ResizeMiB = 0 }, "guest RAM that can grow by 0 MiB, not 1536"},
		{"firmware", func(s *qemu.Spec) { s.Firmware = &qemu.Firmware{SecureBoot: true} }, "firmware uefi-secure, not bios"},
		{"machine", func(s *qemu.Spec) { s.Machine = config.MachineMicroVM }, "machine microvm, not q35"},
		{"nics", func(s *qemu.Spec) { s.NICs = nil }, "0 NICs, not 1"},
		{"no balloon", func(s *qemu.Spec) { s.Balloon = false }, "no balloon, not a balloon"},
		{"a tpm", func(s *qemu.Spec) { s.TPMFD = 9 }, "a TPM, not no TPM"},
		{"two", func(s *qemu.Spec) { s.CPUs, s.MemoryMiB = 2, 256 }, "2 vCPUs, not 1, 256 MiB of guest RAM, not 512"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now := spec
			now.NICs = append([]qemu.NIC(nil), spec.NICs...)
			tc.edit(&now)
			got := stateDiffers(saved, stateShape(&now))
			if got != tc.want {
				t.Errorf("stateDiffers: %q, want %q", got, tc.want)
			}
		})
	}
}

// TestSaveBudget: a save gets two thirds of the stop's grace period, and
// of the kubelet's default when none is known.
func TestSaveBudget(t *testing.T) {
	for grace, want := range map[time.Duration]time.Duration{
		0:                20 * time.Second,
		30 * time.Second: 20 * time.Second,
		3 * time.Second:  2 * time.Second,
		2 * time.Minute:  80 * time.Second,
	} {
		if got := saveBudget(grace); got != want {
			t.Errorf("saveBudget(%v) = %v, want %v", grace, got, want)
		}
	}
}

// TestResumeError: a state the VM cannot resume refuses it, and stays;
// with on-resume-error boot it is removed, the log says so, and the VM
// goes on to boot. An error of the host refuses the VM either way.
func TestResumeError(t *testing.T) {
	bad := fmt.Errorf("saved from another VM: %w", errdefs.ErrFailedPrecondition)
	host := errors.New("i/o error")
	for _, tc := range []struct {
		name      string
		boots     bool
		err       error
		wantErr   bool
		wantState bool
	}{
		{"refused", false, bad, true, true},
		{"booted", true, bad, false, false},
		{"host error", true, host, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, rootdisk.StateName), []byte("state"), 0o600); err != nil {
				t.Fatal(err)
			}
			var lines []string
			c := &build{
				r:      &Request{Log: func(l string) { lines = append(lines, l) }},
				logger: log.G(context.Background()),
				desc: &config.VM{ResumeErrorBoots: tc.boots,
					RootVolume: &config.RootVolume{Path: "/data", HostDir: dir}},
			}
			err := c.resumeError(tc.err)
			if (err != nil) != tc.wantErr {
				t.Fatalf("resumeError: %v, want an error %v", err, tc.wantErr)
			}
			if err != nil && !errors.Is(err, tc.err) {
				t.Errorf("resumeError: %v, want %v", err, tc.err)
			}
			_, serr := os.Stat(filepath.Join(dir, rootdisk.StateName))
			if kept := serr == nil; kept != tc.wantState {
				t.Errorf("state kept %v, want %v", kept, tc.wantState)
			}
			if !tc.wantErr && (len(lines) != 1 || !strings.Contains(lines[0], "cannot be resumed and is removed") || !strings.Contains(lines[0], "booting the disk")) {
				t.Errorf("container log %q", lines)
			}
		})
	}
}
