package integration

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// The KSM part of the memory section.
const (
	ksmPods        = 10               // identical cloud guests started together
	ksmGoal        = 0.60             // of their memory without KSM, with it
	ksmSettleBound = 5 * time.Minute  // how long KSM may take to stop merging more
	ksmBootBound   = 25 * time.Minute // how long ksmPods cloud guests may take to boot
)

// ksmRun is ksmPods identical idle guests' host memory without KSM and
// with it.
type ksmRun struct {
	Pods      int        `json:"pods"`
	GuestMiB  int        `json:"guest_mib"`
	AllReadyS float64    `json:"all_ready_s"`
	Off       *memorySum `json:"ksm_off,omitempty"`
	On        *memorySum `json:"ksm_on,omitempty"`
	// Knobs are the KSM settings of the run; Saved those found, restored.
	Knobs map[string]string `json:"ksm_knobs"`
	Saved map[string]string `json:"ksm_saved"`
	// SettleS is how long KSM ran until two full scans in a row grew
	// pages_sharing by 1 % or less (Settled false: not by
	// ksmSettleBound), in FullScans scans.
	SettleS      float64 `json:"ksm_settle_s"`
	Settled      bool    `json:"ksm_settled"`
	FullScans    int64   `json:"ksm_full_scans"`
	PagesShared  int64   `json:"ksm_pages_shared"`
	PagesSharing int64   `json:"ksm_pages_sharing"`
}

// memorySum is the summed host memory of a set of VM pods.
type memorySum struct {
	PodUsageKiB int `json:"pods_usage_kib"`
	QEMUPSSKiB  int `json:"qemu_pss_kib"`
	GuestPSSKiB int `json:"qemu_guest_ram_pss_kib"`
	// GuestUsedKiB is what the guests say they use (guestView.UsedKiB).
	GuestUsedKiB int `json:"guests_used_kib"`
}

// benchKSM starts ksmPods cloud guests at once, measures them idle with
// KSM off, then with KSM run until it merges no more, and removes them.
// The KSM knobs are saved first and restored, with every merged page
// unmerged, once the pods are gone (or at the test's end).
func benchKSM(ctx context.Context, t *testing.T, c *cri, r *ksmRun) {
	restore := ksmTakeOver(t, r)
	// Off, with nothing merged: run=2 unmerges what an earlier run left.
	if err := ksmWrite("run", "2"); err != nil {
		t.Fatal(err)
	}
	edit := func(cfg *runtimeapi.ContainerConfig) {
		cfg.Linux = &runtimeapi.LinuxContainerConfig{Resources: &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: balloonGuestMiB << 20}}
	}
	bootCtx, cancel := context.WithTimeout(ctx, ksmBootBound)
	defer cancel()
	vms, errs := make([]*benchVM, ksmPods), make([]error, ksmPods)
	var wg sync.WaitGroup
	t0 := time.Now()
	for i := range ksmPods {
		wg.Go(func() {
			vms[i], errs[i] = bootBenchVM(bootCtx, t, c, fmt.Sprintf("bench-ksm-%d", i), runtimeHandler, imageDebianCloud, edit, markerCloudInitDone)
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("cloud guest %d: %v", i, err)
		}
	}
	vms = slices.DeleteFunc(vms, func(v *benchVM) bool { return v == nil })
	defer func() { // the pods first, then KSM's knobs: nothing of theirs is left to unmerge
		for _, v := range vms {
			wg.Go(func() {
				if _, err := v.teardown(ctx, t, 0); err != nil {
					t.Errorf("teardown: %v", err)
				}
			})
		}
		wg.Wait()
		for _, v := range vms {
			assertNothingLeftCRI(t, v.ct.id)
		}
		restore()
	}()
	if len(vms) < ksmPods {
		t.FailNow()
	}
	var last time.Time
	for _, v := range vms {
		if got := qemuMemMiB(v.qemuPid); got != balloonGuestMiB {
			t.Errorf("pod %s: QEMU has %d MiB of guest RAM, not the container's limit of %d", v.p.name, got, balloonGuestMiB)
		}
		if argv, err := procCmdline(v.qemuPid); err != nil || strings.Contains(strings.Join(argv, " "), "mem-merge=off") {
			t.Errorf("pod %s: guest RAM not offered to KSM: %v %q", v.p.name, err, argv)
		}
		if at := v.marks[markerCloudInitDone].at; at.After(last) {
			last = at
		}
	}
	r.AllReadyS = last.Sub(t0).Seconds()
	time.Sleep(time.Until(last.Add(memoryIdleAfter)))
	off, err := sumMemory(ctx, t, vms)
	if err != nil {
		t.Fatal(err)
	}
	r.Off = &off
	t.Logf("%d idle cloud guests, KSM off: pods %d MiB, QEMU PSS %d MiB", len(vms), off.PodUsageKiB>>10, off.QEMUPSSKiB>>10)

	for _, kv := range ksmFast {
		if err := ksmWrite(kv[0], kv[1]); err != nil {
			t.Fatal(err)
		}
	}
	if r.SettleS, r.FullScans, r.Settled, err = ksmSettle(ctx); err != nil {
		t.Fatal(err)
	}
	on, err := sumMemory(ctx, t, vms)
	if err != nil {
		t.Fatal(err)
	}
	r.On = &on
	r.PagesShared, err = ksmInt("pages_shared")
	if err == nil {
		r.PagesSharing, err = ksmInt("pages_sharing")
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("KSM on (%.0f s, %d full scans): pods %d MiB, QEMU PSS %d MiB; pages_shared %d, pages_sharing %d",
		r.SettleS, r.FullScans, on.PodUsageKiB>>10, on.QEMUPSSKiB>>10, r.PagesShared, r.PagesSharing)
}

// sumMemory adds up what the guests say they use, the pods' memory usage
// and their QEMUs' PSS.
func sumMemory(ctx context.Context, t *testing.T, vms []*benchVM) (s memorySum, err error) {
	for _, v := range vms {
		g, err := readGuestView(ctx, t, v.ct)
		if err != nil {
			return s, err
		}
		s.GuestUsedKiB += g.UsedKiB
	}
	for _, v := range vms {
		usage, err := podUsageKiB(v.p)
		if err != nil {
			return s, err
		}
		q, err := smapsRollup(v.qemuPid)
		if err != nil {
			return s, err
		}
		g, err := processMemory(v.qemuPid, balloonGuestMiB)
		if err != nil {
			return s, err
		}
		s.PodUsageKiB, s.QEMUPSSKiB, s.GuestPSSKiB = s.PodUsageKiB+usage, s.QEMUPSSKiB+q.PSSKiB, s.GuestPSSKiB+g.guestPSSKiB
	}
	return s, nil
}

// ksmRows adds the KSM run's figures.
func (r *benchReport) ksmRows(tab *summary, k *ksmRun) {
	sum := func(s *memorySum, f func(memorySum) int) float64 {
		if s == nil {
			return math.NaN()
		}
		return float64(f(*s)) / 1024
	}
	pods := func(s memorySum) int { return s.PodUsageKiB }
	qemu := func(s memorySum) int { return s.QEMUPSSKiB }
	guest := func(s memorySum) int { return s.GuestPSSKiB }
	p := fmt.Sprintf("memory, %d idle debian-cloud guests (%d MiB each)", k.Pods, k.GuestMiB)
	tab.add(p+": all ready", k.AllReadyS, "s", "", "")
	for _, state := range []struct {
		name string
		s    *memorySum
	}{{"KSM off", k.Off}, {"KSM on", k.On}} {
		tab.add(fmt.Sprintf("%s, %s: pods' memory (sum of cgroup usage)", p, state.name), sum(state.s, pods), "MiB", "", "")
		tab.add(fmt.Sprintf("%s, %s: QEMU PSS (sum)", p, state.name), sum(state.s, qemu), "MiB", "", "")
		tab.add(fmt.Sprintf("%s, %s: QEMU PSS, guest RAM (sum)", p, state.name), sum(state.s, guest), "MiB", "", "")
		tab.add(fmt.Sprintf("%s, %s: the guests' own view, used (sum)", p, state.name), sum(state.s, func(s memorySum) int { return s.GuestUsedKiB }), "MiB", "", "")
	}
	settled := ""
	if k.On != nil && !k.Settled {
		settled = fmt.Sprintf("still merging after %v", ksmSettleBound)
	}
	tab.add("memory, KSM: run until two full scans in a row merged ≤ 1 % more", k.SettleS, "s", "", settled)
	tab.add("memory, KSM: full scans", float64(k.FullScans), "", "", "")
	tab.add("memory, KSM: pages_shared", float64(k.PagesShared), "pages", "", "")
	tab.add("memory, KSM: pages_sharing", float64(k.PagesSharing), "pages", "", "")
	goal := fmt.Sprintf("≤ %.0f %%", ksmGoal*100)
	for _, f := range []struct {
		name string
		of   func(memorySum) int
	}{{"pods' memory", pods}, {"QEMU PSS", qemu}} {
		ratio := 100 * sum(k.On, f.of) / sum(k.Off, f.of)
		tab.add(fmt.Sprintf("%s: %s with KSM / without", p, f.name), ratio, "%", goal, gapBelow(ratio, ksmGoal*100, "%"))
	}
}

// ksmDir holds the kernel's KSM knobs and counters.
const ksmDir = "/sys/kernel/mm/ksm"

// ksmFast are the knobs the bench sets, in order: a full scan of the
// guests' resident RAM (10 GiB at most, 2.6 million pages) in seconds,
// and ksmd running. merge_across_nodes stays as it is.
var ksmFast = [][2]string{{"pages_to_scan", "20000"}, {"sleep_millisecs", "10"}, {"run", "1"}}

// ksmRead reads a KSM knob or counter.
func ksmRead(name string) (string, error) {
	data, err := os.ReadFile(filepath.Join(ksmDir, name))
	return strings.TrimSpace(string(data)), err
}

// ksmInt reads a KSM counter.
func ksmInt(name string) (int64, error) {
	v, err := ksmRead(name)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(v, 10, 64)
}

// ksmWrite sets a KSM knob.
func ksmWrite(name, value string) error {
	if err := os.WriteFile(filepath.Join(ksmDir, name), []byte(value), 0); err != nil {
		return fmt.Errorf("KSM %s=%s: %w", name, value, err)
	}
	return nil
}

// ksmTakeOver saves the KSM knobs ksmFast changes into r.Saved (and what
// it sets them to into r.Knobs), and returns what puts them back: every
// merged page unmerged (run=2), the saved scan rate, then the saved run.
// It runs once, at the latest when the test ends.
func ksmTakeOver(t *testing.T, r *ksmRun) (restore func()) {
	t.Helper()
	r.Saved, r.Knobs = map[string]string{}, map[string]string{}
	for _, kv := range ksmFast {
		v, err := ksmRead(kv[0])
		if err != nil {
			t.Fatalf("KSM: %v", err)
		}
		r.Saved[kv[0]], r.Knobs[kv[0]] = v, kv[1]
	}
	var once sync.Once
	restore = func() {
		once.Do(func() {
			for _, kv := range [][2]string{{"run", "2"}, {"pages_to_scan", r.Saved["pages_to_scan"]},
				{"sleep_millisecs", r.Saved["sleep_millisecs"]}, {"run", r.Saved["run"]}} {
				if err := ksmWrite(kv[0], kv[1]); err != nil {
					t.Errorf("restore: %v", err)
				}
			}
		})
	}
	t.Cleanup(restore)
	return restore
}

// ksmSettle waits, at most ksmSettleBound, until two full scans in a row
// have each grown pages_sharing by 1 % or less (KSM merges a page on a
// second scan that finds it unchanged, so the first scans always grow
// it). It returns how long it waited, the full scans, and whether KSM
// settled within the bound.
func ksmSettle(ctx context.Context) (took float64, scans int64, settled bool, err error) {
	first, err := ksmInt("full_scans")
	if err != nil {
		return 0, 0, false, err
	}
	t0, lastScan, lastSharing, flat := time.Now(), first, int64(0), 0
	err = wait.PollUntilContextTimeout(ctx, time.Second, ksmSettleBound, true, func(context.Context) (bool, error) {
		scan, err := ksmInt("full_scans")
		if err != nil || scan == lastScan {
			return false, err
		}
		sharing, err := ksmInt("pages_sharing")
		if err != nil {
			return false, err
		}
		if lastSharing > 0 && sharing-lastSharing <= lastSharing/100 {
			flat++
		} else {
			flat = 0
		}
		lastScan, lastSharing = scan, sharing
		return flat >= 2, nil
	})
	took, scans = time.Since(t0).Seconds(), lastScan-first
	if wait.Interrupted(err) {
		return took, scans, false, nil
	}
	return took, scans, err == nil, err
}
