package qemu

import (
	"context"
	"fmt"
	"strconv"
	"time"
)

// The balloon: a virtio-balloon device that is never inflated. It is
// there for free page reporting (the guest tells QEMU which pages it has
// freed, and QEMU gives them back to the host) and for the guest's own
// memory statistics.

// BalloonDevice is the id of the VM's virtio-balloon device.
const BalloonDevice = "balloon0"

// balloonPath is the QOM path of the balloon device.
const balloonPath = "/machine/peripheral/" + BalloonDevice

// balloonArgs renders the balloon device, with free page reporting.
// It comes after every other device, so it moves none of them.
func (s Spec) balloonArgs() []string {
	if !s.Balloon {
		return nil
	}
	return []string{"-device", s.virtioDevice("virtio-balloon-pci") + ",id=" + BalloonDevice + ",free-page-reporting=on"}
}

// validateBalloon refuses a balloon where guest RAM cannot be given back.
func (s Spec) validateBalloon() error {
	switch {
	case !s.Balloon:
		return nil
	case s.HugePageSize != 0:
		return invalid("balloon", "guest RAM on huge pages is preallocated and cannot be given back")
	case len(s.VFIO) > 0:
		return invalid("balloon", "guest RAM of a VM with a passed-through device is pinned and cannot be given back")
	}
	return nil
}

// MaxBalloonStatsInterval bounds how often the guest is asked for its
// memory statistics, in whole seconds as QEMU takes it.
const MaxBalloonStatsInterval = time.Hour

// SetBalloonStatsInterval has QEMU ask the guest for its memory
// statistics every interval (whole seconds, at least one); 0 stops it.
func (c *Client) SetBalloonStatsInterval(ctx context.Context, every time.Duration) error {
	secs := int64(every / time.Second)
	if every < 0 || every > MaxBalloonStatsInterval || (every > 0 && secs == 0) {
		return fmt.Errorf("balloon statistics interval %v is not 0 or 1s..%v", every, MaxBalloonStatsInterval)
	}
	return c.Execute(ctx, "qom-set", map[string]any{"path": balloonPath, "property": "guest-stats-polling-interval", "value": secs}, nil)
}

// GuestMemory is the guest's own view of its memory, as its balloon
// driver last reported it. A figure the guest did not report is -1.
type GuestMemory struct {
	// Updated is when the guest last reported; zero when it never has
	// (no driver, or statistics not asked for yet).
	Updated time.Time
	// Bytes.
	Total, Free, Available, DiskCaches int64
	// Bytes swapped in and out, since the guest booted.
	SwapIn, SwapOut int64
	// Page faults since the guest booted.
	MajorFaults, MinorFaults int64
}

// balloonStats is QEMU's guest-stats property.
type balloonStats struct {
	Stats      map[string]int64 `json:"stats"`
	LastUpdate int64            `json:"last-update"`
}

// GuestMemoryStats reads the guest's memory statistics the balloon last
// got. QEMU's names for them (stat-free-memory...) are the virtio
// balloon's statistics tags.
func (c *Client) GuestMemoryStats(ctx context.Context) (GuestMemory, error) {
	var st balloonStats
	if err := c.Execute(ctx, "qom-get", map[string]string{"path": balloonPath, "property": "guest-stats"}, &st); err != nil {
		return GuestMemory{}, err
	}
	return st.guestMemory(), nil
}

// guestMemory converts QEMU's statistics; a missing or negative figure
// is -1.
func (st balloonStats) guestMemory() GuestMemory {
	get := func(name string) int64 {
		v, ok := st.Stats[name]
		if !ok || v < 0 {
			return -1
		}
		return v
	}
	m := GuestMemory{
		Total: get("stat-total-memory"), Free: get("stat-free-memory"), Available: get("stat-available-memory"),
		DiskCaches: get("stat-disk-caches"), SwapIn: get("stat-swap-in"), SwapOut: get("stat-swap-out"),
		MajorFaults: get("stat-major-faults"), MinorFaults: get("stat-minor-faults"),
	}
	if st.LastUpdate > 0 {
		m.Updated = time.Unix(st.LastUpdate, 0)
	}
	return m
}

// String renders the figures for a log line, in MiB where they are bytes.
func (m GuestMemory) String() string {
	mib := func(v int64) string {
		if v < 0 {
			return "-"
		}
		return strconv.FormatFloat(float64(v)/(1<<20), 'f', 1, 64) + "MiB"
	}
	n := func(v int64) string {
		if v < 0 {
			return "-"
		}
		return strconv.FormatInt(v, 10)
	}
	return fmt.Sprintf("total=%s free=%s available=%s cache=%s swap_in=%s swap_out=%s major_faults=%s minor_faults=%s",
		mib(m.Total), mib(m.Free), mib(m.Available), mib(m.DiskCaches), mib(m.SwapIn), mib(m.SwapOut), n(m.MajorFaults), n(m.MinorFaults))
}
