package launch

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/vmshim/vmshim/config"
	"github.com/vmshim/vmshim/qemu"
)

// A passed-through device takes the balloon away, or refuses the VM
// when the annotation asked for one.
func TestBuildBalloon(t *testing.T) {
	for _, tc := range []struct {
		name           string
		balloon, asked bool
		vfio           []string
		want           bool
		wantErr        string
	}{
		{name: "balloon", balloon: true, want: true},
		{name: "none", balloon: false},
		{name: "vfio", balloon: true, vfio: []string{"0000:01:00.0"}},
		{name: "vfio, asked for", balloon: true, asked: true, vfio: []string{"0000:01:00.0"},
			wantErr: "annotation vmshim.io/balloon: on: guest RAM of a VM with a passed-through device (0000:01:00.0) is pinned and cannot be given back"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &build{desc: &config.VM{Balloon: tc.balloon, BalloonAsked: tc.asked}}
			c.qs.VFIO = tc.vfio
			err := c.balloon()
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatal(err)
			case tc.wantErr != "" && (err == nil || !errdefs.IsInvalidArgument(err) || !strings.HasPrefix(err.Error(), tc.wantErr)):
				t.Fatalf("error %v, want an invalid argument %q", err, tc.wantErr)
			}
			if tc.wantErr == "" && c.qs.Balloon != tc.want {
				t.Errorf("balloon %v, want %v", c.qs.Balloon, tc.want)
			}
		})
	}
}

// The guest's statistics are read from QEMU at most once an interval,
// however often they are asked for; a failed read is not kept.
func TestGuestMemoryGet(t *testing.T) {
	reads, fail := 0, false
	g := &guestMemory{every: time.Hour, stats: func(ctx context.Context) (qemu.GuestMemory, error) {
		reads++
		if fail {
			return qemu.GuestMemory{}, errors.New("qmp went away")
		}
		return qemu.GuestMemory{Updated: time.Unix(int64(reads), 0), Total: 1 << 30, Free: int64(reads) << 20}, nil
	}}
	fail = true
	if _, err := g.get(context.Background()); err == nil {
		t.Fatal("a failed read gave no error")
	}
	fail = false
	for range 3 {
		m, err := g.get(context.Background())
		if err != nil || m.Free != 2<<20 {
			t.Fatalf("got %+v, %v; want the second read's", m, err)
		}
	}
	if reads != 2 {
		t.Errorf("QEMU read %d times, want 2: once failing, then once an hour", reads)
	}
	g.every = time.Nanosecond
	if m, err := g.get(context.Background()); err != nil || m.Free != 3<<20 {
		t.Errorf("an old read: got %+v, %v; want it read again", m, err)
	}
}

// GuestMemory says nothing for a VM without statistics, or whose guest
// never reported, and one line for one that did.
func TestQEMUVMGuestMemory(t *testing.T) {
	ctx := context.Background()
	if line, err := (&qemuVM{}).GuestMemory(ctx); line != "" || err != nil {
		t.Errorf("no balloon: %q, %v", line, err)
	}
	never := &qemuVM{guestMem: &guestMemory{every: time.Second, stats: func(context.Context) (qemu.GuestMemory, error) {
		return qemu.GuestMemory{Total: -1, Free: -1}, nil
	}}}
	if line, err := never.GuestMemory(ctx); line != "" || err != nil {
		t.Errorf("never reported: %q, %v", line, err)
	}
	at := time.Date(2026, 11, 29, 9, 0, 0, 0, time.UTC)
	reported := &qemuVM{guestMem: &guestMemory{every: time.Second, stats: func(context.Context) (qemu.GuestMemory, error) {
		return qemu.GuestMemory{Updated: at, Total: 1 << 30, Free: 1 << 29, Available: -1, DiskCaches: 0, SwapIn: 0, SwapOut: 0}, nil
	}}}
	line, err := reported.GuestMemory(ctx)
	if want := "total=1024.0MiB free=512.0MiB available=- cache=0.0MiB swap_in=0.0MiB swap_out=0.0MiB major_faults=0 minor_faults=0 reported=2026-11-29T09:00:00Z"; line != want || err != nil {
		t.Errorf("got %q, %v\nwant %q", line, err, want)
	}
}
