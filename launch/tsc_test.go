package launch

import (
	"errors"
	"testing"

	"github.com/vmshim/vmshim/config"
	"github.com/vmshim/vmshim/qemu"
)

func TestMicroVMTSC(t *testing.T) {
	rate := func() (uint64, error) { return 2596044, nil }
	unknown := func() (uint64, error) { return 0, errors.New("no counter") }
	for _, tc := range []struct {
		name, machine string
		accel         qemu.Accel
		cmdline       string
		khz           func() (uint64, error)
		want          string
	}{
		{"microvm under tcg", config.MachineMicroVM, qemu.AccelTCG, "console=ttyS0 no_timer_check", rate, "console=ttyS0 no_timer_check tsc_early_khz=2596044"},
		{"empty line", config.MachineMicroVM, qemu.AccelTCG, "", rate, "tsc_early_khz=2596044"},
		{"the line sets one", config.MachineMicroVM, qemu.AccelTCG, "console=ttyS0 tsc_early_khz=1000000", rate, "console=ttyS0 tsc_early_khz=1000000"},
		{"the line sets one first", config.MachineMicroVM, qemu.AccelTCG, "tsc_early_khz=1000000", rate, "tsc_early_khz=1000000"},
		{"a look-alike is not one", config.MachineMicroVM, qemu.AccelTCG, "xtsc_early_khz=1", rate, "xtsc_early_khz=1 tsc_early_khz=2596044"},
		{"kvm", config.MachineMicroVM, qemu.AccelKVM, "console=ttyS0", rate, "console=ttyS0"},
		{"q35", config.MachineQ35, qemu.AccelTCG, "console=ttyS0", rate, "console=ttyS0"},
		{"rate unknown", config.MachineMicroVM, qemu.AccelTCG, "console=ttyS0", unknown, "console=ttyS0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := microVMTSC(tc.machine, tc.accel, tc.cmdline, tc.khz); got != tc.want {
				t.Fatalf("microVMTSC = %q, want %q", got, tc.want)
			}
		})
	}
}
