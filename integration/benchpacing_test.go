package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"text/tabwriter"
	"time"
)

// The pacing section: disk-boot guests (SeaBIOS, their own kernel command
// line) started at once on a TCG node, with boot pacing off and on. Without
// it some guests fail Linux's early timer checks and panic.

// pacingPoint is one run of Pods disk-boot pods started at once, with boot
// pacing on (the default config: a slot per host CPU under TCG) or off.
type pacingPoint struct {
	Pods     int  `json:"pods"`
	Paced    bool `json:"paced"`
	Run      int  `json:"run"`      // from 1; only the largest count with pacing on has more than one
	Booted   int  `json:"booted"`   // the guest's log showed VMSHIM-GUEST-BOOTED
	Panicked int  `json:"panicked"` // it showed a kernel panic first
	Hung     int  `json:"hung"`     // it showed neither within the run's wait
	Failed   int  `json:"failed"`   // the pod's CRI calls failed
	// LastReadyS is from the run's first RunPodSandbox call to the last
	// booted guest's VMSHIM-GUEST-BOOTED.
	LastReadyS float64 `json:"last_ready_s"`
	Waited     int     `json:"waited_for_slot"` // pods whose log says they waited for a boot slot
	MaxWaitS   float64 `json:"longest_wait_s"`  // the longest wait for a slot the logs report
}

// benchMarkWaiting begins the line a paced VM's log gets when it waits
// for a boot slot; lineBooting's, when it boots after waiting.
const benchMarkWaiting = "vmshim: waiting to boot"

// pacingWaitPerPod is the wait for the guests of a run beyond
// bootTimeout, per pod: paced, their boots take turns.
const pacingWaitPerPod = 20 * time.Second

// benchPacing runs, for each count n of sizes, n disk-boot pods at once
// without pacing, then with it; the largest count's paced run repeat
// times.
func benchPacing(ctx context.Context, t *testing.T, c *cri, sizes []int, repeat int) []pacingPoint {
	var pts []pacingPoint
	largest := slices.Max(sizes)
	for _, n := range sizes {
		pts = append(pts, benchPacingRun(ctx, t, c, n, false, 1))
		runs := 1
		if n == largest {
			runs = repeat
		}
		for run := 1; run <= runs; run++ {
			pts = append(pts, benchPacingRun(ctx, t, c, n, true, run))
		}
	}
	return pts
}

// benchPacingRun starts n disk-boot pods at once, paced or not, waits
// until each has booted, panicked or run out of time, reads what their
// logs say of boot slots and removes them all.
func benchPacingRun(ctx context.Context, t *testing.T, c *cri, n int, paced bool, run int) pacingPoint {
	pt := pacingPoint{Pods: n, Paced: paced, Run: run}
	handler, mode := unpacedHandler, "off"
	if paced {
		handler, mode = runtimeHandler, "on"
	}
	label := fmt.Sprintf("pacing %s, N=%d, run %d", mode, n, run)
	ann := map[string]string{"vmshim.io/memory": "128Mi"} // tiny VMs, as the density runs'
	names, vms, errs := make([]string, n), make([]*benchVM, n), make([]error, n)
	var wg sync.WaitGroup
	bootCtx, cancel := context.WithTimeout(ctx, bootTimeout+time.Duration(n)*pacingWaitPerPod)
	defer cancel()
	t0 := time.Now()
	for i := range n {
		// A log directory of each pod's own, in each run: a marker in
		// another's log would end the wait at once.
		names[i] = fmt.Sprintf("pacing-%s-%d-%d-%d", mode, n, run, i)
		wg.Go(func() {
			vms[i], errs[i] = bootBenchVM(bootCtx, t, c, names[i], handler, imageDiskWait, withAnnotations(ann), markerBooted)
		})
	}
	wg.Wait()
	var last time.Time
	for i, podErr := range errs {
		switch {
		case podErr == nil:
			pt.Booted++
			if at := vms[i].marks[markerBooted].at; at.After(last) {
				last = at
			}
		case errors.Is(podErr, errBenchGuestPanic): // results, not failures to run
			pt.Panicked++
			t.Logf("%s: %v", label, podErr)
		case errors.Is(podErr, context.DeadlineExceeded):
			pt.Hung++
			t.Logf("%s: %v", label, podErr)
		default: // a result too, with the pod's error to see
			pt.Failed++
			t.Logf("%s: pod failed: %v", label, podErr)
		}
		// bootBenchVM's container log; it stays after the pod is removed.
		waited, longest, err := slotWait(filepath.Join(c.logDir, names[i], "c.log"))
		if err != nil {
			t.Errorf("%s: %v", label, err)
		}
		if waited {
			pt.Waited++
		}
		pt.MaxWaitS = max(pt.MaxWaitS, longest.Seconds())
	}
	if !last.IsZero() {
		pt.LastReadyS = last.Sub(t0).Seconds()
	}
	t.Logf("%s: %d booted, %d panicked, %d hung, %d failed; %d waited for a slot, %.1f s at most; last ready after %.1f s",
		label, pt.Booted, pt.Panicked, pt.Hung, pt.Failed, pt.Waited, pt.MaxWaitS, pt.LastReadyS)
	// The pods that did not boot are gone already; the next run starts
	// once the rest are.
	for _, v := range vms {
		if v == nil {
			continue
		}
		wg.Go(func() {
			if _, err := v.teardown(ctx, t, 0); err != nil {
				t.Errorf("%s: teardown: %v", label, err)
			}
		})
	}
	wg.Wait()
	return pt
}

// slotWait reads a paced VM's CRI log: whether it waited for a boot slot,
// and the longest wait its "booting after waiting" lines report. A log
// that does not exist (the pod never started) says nothing.
func slotWait(path string) (bool, time.Duration, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, 0, nil
	} else if err != nil {
		return false, 0, err
	}
	waited, longest := false, time.Duration(0)
	for line := range strings.Lines(string(data)) {
		waited = waited || strings.Contains(line, benchMarkWaiting)
		_, rest, ok := strings.Cut(line, lineBooting)
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			return waited, longest, fmt.Errorf("%s: no wait in %q", path, line)
		}
		var d time.Duration
		if d, err = time.ParseDuration(f[0]); err != nil { // the shim's line changed
			return waited, longest, fmt.Errorf("%s: %q: %w", path, line, err)
		}
		longest = max(longest, d)
	}
	return waited, longest, nil
}

// formatPacing renders the pacing runs as a table of their own.
func formatPacing(pts []pacingPoint) string {
	var b strings.Builder
	b.WriteString("boot pacing: disk-boot pods started at once (on: boot_slots auto, a slot per host CPU under TCG; off: boot_slots = -1)\n")
	w := tabwriter.NewWriter(&b, 0, 0, 1, ' ', tabwriter.Debug)
	fmt.Fprintln(w, "N\t pacing\t run\t booted\t panicked\t hung\t failed\t waited\t longest wait (s)\t last ready (s)")
	fmt.Fprintln(w, "-\t ------\t ---\t ------\t --------\t ----\t ------\t ------\t ----------------\t --------------")
	for _, p := range pts {
		mode, ready := "off", "-"
		if p.Paced {
			mode = "on"
		}
		if p.Booted > 0 {
			ready = fmt.Sprintf("%.1f", p.LastReadyS)
		}
		fmt.Fprintf(w, "%d\t %s\t %d\t %d\t %d\t %d\t %d\t %d\t %.1f\t %s\n",
			p.Pods, mode, p.Run, p.Booted, p.Panicked, p.Hung, p.Failed, p.Waited, p.MaxWaitS, ready)
	}
	_ = w.Flush() // a strings.Builder takes every write
	return b.String()
}
