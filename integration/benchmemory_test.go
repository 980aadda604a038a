package integration

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// The memory section: what an idle VM pod holds on the host, what it
// gives back when its guest frees memory (the balloon's free page
// reporting), and what KSM merges between identical guests. Every guest
// has balloonGuestMiB of RAM.
const (
	memoryIdleAfter  = time.Minute      // from the guest's boot to the idle figures
	memoryFreeWatch  = time.Minute      // how long the pod is watched after the free
	memoryFellMiB    = 350              // the fall the goal asks for ...
	memoryFellWithin = 10 * time.Second // ... this soon after the free
	memoryIdleGoal   = 0.40             // of guest RAM resident in QEMU, idle
)

// memoryGuestKind is a guest the memory section measures alone, and the
// console markers that say it has booted.
type memoryGuestKind struct {
	name, image string
	markers     []string
}

// memoryGuestKinds are the guests measured alone, in order.
var memoryGuestKinds = []memoryGuestKind{
	{"busybox", imageKernelAgent, []string{markerAgent, markerBooted}},
	{"debian-cloud", imageDebianCloud, []string{markerCloudInitDone}},
}

// memorySection is what the memory section measured.
type memorySection struct {
	Guests   []memoryGuest    `json:"guests"`
	Overhead *overheadSection `json:"overhead,omitempty"`
	KSM      *ksmRun          `json:"ksm,omitempty"`
}

// memoryGuest is one VM pod measured alone: idle, then after its guest
// filled a tmpfs and freed it. A part that did not run is nil.
type memoryGuest struct {
	Guest    string `json:"guest"`
	Image    string `json:"image"`
	GuestMiB int    `json:"guest_mib"`
	// BootedS is from the RunPodSandbox call to the last boot marker.
	BootedS float64      `json:"booted_s"`
	Idle    *memoryIdle  `json:"idle,omitempty"`
	Free    *memoryFreed `json:"fill_and_free,omitempty"`
}

// memoryIdle is an idle VM pod's host memory, memoryIdleAfter after its
// guest booted.
type memoryIdle struct {
	// PodUsageKiB is the pod's memory cgroup's usage_in_bytes.
	PodUsageKiB int    `json:"pod_usage_kib"`
	QEMU        rollup `json:"qemu"`
	// GuestRSSKiB and GuestPSSKiB are the guest RAM mapping's part of
	// QEMU's; the rest of QEMU's PSS is its own.
	GuestRSSKiB int `json:"qemu_guest_ram_rss_kib"`
	GuestPSSKiB int `json:"qemu_guest_ram_pss_kib"`
	// GuestTHPKiB is the part of GuestRSSKiB in transparent huge pages.
	GuestTHPKiB int    `json:"qemu_guest_ram_thp_kib"`
	Shim        rollup `json:"shim"`
	// Guest is the guest's own view: what its /proc/meminfo says it uses.
	Guest guestView `json:"guest"`
}

// guestView is a guest's own /proc/meminfo: UsedKiB is MemTotal less
// MemFree, CachedKiB its page cache (Cached).
type guestView struct {
	UsedKiB   int `json:"used_kib"`
	CachedKiB int `json:"cached_kib"`
}

// readGuestView reads the guest's /proc/meminfo through the agent.
func readGuestView(ctx context.Context, t *testing.T, vm *criContainer) (guestView, error) {
	r, err := vm.execSync(ctx, t, 30, "cat", "/proc/meminfo")
	if err == nil && r.ExitCode != 0 {
		err = fmt.Errorf("cat /proc/meminfo: exit %d, stderr %q", r.ExitCode, r.Stderr)
	}
	if err != nil {
		return guestView{}, err
	}
	f := map[string]int{}
	for _, line := range strings.Split(string(r.Stdout), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			if n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB")); err == nil {
				f[k] = n
			}
		}
	}
	for _, k := range []string{"MemTotal", "MemFree", "Cached"} {
		if _, ok := f[k]; !ok {
			return guestView{}, fmt.Errorf("the guest's /proc/meminfo has no %s: %q", k, r.Stdout)
		}
	}
	return guestView{UsedKiB: f["MemTotal"] - f["MemFree"], CachedKiB: f["Cached"]}, nil
}

// memoryFreed is how the pod's memory usage fell after the guest freed
// what it had filled, in MiB, from its figure once filled.
type memoryFreed struct {
	FillMiB      int `json:"fill_mib"`
	IdlePodMiB   int `json:"pod_usage_idle_mib"`
	FilledPodMiB int `json:"pod_usage_filled_mib"`
	// FellWithinMiB is the fall memoryFellWithin after the free, FellMiB
	// the greatest while it was watched (WatchedS).
	FellWithinMiB int     `json:"pod_fell_within_10s_mib"`
	FellMiB       int     `json:"pod_fell_mib"`
	WatchedS      float64 `json:"watched_s"`
	// FellGoalS is when the fall reached memoryFellMiB; nil if it did not
	// while watched.
	FellGoalS *float64 `json:"pod_fell_350_mib_after_s,omitempty"`
	// After is the pod's memory once the watch ended, read as Idle is.
	After *memoryIdle `json:"after,omitempty"`
}

// benchMemory measures each of memoryGuestKinds alone, then the agent
// guest with its RAM filled at several sizes, then ksmPods cloud guests
// with and without KSM. Each part is a subtest, so that one
// that cannot run leaves the others theirs.
func benchMemory(ctx context.Context, t *testing.T, c *cri) *memorySection {
	out := &memorySection{}
	for _, g := range memoryGuestKinds {
		s := memoryGuest{Guest: g.name, Image: g.image, GuestMiB: balloonGuestMiB}
		t.Run(sectionMemory+"-"+g.name, func(t *testing.T) { memoryAlone(ctx, t, c, g, &s) })
		out.Guests = append(out.Guests, s)
	}
	out.Overhead = benchOverhead(ctx, t, c)
	out.KSM = &ksmRun{Pods: ksmPods, GuestMiB: balloonGuestMiB}
	t.Run(sectionMemory+"-ksm", func(t *testing.T) { benchKSM(ctx, t, c, out.KSM) })
	return out
}

// memoryAlone boots a guest of kind g in a pod of its own, measures it
// idle, has it fill balloonFillMiB and free them, watches the pod's
// memory usage fall, and removes the pod.
func memoryAlone(ctx context.Context, t *testing.T, c *cri, g memoryGuestKind, s *memoryGuest) {
	bootCtx, cancel := context.WithTimeout(ctx, cloudBootTimeout)
	defer cancel()
	t0 := time.Now()
	p, vm := bootBalloonGuest(bootCtx, t, c, "bench-memory-"+g.name, g.image, nil, g.markers...)
	booted := time.Now()
	s.BootedS = booted.Sub(t0).Seconds()
	if !qemuHasBalloon(t, vm.id) {
		t.Fatalf("qemu has no %s", balloonArg)
	}
	waitAgent(bootCtx, t, vm)
	v := &benchVM{p: p, ct: vm}
	time.Sleep(time.Until(booted.Add(memoryIdleAfter)))
	if err := v.pollStats(ctx); err != nil { // as a kubelet would have
		t.Fatal(err)
	}
	m := newBalloonMeter(t, c, vm)
	idle, err := idleMemory(ctx, t, p, vm, m.qemuPid)
	if err != nil {
		t.Fatal(err)
	}
	s.Idle = &idle
	t.Logf("%s idle %v after boot: pod %d MiB, QEMU PSS %d MiB (guest RAM %d MiB), shim PSS %d MiB", g.name, memoryIdleAfter,
		idle.PodUsageKiB>>10, idle.QEMU.PSSKiB>>10, idle.GuestPSSKiB>>10, idle.Shim.PSSKiB>>10)

	before, filled := m.fill(ctx, t)
	freed := m.free(ctx, t)
	f := &memoryFreed{FillMiB: balloonFillMiB, IdlePodMiB: before.podMiB, FilledPodMiB: filled.podMiB}
	for {
		since := time.Since(freed)
		fell := filled.podMiB - m.measure(ctx, t).podMiB
		f.FellMiB, f.WatchedS = max(f.FellMiB, fell), since.Seconds()
		if since <= memoryFellWithin {
			f.FellWithinMiB = fell
		}
		if fell >= memoryFellMiB && f.FellGoalS == nil {
			at := since.Seconds()
			f.FellGoalS = &at
		}
		if (f.FellGoalS != nil && since > memoryFellWithin) || since > memoryFreeWatch {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	if a, err := idleMemory(ctx, t, p, vm, m.qemuPid); err != nil {
		t.Error(err)
	} else {
		f.After = &a
	}
	s.Free = f
	after := "never"
	if f.FellGoalS != nil {
		after = fmt.Sprintf("%.1f s", *f.FellGoalS)
	}
	t.Logf("%s freed %d MiB: pod usage %d MiB fell %d MiB within %v (%d MiB at most in %.1f s); %d MiB lower after %s",
		g.name, balloonFillMiB, f.FilledPodMiB, f.FellWithinMiB, memoryFellWithin, f.FellMiB, f.WatchedS, memoryFellMiB, after)
	p.remove(t)
	assertNothingLeftCRI(t, vm.id)
}

// waitAgent waits until the guest agent runs commands: the cloud guest
// prints no marker for it.
func waitAgent(ctx context.Context, t *testing.T, vm *criContainer) {
	t.Helper()
	var last error
	err := wait.PollUntilContextTimeout(ctx, time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		r, err := vm.execSync(ctx, t, 10, "true")
		if err == nil && r.ExitCode != 0 {
			err = fmt.Errorf("exit %d, stderr %q", r.ExitCode, r.Stderr)
		}
		last = err
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("the guest agent of %s never ran a command: %v (%v)", vm.id, err, last)
	}
}

// idleMemory reads the guest's view of its memory, then the pod's memory
// usage, its QEMU's (pid qemuPid) and its shim's.
func idleMemory(ctx context.Context, t *testing.T, p *pod, vm *criContainer, qemuPid int) (m memoryIdle, err error) {
	var errs [4]error
	m.Guest, errs[3] = readGuestView(ctx, t, vm)
	q, err := processMemory(qemuPid, balloonGuestMiB)
	m.GuestRSSKiB, m.GuestPSSKiB, m.GuestTHPKiB = q.guestKiB, q.guestPSSKiB, q.guestTHPKiB
	m.PodUsageKiB, errs[0] = podUsageKiB(p)
	m.QEMU, errs[1] = smapsRollup(qemuPid)
	m.Shim, errs[2] = smapsRollup(podShim(t, p))
	return m, errors.Join(err, errs[0], errs[1], errs[2], errs[3])
}

// podUsageKiB reads the pod's memory cgroup's usage_in_bytes.
func podUsageKiB(p *pod) (int, error) {
	data, err := os.ReadFile(p.cgroup.file("memory", "", "memory.usage_in_bytes"))
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	return int(n >> 10), err
}

// memoryRows adds the memory section's figures.
func (r *benchReport) memoryRows(tab *summary) {
	m := r.Memory
	if m == nil {
		return
	}
	for _, g := range m.Guests {
		var idle memoryIdle
		if g.Idle != nil {
			idle = *g.Idle
		}
		mib := func(kib int) float64 {
			if g.Idle == nil {
				return math.NaN()
			}
			return float64(kib) / 1024
		}
		p := fmt.Sprintf("memory, %s guest (%d MiB), idle %.0f s after boot: ", g.Guest, g.GuestMiB, memoryIdleAfter.Seconds())
		tab.add(fmt.Sprintf("memory, %s guest: RunPodSandbox call → booted", g.Guest), g.BootedS, "s", "", "")
		tab.add(p+"pod memory (cgroup usage)", mib(idle.PodUsageKiB), "MiB", "", "")
		guest, target, gap := mib(idle.GuestPSSKiB), "", ""
		if g.Image == imageDebianCloud {
			goal := memoryIdleGoal * float64(g.GuestMiB)
			target, gap = fmt.Sprintf("≤ %.1f MiB (%.0f %% of guest RAM)", goal, memoryIdleGoal*100), gapBelow(guest, goal, "MiB")
		}
		tab.add(p+"QEMU PSS, guest RAM", guest, "MiB", target, gap)
		tab.add(p+"QEMU guest RAM in transparent huge pages", mib(idle.GuestTHPKiB), "MiB", "", "")
		tab.add(p+"QEMU PSS, its own", mib(idle.QEMU.PSSKiB-idle.GuestPSSKiB), "MiB", "", "")
		tab.add(p+"shim PSS", mib(idle.Shim.PSSKiB), "MiB", "", "")
		tab.add(p+"the guest's own view: used (MemTotal − MemFree)", mib(idle.Guest.UsedKiB), "MiB", "", "")
		tab.add(p+"the guest's own view: of it page cache", mib(idle.Guest.CachedKiB), "MiB", "", "")

		p = fmt.Sprintf("memory, %s guest, %d MiB filled and freed: ", g.Guest, balloonFillMiB)
		fell, fellAt, atGap := math.NaN(), math.NaN(), "n/a"
		if f := g.Free; f != nil {
			fell, atGap = float64(f.FellWithinMiB), fmt.Sprintf("not within %.0f s (fell %d MiB at most)", f.WatchedS, f.FellMiB)
			if f.FellGoalS != nil {
				fellAt = *f.FellGoalS
				atGap = gapBelow(fellAt, memoryFellWithin.Seconds(), "s")
			}
		}
		tab.add(p+fmt.Sprintf("pod memory fell within %.0f s", memoryFellWithin.Seconds()), fell, "MiB",
			fmt.Sprintf("≥ %d MiB", memoryFellMiB), gapAbove(fell, memoryFellMiB, "MiB"))
		tab.add(p+fmt.Sprintf("free → pod memory %d MiB lower", memoryFellMiB), fellAt, "s", fmt.Sprintf("≤ %.0f s", memoryFellWithin.Seconds()), atGap)
		var a memoryIdle
		afterMiB := func(kib int) float64 {
			if g.Free == nil || g.Free.After == nil {
				return math.NaN()
			}
			return float64(kib) / 1024
		}
		if g.Free != nil && g.Free.After != nil {
			a = *g.Free.After
		}
		tab.add(p+"then pod memory (cgroup usage)", afterMiB(a.PodUsageKiB), "MiB", "", "")
		tab.add(p+"then QEMU PSS, guest RAM", afterMiB(a.GuestPSSKiB), "MiB", "", "")
		tab.add(p+"then QEMU PSS, its own", afterMiB(a.QEMU.PSSKiB-a.GuestPSSKiB), "MiB", "", "")
		tab.add(p+"then shim PSS", afterMiB(a.Shim.PSSKiB), "MiB", "", "")
		tab.add(p+"then the guest's own view: used", afterMiB(a.Guest.UsedKiB), "MiB", "", "")
	}
	r.overheadRows(tab)
	if k := m.KSM; k != nil {
		r.ksmRows(tab, k)
	}
}
