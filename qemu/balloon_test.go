package qemu

import (
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

func TestBuildArgsBalloon(t *testing.T) {
	s := baseSpec()
	s.ResizeMiB = 512
	s.Balloon = true
	got, err := BuildArgs(s)
	if err != nil {
		t.Fatal(err)
	}
	// Last, after virtio-mem: it moves no other device's slot.
	want := []string{"-device", "virtio-balloon-pci,id=balloon0,free-page-reporting=on"}
	if !slices.Equal(got[len(got)-2:], want) {
		t.Errorf("argv ends %q, want %q", got[len(got)-4:], want)
	}

	m := microSpec()
	m.Balloon = true
	if got, err = BuildArgs(m); err != nil {
		t.Fatal(err)
	}
	if indexRun(got, []string{"-device", "virtio-balloon-device,id=balloon0,free-page-reporting=on"}) < 0 {
		t.Errorf("a microvm has no virtio-mmio balloon:\n%q", got)
	}

	if got, err = BuildArgs(baseSpec()); err != nil {
		t.Fatal(err)
	}
	if slices.ContainsFunc(got, func(a string) bool { return strings.Contains(a, "balloon") }) {
		t.Errorf("a VM without Balloon has one:\n%q", got)
	}
}

// A balloon where guest RAM cannot be given back is refused in one line.
func TestValidateBalloon(t *testing.T) {
	for _, tc := range []struct {
		name   string
		modify func(*Spec)
		want   string
	}{
		{"huge pages", func(s *Spec) { s.HugePageSize = 2 << 20 }, "guest RAM on huge pages is preallocated"},
		{"vfio", func(s *Spec) { s.VFIO = []string{"0000:01:00.0"} }, "guest RAM of a VM with a passed-through device is pinned"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := baseSpec()
			s.Balloon = true
			tc.modify(&s)
			err := s.Validate()
			if err == nil || !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "invalid balloon: "+tc.want) ||
				strings.Contains(err.Error(), "\n") {
				t.Errorf("got %v, want one invalid-argument line with %q", err, tc.want)
			}
			s.Balloon = false
			if err := s.Validate(); err != nil {
				t.Errorf("without the balloon: %v", err)
			}
		})
	}
}

func TestSetBalloonStatsInterval(t *testing.T) {
	for _, tc := range []struct {
		every   time.Duration
		wantCmd string // "" = refused before QEMU is asked
	}{
		{10 * time.Second, `qom-set {"path":"/machine/peripheral/balloon0","property":"guest-stats-polling-interval","value":10}`},
		{1500 * time.Millisecond, `qom-set {"path":"/machine/peripheral/balloon0","property":"guest-stats-polling-interval","value":1}`},
		{0, `qom-set {"path":"/machine/peripheral/balloon0","property":"guest-stats-polling-interval","value":0}`},
		{time.Millisecond, ""},
		{-time.Second, ""},
		{2 * time.Hour, ""},
	} {
		t.Run(tc.every.String(), func(t *testing.T) {
			c, s := hotplugClient(t, func(peerRequest) string { return okReply })
			err := c.SetBalloonStatsInterval(testCtx(t, time.Second), tc.every)
			cmds := s.commands()
			switch {
			case tc.wantCmd == "" && (err == nil || len(cmds) != 0):
				t.Errorf("interval %v: error %v, QEMU got %q; want refused, nothing sent", tc.every, err, cmds)
			case tc.wantCmd != "" && (err != nil || !reflect.DeepEqual(cmds, []string{tc.wantCmd})):
				t.Errorf("interval %v: error %v, QEMU got %q; want %q", tc.every, err, cmds, tc.wantCmd)
			}
		})
	}
}

func TestGuestMemoryStats(t *testing.T) {
	for _, tc := range []struct {
		name, reply string
		want        GuestMemory
		wantErr     error
	}{
		{
			name: "a Linux guest",
			reply: `"return": {"stats": {"stat-swap-out": 0, "stat-available-memory": 869085184, "stat-free-memory": 902983680,
				"stat-minor-faults": 137442, "stat-major-faults": 210, "stat-total-memory": 1009500160, "stat-swap-in": 0,
				"stat-disk-caches": 40570880, "stat-htlb-pgalloc": 0, "stat-htlb-pgfail": 0}, "last-update": 1764400000}`,
			want: GuestMemory{Updated: time.Unix(1764400000, 0), Total: 1009500160, Free: 902983680, Available: 869085184,
				DiskCaches: 40570880, MajorFaults: 210, MinorFaults: 137442},
		},
		{
			name:  "never reported",
			reply: `"return": {"stats": {"stat-free-memory": -1, "stat-total-memory": -1}, "last-update": 0}`,
			want: GuestMemory{Total: -1, Free: -1, Available: -1, DiskCaches: -1, SwapIn: -1, SwapOut: -1,
				MajorFaults: -1, MinorFaults: -1},
		},
		{
			name:    "no balloon",
			reply:   `"error": {"class": "DeviceNotFound", "desc": "Device '/machine/peripheral/balloon0' not found"}`,
			wantErr: errdefs.ErrNotFound,
		},
		{
			name:    "not stats",
			reply:   `"return": {"stats": "many"}`,
			wantErr: errors.New("any"),
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, s := hotplugClient(t, func(peerRequest) string { return tc.reply })
			got, err := c.GuestMemoryStats(testCtx(t, time.Second))
			switch {
			case tc.wantErr == nil && err != nil:
				t.Fatal(err)
			case tc.wantErr != nil && err == nil:
				t.Fatalf("got %+v, want an error", got)
			case tc.wantErr != nil && tc.wantErr.Error() != "any" && !errors.Is(err, tc.wantErr):
				t.Fatalf("error %v, want %v", err, tc.wantErr)
			}
			if tc.wantErr == nil && got != tc.want {
				t.Errorf("got %+v\nwant %+v", got, tc.want)
			}
			want := []string{`qom-get {"path":"/machine/peripheral/balloon0","property":"guest-stats"}`}
			if cmds := s.commands(); !reflect.DeepEqual(cmds, want) {
				t.Errorf("QEMU got %q, want %q", cmds, want)
			}
		})
	}
}

func TestGuestMemoryString(t *testing.T) {
	m := GuestMemory{Total: 1 << 30, Free: 512 << 20, Available: -1, DiskCaches: 3 << 19, SwapIn: 0, SwapOut: 0, MajorFaults: 7, MinorFaults: -1}
	want := "total=1024.0MiB free=512.0MiB available=- cache=1.5MiB swap_in=0.0MiB swap_out=0.0MiB major_faults=7 minor_faults=-"
	if got := m.String(); got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}

func TestBuildArgsMemMerge(t *testing.T) {
	for _, tc := range []struct {
		name string
		spec Spec
		want string
	}{
		{"q35", baseSpec(), "q35,smbus=off,vmport=off,sata=off"},
		{"q35 unmergeable", func() Spec { s := baseSpec(); s.Unmergeable = true; return s }(), "q35,mem-merge=off,smbus=off,vmport=off,sata=off"},
		{"microvm unmergeable", func() Spec { s := microSpec(); s.Unmergeable = true; return s }(), "microvm,isa-serial=on,rtc=on,pcie=off,mem-merge=off"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := BuildArgs(tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			if indexRun(got, []string{"-machine", tc.want}) < 0 {
				t.Errorf("no -machine %s in\n%q", tc.want, got)
			}
		})
	}
}
