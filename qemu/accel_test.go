package qemu

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

func TestChooseAccelDecision(t *testing.T) {
	errNoKVM := errors.New("open /dev/kvm: permission denied")
	fast := func(context.Context) (time.Duration, error) { return 3 * time.Millisecond, nil }
	slow := func(context.Context) (time.Duration, error) {
		return 0, errors.New("5000000 iterations took longer than 250ms under kvm")
	}
	tests := []struct {
		name       string
		mode       string
		kvm        error
		pvm        bool
		speed      func(context.Context) (time.Duration, error)
		want       Accel
		reason     string // substring
		err        error  // sentinel
		speedCalls int
	}{
		{name: "tcg forced", mode: "tcg", kvm: nil, speed: fast, want: AccelTCG, reason: "tcg configured"},
		{name: "tcg forced without kvm", mode: "tcg", kvm: errNoKVM, want: AccelTCG, reason: "tcg configured"},
		{name: "kvm forced", mode: "kvm", speed: slow, want: AccelKVM, reason: "kvm configured"},
		{name: "kvm forced on pvm warns", mode: "kvm", pvm: true, want: AccelKVM, reason: "kvm_pvm"},
		{name: "kvm forced unusable", mode: "kvm", kvm: errNoKVM, err: errdefs.ErrFailedPrecondition},
		{name: "auto fast kvm", mode: "auto", speed: fast, want: AccelKVM, reason: "passed the speed probe", speedCalls: 1},
		{name: "empty mode is auto", mode: "", speed: fast, want: AccelKVM, reason: "passed the speed probe", speedCalls: 1},
		{name: "auto no kvm", mode: "auto", kvm: errNoKVM, speed: fast, want: AccelTCG, reason: "permission denied"},
		{name: "auto pvm", mode: "auto", pvm: true, speed: fast, want: AccelTCG, reason: "kvm_pvm"},
		{name: "auto slow kvm", mode: "auto", speed: slow, want: AccelTCG, reason: "took longer", speedCalls: 1},
		{name: "bad mode", mode: "hvf", err: errdefs.ErrInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			calls := 0
			p := AccelProbes{
				KVMUsable: func() error { return tt.kvm },
				PVMLoaded: func() bool { return tt.pvm },
				Speed: func(ctx context.Context) (time.Duration, error) {
					calls++
					if tt.speed == nil {
						t.Error("speed probe called")
						return 0, errors.New("unexpected")
					}
					return tt.speed(ctx)
				},
			}
			got, reason, err := p.Choose(context.Background(), tt.mode)
			if tt.err != nil {
				if !errors.Is(err, tt.err) {
					t.Fatalf("error = %v, want %v", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("accel = %s, want %s (reason %q)", got, tt.want, reason)
			}
			if !strings.Contains(reason, tt.reason) {
				t.Errorf("reason %q lacks %q", reason, tt.reason)
			}
			if calls != tt.speedCalls {
				t.Errorf("speed probe ran %d times, want %d", calls, tt.speedCalls)
			}
		})
	}
}

func TestChooseAccelCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	p := AccelProbes{
		KVMUsable: func() error { return nil },
		PVMLoaded: func() bool { return false },
		Speed: func(ctx context.Context) (time.Duration, error) {
			cancel()
			return 0, ctx.Err()
		},
	}
	if _, _, err := p.Choose(ctx, "auto"); !errors.Is(err, context.Canceled) {
		t.Fatalf("error = %v, want context.Canceled", err)
	}
}

// TestChooseAccelHost checks that auto picks TCG on a host with kvm_pvm.
func TestChooseAccelHost(t *testing.T) {
	if _, err := os.Stat(PVMModule); err != nil {
		t.Skipf("%s not present: this check is for PVM hosts", PVMModule)
	}
	got, reason, err := ChooseAccel(testCtx(t, 10*time.Second), "auto", "qemu-system-x86_64")
	if err != nil {
		t.Fatal(err)
	}
	if got != AccelTCG {
		t.Errorf("accel = %s (%s), want tcg", got, reason)
	}
	if !strings.Contains(reason, "kvm rejected") {
		t.Errorf("reason %q does not say why kvm was rejected", reason)
	}
	t.Logf("auto: %s: %s", got, reason)
}

func TestCheckKVM(t *testing.T) {
	if err := checkKVM(filepath.Join(t.TempDir(), "kvm")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing device: %v", err)
	}
	if err := checkKVM("/dev/null"); err == nil {
		t.Error("/dev/null passed as kvm")
	}
}

func TestProbeFirmwareLayout(t *testing.T) {
	img := probeFirmware(1234, "S")
	if len(img) != 64<<10 {
		t.Fatalf("size %d", len(img))
	}
	reset := img[0xfff0:]
	if reset[0] != 0xe9 {
		t.Fatalf("reset vector starts with %#x, want a near jmp", reset[0])
	}
	target := uint16(0xfff3 + binary.LittleEndian.Uint16(reset[1:]))
	code := img[target:]
	want := []byte{0xba, 0xf8, 0x03, 0xb0, 'S', 0xee, 0x66, 0xb9, 0xd2, 0x04, 0x00, 0x00}
	if string(code[:len(want)]) != string(want) {
		t.Errorf("code at %#x = % x, want % x", target, code[:len(want)], want)
	}
}

func TestSpeedProbeTCG(t *testing.T) {
	bin := qemuBinary(t)
	d, err := runProbe(testCtx(t, 30*time.Second), bin, AccelTCG, ProbeIterations, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d iterations under tcg: %s", ProbeIterations, d)
}

func TestSpeedProbeTooSlow(t *testing.T) {
	bin := qemuBinary(t)
	start := time.Now()
	_, err := runProbe(testCtx(t, 30*time.Second), bin, AccelTCG, 0xffffffff, 50*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "took longer than 50ms") {
		t.Fatalf("error = %v, want too slow", err)
	}
	if d := time.Since(start); d > 15*time.Second {
		t.Errorf("probe took %s to give up", d)
	}
}

func TestSpeedProbeBadExit(t *testing.T) {
	bin := fakeQEMU(t, `echo "no kvm here" >&2; exit 1`)
	_, err := SpeedProbe(testCtx(t, 10*time.Second), bin, AccelKVM)
	if err == nil || !strings.Contains(err.Error(), "status 1") || !strings.Contains(err.Error(), "no kvm here") {
		t.Fatalf("error = %v", err)
	}
	bin = fakeQEMU(t, `printf S; exit 0`)
	_, err = SpeedProbe(testCtx(t, 10*time.Second), bin, AccelKVM)
	if err == nil || !strings.Contains(err.Error(), "status 0, want 99") {
		t.Fatalf("error = %v", err)
	}
}

func TestSpeedProbeCancelled(t *testing.T) {
	bin := fakeQEMU(t, `exec sleep 60`)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := SpeedProbe(ctx, bin, AccelKVM); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("error = %v, want deadline exceeded", err)
	}
}
