package integration

import (
	"bufio"
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"
)

// The figures of make bench, read from /proc and CRI logs, and the table,
// bench.json and density.svg they make. Times are in ms unless named.

// startSample is one VM pod's start: how long each CRI call took, and
// when each step happened after the CreateContainer call.
type startSample struct {
	RunPodSandbox   float64     `json:"run_pod_sandbox_ms"`
	CreateContainer float64     `json:"create_container_ms"`
	StartContainer  float64     `json:"start_container_ms"`
	QEMUExec        float64     `json:"qemu_exec_at_ms"`
	FirstConsole    float64     `json:"first_console_line_at_ms"`
	Lease           float64     `json:"dhcp_lease_at_ms"`
	Ready           float64     `json:"ready_at_ms"`
	GuestUptime     float64     `json:"guest_uptime_at_ready_ms"`
	Bare            *bareSample `json:"bare_qemu,omitempty"` // booted right after, for a paired comparison
	// Spans are the shim's steps of Create and Start (its log's span
	// lines), in milliseconds by step.
	Spans map[string]float64 `json:"spans_ms,omitempty"`
}

// bareSample is one boot of bare QEMU, timed from its exec.
type bareSample struct {
	FirstConsole float64 `json:"first_console_line_at_ms"`
	Ready        float64 `json:"ready_at_ms"`
	GuestUptime  float64 `json:"guest_uptime_at_ready_ms"`
}

// teardownSample is one pod's StopContainer, StopPodSandbox and
// RemovePodSandbox, and the time from QEMU's exit to the last's return.
type teardownSample struct {
	StopContainer    float64 `json:"stop_container_ms"`
	StopPodSandbox   float64 `json:"stop_pod_sandbox_ms"`
	RemovePodSandbox float64 `json:"remove_pod_sandbox_ms"`
	AfterQEMUExit    float64 `json:"after_qemu_exit_ms"`
}

// rollup is a process's resident and proportional set size, and its
// resident anonymous memory.
type rollup struct {
	RSSKiB  int `json:"rss_kib"`
	PSSKiB  int `json:"pss_kib"`
	AnonKiB int `json:"anon_kib"`
}

// podMemory is what a running VM pod's processes hold.
type podMemory struct {
	QEMU     rollup `json:"qemu"`
	GuestKiB int    `json:"guest_ram_touched_kib"`
	Shim     rollup `json:"shim"`
	Pause    rollup `json:"pause"`
}

// overheadKiB is the pod's host memory beyond guest RAM: QEMU's own, the
// shim's and the pause process's, each as PSS, so that pages shared with
// other processes (QEMU's binary and libraries with the other VMs') are
// split among them. Guest RAM is private to QEMU: its PSS is its RSS.
func (m podMemory) overheadKiB() int {
	return m.QEMU.PSSKiB - m.GuestKiB + m.Shim.PSSKiB + m.Pause.PSSKiB
}

// densityPoint is one density run of Pods pods started at once.
type densityPoint struct {
	Pods                  int     `json:"pods"`
	Failed                int     `json:"failed"`
	NoBoot                int     `json:"guests_not_booted"` // panicked, or hung past the wait
	AllReadyS             float64 `json:"all_ready_s"`
	MemAvailablePerPodMiB float64 `json:"memavailable_drop_per_pod_mib"`
	ProcessesPerPodMiB    float64 `json:"processes_per_pod_mib"`
	OverheadPerPodMiB     float64 `json:"overhead_per_pod_mib"`
	TeardownS             float64 `json:"teardown_all_s"`
	CostRatio             float64 `json:"per_pod_cost_vs_smallest"`
}

// tableRow is one figure with its target.
type tableRow struct {
	Figure string   `json:"figure"`
	Value  *float64 `json:"value"` // nil when not measured
	Unit   string   `json:"unit"`
	// Min and Max are the least and greatest sample of a median, for
	// the figures that show them.
	Min    *float64 `json:"min,omitempty"`
	Max    *float64 `json:"max,omitempty"`
	Target string   `json:"target,omitempty"`
	Gap    string   `json:"gap,omitempty"`
}

// benchReport is everything TestBench measured; bench.json holds it.
type benchReport struct {
	Machine map[string]string `json:"machine"`
	Runs    int               `json:"runs"`
	// Sections are those that ran (VMSHIM_BENCH_ONLY).
	Sections []string      `json:"sections"`
	Start    []startSample `json:"start"`
	// StartNoJail are starts with config jail = false, for the jail's cost.
	StartNoJail []startSample `json:"start_no_jail"`
	// StartBIOS and StartUEFI are disk boots through SeaBIOS and OVMF.
	StartBIOS []startSample `json:"start_disk_bios"`
	StartUEFI []startSample `json:"start_disk_uefi"`
	// StartMicroVM are the kernel's boots on the microvm machine, and
	// MicroVMMemory one such pod's memory.
	StartMicroVM  []startSample    `json:"start_microvm"`
	MicroVMMemory []podMemory      `json:"microvm_memory"`
	BareArgv      []string         `json:"bare_qemu_argv"`
	PodMemory     []podMemory      `json:"pod_memory"`
	RuncShim      *rollup          `json:"runc_shim,omitempty"`
	RuncNote      string           `json:"runc_note,omitempty"`
	Graceful      []teardownSample `json:"teardown_graceful"`
	Forced        []teardownSample `json:"teardown_forced"`
	Density       []densityPoint   `json:"density"`
	// Cold is coldPods pods started at once from an image not unpacked yet.
	Cold *densityPoint `json:"cold_image,omitempty"`
	// Pacing are disk-boot pods started at once with boot pacing off
	// and on.
	Pacing []pacingPoint `json:"pacing,omitempty"`
	// Suspend are VMs suspended onto a root-disk volume and resumed.
	Suspend []suspendSample `json:"suspend"`
	// Memory is idle VM pods' host memory, what they give back, and KSM.
	Memory *memorySection `json:"memory,omitempty"`
	// Burst are the rounds of a Deployment of VM pods scaled 0 → N → 0
	// through the kubelet.
	Burst   []burstRun `json:"burst,omitempty"`
	Seconds float64    `json:"duration_s"`
	Summary []tableRow `json:"summary"`
}

// newBenchReport starts a report of the sections given with what
// describes the machine.
func newBenchReport(runs int, sections []string) *benchReport {
	kernel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	qemuVersion, _ := exec.Command("qemu-system-x86_64", "-version").Output()
	return &benchReport{Runs: runs, Sections: sections, Machine: map[string]string{
		"cpus":   fmt.Sprint(runtime.NumCPU()),
		"kernel": strings.TrimSpace(string(kernel)),
		"qemu":   strings.SplitN(string(qemuVersion), "\n", 2)[0],
		"date":   time.Now().UTC().Format(time.RFC3339),
	}}
}

// write fills the summary, prints the table (and the pacing runs') and
// writes bench.json, bench.txt and density.svg into dir.
func (r *benchReport) write(dir string) error {
	load, _ := os.ReadFile("/proc/loadavg") // at the end: the 15 min average spans most runs
	r.Machine["load"] = strings.Join(strings.Fields(string(load))[:3], " ")
	r.Summary = r.rows()
	table := formatTable(r.Summary)
	if len(r.Pacing) > 0 {
		table += "\n" + formatPacing(r.Pacing)
	}
	fmt.Printf("\n%s\n", table)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	files := map[string][]byte{"bench.json": data, "bench.txt": []byte(table)}
	if len(r.Density) > 0 {
		files["density.svg"] = []byte(densitySVG(r.Density))
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), body, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// ran reports whether section ran.
func (r *benchReport) ran(section string) bool { return slices.Contains(r.Sections, section) }

// rows sums the samples up into the table's figures, medians of the runs,
// for the sections that ran.
func (r *benchReport) rows() []tableRow {
	var tab summary
	if r.ran(sectionStart) {
		r.startRows(&tab)
	}
	r.densityRows(&tab)
	if r.ran(sectionStart) {
		r.teardownRows(&tab)
	}
	if r.ran(sectionSuspend) {
		r.suspendRows(&tab)
	}
	if r.ran(sectionMemory) {
		r.memoryRows(&tab)
	}
	for _, b := range r.Burst {
		p := fmt.Sprintf("burst through the kubelet, N=%d, round %d: ", b.Pods, b.Round)
		tab.add(p+"scale to N → all Ready", b.ReadyS, "s", "", "")
		tab.add(p+"scale to 0 → node as before", b.GoneS, "s", "", "")
	}
	return tab
}

// summary is the table's rows, as they are added.
type summary []tableRow

// add adds a figure with its target and gap ("" for none).
func (tab *summary) add(figure string, v float64, unit, target, gap string) {
	row := tableRow{Figure: figure, Unit: unit, Target: cmp.Or(target, "-"), Gap: cmp.Or(gap, "-")}
	if v = math.Round(v*10) / 10; finite(v) {
		row.Value = &v
	}
	*tab = append(*tab, row)
}

// spread adds the median of vs, with their least and greatest.
func (tab *summary) spread(figure string, vs []float64, unit string) {
	tab.add(figure, median(vs, func(v float64) float64 { return v }), unit, "", "")
	if len(vs) > 0 {
		row := &(*tab)[len(*tab)-1]
		lo, hi := math.Round(slices.Min(vs)*10)/10, math.Round(slices.Max(vs)*10)/10
		row.Min, row.Max = &lo, &hi
	}
}

// below adds a figure that should stay under target.
func (tab *summary) below(figure string, v float64, unit string, target float64) {
	tab.add(figure, v, unit, fmt.Sprintf("< %g %s", target, unit), gapBelow(v, target, unit))
}

// startRows adds the start, jail, firmware, microvm, bare QEMU and
// memory figures of benchStarts' pods (and the runc shim's).
func (r *benchReport) startRows(tab *summary) {
	st := func(f func(startSample) float64) float64 { return median(r.Start, f) }
	tab.add("start: RunPodSandbox", st(func(s startSample) float64 { return s.RunPodSandbox }), "ms", "", "")
	tab.add("start: CreateContainer", st(func(s startSample) float64 { return s.CreateContainer }), "ms", "", "")
	tab.add("start: StartContainer", st(func(s startSample) float64 { return s.StartContainer }), "ms", "", "")
	for _, f := range []struct {
		name string
		at   func(startSample) float64
	}{
		{"QEMU exec", func(s startSample) float64 { return s.QEMUExec }},
		{"first console line", func(s startSample) float64 { return s.FirstConsole }},
		{"ready (GUEST-BOOTED)", func(s startSample) float64 { return s.Ready }},
		{"DHCP lease", func(s startSample) float64 { return s.Lease }},
	} {
		tab.add("start: CreateContainer call → "+f.name, st(f.at), "ms", "", "")
	}
	for _, step := range spanSteps {
		name := "start breakdown: " + step
		if spanPhase(step) {
			name = "start breakdown:   qemu: " + strings.TrimPrefix(step, "qemu ")
		}
		tab.add(name, st(func(s startSample) float64 { return s.Spans[step] }), "ms", "", "")
	}
	tab.add("start breakdown: the shim's steps in all", st(func(s startSample) float64 { return spanTotal(s.Spans) }), "ms", "", "")
	tab.below("shim-added start latency, its own work (steps less QEMU's exec and start-up)", st(func(s startSample) float64 { return spanOwn(s.Spans) }), "ms", 30)
	nj := func(f func(startSample) float64) float64 { return median(r.StartNoJail, f) }
	exec := func(s startSample) float64 { return s.QEMUExec }
	ready := func(s startSample) float64 { return s.Ready - s.GuestUptime }
	tab.add("start, jail off: CreateContainer call → QEMU exec", nj(exec), "ms", "", "")
	tab.add("jail cost: CreateContainer call → QEMU exec, on − off", st(exec)-nj(exec), "ms", "", "")
	tab.add("jail cost: CreateContainer call → guest running, on − off", st(ready)-nj(ready), "ms", "", "")
	fwReady := func(ss []startSample) float64 { return median(ss, func(s startSample) float64 { return s.Ready }) }
	tab.add("start, disk with SeaBIOS: CreateContainer call → ready", fwReady(r.StartBIOS), "ms", "", "")
	tab.add("start, disk with OVMF (uefi): CreateContainer call → ready", fwReady(r.StartUEFI), "ms", "", "")
	tab.add("UEFI cost: OVMF − SeaBIOS, CreateContainer call → ready", fwReady(r.StartUEFI)-fwReady(r.StartBIOS), "ms", "", "")
	tab.add("start: the guest's own boot (its uptime at BOOTED)", st(func(s startSample) float64 { return s.GuestUptime }), "ms", "", "")
	mv := func(f func(startSample) float64) float64 { return median(r.StartMicroVM, f) }
	tab.add("microvm: CreateContainer call → ready", mv(func(s startSample) float64 { return s.Ready }), "ms", "", "")
	tab.add("microvm: CreateContainer call → first console line", mv(func(s startSample) float64 { return s.FirstConsole }), "ms", "", "")
	tab.add("microvm − q35: CreateContainer call → ready", mv(func(s startSample) float64 { return s.Ready })-st(func(s startSample) float64 { return s.Ready }), "ms", "", "")
	tab.add("microvm: QEMU start-up (QMP greeting)", mv(func(s startSample) float64 { return s.Spans["qmp greeting"] }), "ms", "", "")
	tab.add("microvm: host overhead per VM pod", median(r.MicroVMMemory, func(m podMemory) float64 { return float64(m.overheadKiB()) / 1024 }), "MiB", "", "")
	paired := slices.DeleteFunc(slices.Clone(r.Start), func(s startSample) bool { return s.Bare == nil })
	pair := func(f func(s startSample, b bareSample) float64) float64 {
		return median(paired, func(s startSample) float64 { return f(s, *s.Bare) })
	}
	tab.add("bare QEMU: exec → first console line", pair(func(_ startSample, b bareSample) float64 { return b.FirstConsole }), "ms", "", "")
	tab.add("bare QEMU: exec → ready (GUEST-BOOTED)", pair(func(_ startSample, b bareSample) float64 { return b.Ready }), "ms", "", "")
	tab.add("bare QEMU: the guest's own boot", pair(func(_ startSample, b bareSample) float64 { return b.GuestUptime }), "ms", "", "")
	tab.below("shim-added start latency, end to end", pair(func(s startSample, b bareSample) float64 { return s.Ready - b.Ready }), "ms", 50)
	tab.below("shim-added start latency, before the guest runs", pair(func(s startSample, b bareSample) float64 {
		return (s.Ready - s.GuestUptime) - (b.Ready - b.GuestUptime)
	}), "ms", 30)
	tab.add("start ratio, end to end: shim path / bare QEMU", pair(func(s startSample, b bareSample) float64 { return s.Ready / b.Ready }), "×", "", "")

	mem := func(f func(podMemory) int) float64 {
		return median(r.PodMemory, func(m podMemory) float64 { return float64(f(m)) / 1024 })
	}
	shimPSS := mem(func(m podMemory) int { return m.Shim.PSSKiB })
	shimRSS := mem(func(m podMemory) int { return m.Shim.RSSKiB })
	if r.RuncShim != nil {
		runcPSS, runcRSS := float64(r.RuncShim.PSSKiB)/1024, float64(r.RuncShim.RSSKiB)/1024
		tab.add("vm shim RSS", shimRSS, "MiB", fmt.Sprintf("≤ runc shim (%.1f MiB)", runcRSS), gapBelow(shimRSS, runcRSS, "MiB"))
		tab.add("vm shim PSS", shimPSS, "MiB", fmt.Sprintf("≤ runc shim (%.1f MiB)", runcPSS), gapBelow(shimPSS, runcPSS, "MiB"))
		tab.add("runc shim RSS", float64(r.RuncShim.RSSKiB)/1024, "MiB", "", "")
		tab.add("runc shim PSS", runcPSS, "MiB", "", "")
	} else {
		tab.add("vm shim RSS", shimRSS, "MiB", "≤ runc shim", "n/a: "+r.RuncNote)
		tab.add("vm shim PSS", shimPSS, "MiB", "≤ runc shim", "n/a: "+r.RuncNote)
	}
	tab.add("VM pod: QEMU RSS", mem(func(m podMemory) int { return m.QEMU.RSSKiB }), "MiB", "", "")
	tab.add("VM pod: QEMU PSS", mem(func(m podMemory) int { return m.QEMU.PSSKiB }), "MiB", "", "")
	tab.add("VM pod: guest RAM touched", mem(func(m podMemory) int { return m.GuestKiB }), "MiB", "", "")
	tab.add("VM pod: QEMU beyond guest RAM (PSS)", mem(func(m podMemory) int { return m.QEMU.PSSKiB - m.GuestKiB }), "MiB", "", "")
	tab.add("VM pod: QEMU beyond guest RAM, anonymous only", mem(func(m podMemory) int { return m.QEMU.AnonKiB - m.GuestKiB }), "MiB", "", "")
	tab.add("VM pod: pause PSS", mem(func(m podMemory) int { return m.Pause.PSSKiB }), "MiB", "", "")
	tab.below("host overhead per VM pod", mem(podMemory.overheadKiB), "MiB", 90)
}

// densityRows adds the figures of each density run and the cold image's.
func (r *benchReport) densityRows(tab *summary) {
	for i := range r.Density {
		d := &r.Density[i]
		ratio := d.ProcessesPerPodMiB / r.Density[0].ProcessesPerPodMiB
		if finite(ratio) {
			d.CostRatio = ratio
		}
		p, failed := fmt.Sprintf("density N=%d: ", d.Pods), ""
		if d.Failed > 0 {
			failed = fmt.Sprintf("%d pods failed (%d guests panicked or hung)", d.Failed, d.NoBoot)
		}
		tab.add(p+"all ready", d.AllReadyS, "s", "", failed)
		tab.add(p+"memory per pod (processes)", d.ProcessesPerPodMiB, "MiB", "", "")
		tab.add(p+"memory per pod (MemAvailable)", d.MemAvailablePerPodMiB, "MiB", "", "")
		tab.below(p+"overhead per pod", d.OverheadPerPodMiB, "MiB", 90)
		tab.add(p+fmt.Sprintf("per-pod cost vs N=%d", r.Density[0].Pods), ratio, "×", "≤ 1.10× (flat)", gapBelow(ratio, 1.10, "×"))
	}

	if d := r.Cold; d != nil {
		failed := ""
		if d.Failed > 0 {
			failed = fmt.Sprintf("%d pods failed (%d guests panicked or hung)", d.Failed, d.NoBoot)
		}
		tab.add(fmt.Sprintf("cold image (not unpacked), N=%d at once: all ready", d.Pods), d.AllReadyS, "s", "", failed)
		for _, w := range r.Density {
			if w.Pods == d.Pods {
				tab.add(fmt.Sprintf("cold image, N=%d: all ready, less the unpacked image's", d.Pods), d.AllReadyS-w.AllReadyS, "s", "", "")
			}
		}
	}
}

// teardownRows adds the graceful and forced teardowns of benchStarts' pods.
func (r *benchReport) teardownRows(tab *summary) {
	for i, samples := range [][]teardownSample{r.Graceful, r.Forced} {
		m := func(f func(teardownSample) float64) float64 { return median(samples, f) }
		p := "teardown " + []string{"graceful (StopContainer 30 s)", "forced (StopContainer 0 s)"}[i] + ": "
		tab.add(p+"StopContainer", m(func(s teardownSample) float64 { return s.StopContainer }), "ms", "", "")
		tab.add(p+"StopPodSandbox", m(func(s teardownSample) float64 { return s.StopPodSandbox }), "ms", "", "")
		tab.add(p+"RemovePodSandbox", m(func(s teardownSample) float64 { return s.RemovePodSandbox }), "ms", "", "")
		tab.below(p+"QEMU exit → RemovePodSandbox returns", m(func(s teardownSample) float64 { return s.AfterQEMUExit }), "ms", 300)
	}
}

// gapBelow says how far value is above a target it should stay under.
func gapBelow(value, target float64, unit string) string {
	if !finite(value) {
		return "n/a"
	}
	if value <= target {
		return "met"
	}
	return fmt.Sprintf("+%.1f %s", value-target, unit)
}

// gapAbove says how far value is below a target it should reach.
func gapAbove(value, target float64, unit string) string {
	if !finite(value) {
		return "n/a"
	}
	if value >= target {
		return "met"
	}
	return fmt.Sprintf("-%.1f %s", target-value, unit)
}

// formatTable renders rows as a table with aligned columns.
func formatTable(rows []tableRow) string {
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 0, 1, ' ', tabwriter.Debug)
	fmt.Fprintln(w, "figure\t value\t min–max\t target\t gap\n------\t -----\t -------\t ------\t ---")
	for _, r := range rows {
		v, spread := "n/a", "-"
		if r.Value != nil {
			v = fmt.Sprintf("%.1f %s", *r.Value, r.Unit)
		}
		if r.Min != nil && r.Max != nil {
			spread = fmt.Sprintf("%.1f–%.1f", *r.Min, *r.Max)
		}
		fmt.Fprintf(w, "%s\t %s\t %s\t %s\t %s\n", r.Figure, v, spread, r.Target, r.Gap)
	}
	_ = w.Flush() // a strings.Builder takes every write
	return b.String()
}

// median returns the median of f over xs, NaN when there are none.
func median[T any](xs []T, f func(T) float64) float64 {
	var v []float64
	for _, x := range xs {
		v = append(v, f(x))
	}
	slices.Sort(v)
	switch n := len(v); {
	case n == 0:
		return math.NaN()
	case n%2 == 0:
		return (v[n/2-1] + v[n/2]) / 2
	}
	return v[len(v)/2]
}

// finite reports whether v is a number JSON can hold.
func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

// millis is d in milliseconds.
func millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// logLine is a line of a CRI log.
type logLine struct {
	at   time.Time
	text string
}

// logMarks reads a CRI log file ("TIMESTAMP STREAM TAG content" lines)
// and returns its first line ("") and the first line holding each marker
// found.
func logMarks(path string, markers []string) (map[string]logLine, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	marks := map[string]logLine{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), " ", 4)
		if len(parts) != 4 {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, parts[0])
		if err != nil {
			return nil, fmt.Errorf("log line %q: %w", sc.Text(), err)
		}
		if _, ok := marks[""]; !ok {
			marks[""] = logLine{at, parts[3]}
		}
		for _, m := range markers {
			if _, ok := marks[m]; !ok && strings.Contains(parts[3], m) {
				marks[m] = logLine{at, parts[3]}
			}
		}
	}
	return marks, sc.Err()
}

// guestUptime returns the guest's uptime in ms from its uptime marker line.
func guestUptime(line string) float64 {
	_, v, _ := strings.Cut(strings.TrimSpace(line), benchMarkUptime+" ")
	s, _ := strconv.ParseFloat(v, 64)
	return s * 1000
}

// startSample turns the recorded times into a start sample.
func (v *benchVM) startSample() startSample {
	from := func(at time.Time) float64 {
		if at.IsZero() {
			return 0
		}
		return millis(at.Sub(v.create0))
	}
	return startSample{
		RunPodSandbox: millis(v.run1.Sub(v.run0)), CreateContainer: millis(v.create1.Sub(v.create0)), StartContainer: millis(v.start1.Sub(v.create1)),
		QEMUExec:     from(v.qemuStart),
		FirstConsole: from(v.marks[""].at), Lease: from(v.marks[benchMarkLease].at), Ready: from(v.marks[markerBooted].at),
		GuestUptime: guestUptime(v.marks[benchMarkUptime].text),
		Spans:       readSpans(v.p.c.d.logPath, v.ct.id),
	}
}

// processStart returns when pid started: /proc/PID/stat's starttime, in
// clock ticks of 10 ms since boot, on the clock CLOCK_BOOTTIME reads.
func processStart(pid int) (time.Time, error) {
	st, err := procStat(pid)
	if err != nil {
		return time.Time{}, err
	}
	ticks, err := strconv.ParseInt(st[19], 10, 64)
	var boot unix.Timespec
	if err == nil {
		err = unix.ClockGettime(unix.CLOCK_BOOTTIME, &boot)
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("start of %d: %w", pid, err)
	}
	return time.Now().Add(time.Duration(ticks)*10*time.Millisecond - time.Duration(boot.Nano())), nil
}

// procStat returns the fields of /proc/PID/stat after the command name:
// [0] is the state, [19] the start time.
func procStat(pid int) ([]string, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil, err
	}
	i := strings.LastIndexByte(string(data), ')')
	f := strings.Fields(string(data[i+1:]))
	if i < 0 || len(f) < 20 {
		return nil, fmt.Errorf("/proc/%d/stat: %q", pid, data)
	}
	return f, nil
}

// procCmdline returns a process's argv.
func procCmdline(pid int) ([]string, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return strings.Split(strings.TrimRight(string(data), "\x00"), "\x00"), err
}

// qemuMemMiB returns the guest RAM of QEMU process pid (its -m NM).
func qemuMemMiB(pid int) int {
	data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	_, rest, _ := strings.Cut(string(data), "\x00-m\x00")
	n, _ := strconv.Atoi(strings.SplitN(rest, "M", 2)[0])
	return n
}

// smapsRollup reads a process's Rss and Pss from /proc/PID/smaps_rollup.
func smapsRollup(pid int) (r rollup, err error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "Rss:" {
			r.RSSKiB, _ = strconv.Atoi(f[1])
		} else if len(f) >= 2 && f[0] == "Pss:" {
			r.PSSKiB, _ = strconv.Atoi(f[1])
		} else if len(f) >= 2 && f[0] == "Anonymous:" {
			r.AnonKiB, _ = strconv.Atoi(f[1])
		}
	}
	return r, err
}

// memAvailableKiB reads MemAvailable from /proc/meminfo.
func memAvailableKiB(t *testing.T) int {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	return meminfo(t, string(data), "MemAvailable")
}

// plotSeries is one line of a plot.
type plotSeries struct {
	name, color string
	y           []float64
}

// densitySVG plots per-pod host memory and the time until all pods booted
// against the number of pods started at once.
func densitySVG(pts []densityPoint) string {
	var b strings.Builder
	b.WriteString(`<svg xmlns="http://www.w3.org/2000/svg" width="900" height="380" font-family="sans-serif" font-size="12">` + "\n")
	b.WriteString(`<rect width="900" height="380" fill="white"/>` + "\n")
	xs := make([]float64, len(pts))
	var procs, avail, over, ready []float64
	for i, p := range pts {
		xs[i] = float64(p.Pods)
		procs, avail = append(procs, p.ProcessesPerPodMiB), append(avail, p.MemAvailablePerPodMiB)
		over, ready = append(over, p.OverheadPerPodMiB), append(ready, p.AllReadyS)
	}
	plotPanel(&b, 70, "host memory per VM pod (MiB)", xs, []plotSeries{
		{"QEMU RSS + shim + pause PSS", "#1f77b4", procs},
		{"MemAvailable drop", "#ff7f0e", avail},
		{"beyond guest RAM (target 40)", "#2ca02c", over},
	})
	plotPanel(&b, 520, "first RunPodSandbox → last guest booted (s)", xs, []plotSeries{{"all pods ready", "#d62728", ready}})
	b.WriteString("</svg>\n")
	return b.String()
}

// plotPanel draws one 340×220 line chart whose left edge is at x0.
func plotPanel(b *strings.Builder, x0 float64, title string, xs []float64, ss []plotSeries) {
	const top, w, h = 80.0, 340.0, 220.0
	maxX, maxY := max(1, slices.Max(xs)), 0.0
	for _, s := range ss {
		for _, y := range s.y {
			if finite(y) {
				maxY = max(maxY, y)
			}
		}
	}
	maxY = niceCeil(maxY * 1.1)
	px := func(x float64) float64 { return x0 + x/maxX*w }
	py := func(y float64) float64 { return top + h - y/maxY*h }
	fmt.Fprintf(b, `<text x="%.0f" y="20" font-size="14" font-weight="bold">%s</text>`+"\n", x0, title)
	for i, s := range ss {
		fmt.Fprintf(b, `<rect x="%.0f" y="%d" width="10" height="10" fill="%s"/><text x="%.0f" y="%d">%s</text>`+"\n", x0, 28+i*12, s.color, x0+14, 37+i*12, s.name)
	}
	fmt.Fprintf(b, `<path d="M%.0f %.0f V%.0f H%.0f" stroke="black" fill="none"/>`+"\n", x0, top, top+h, x0+w)
	for i := 0; i <= 4; i++ {
		y := maxY * float64(i) / 4
		fmt.Fprintf(b, `<line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#ddd"/><text x="%.0f" y="%.1f" text-anchor="end">%g</text>`+"\n",
			x0, py(y), x0+w, py(y), x0-4, py(y)+4, y)
	}
	for _, x := range xs {
		fmt.Fprintf(b, `<text x="%.1f" y="%.0f" text-anchor="middle">%g</text>`+"\n", px(x), top+h+16, x)
	}
	fmt.Fprintf(b, `<text x="%.0f" y="%.0f" text-anchor="middle">pods started at once</text>`+"\n", x0+w/2, top+h+34)
	for _, s := range ss {
		var pts []string
		for i, y := range s.y {
			if i < len(xs) && finite(y) {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(xs[i]), py(y)))
				fmt.Fprintf(b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`+"\n", px(xs[i]), py(y), s.color)
			}
		}
		fmt.Fprintf(b, `<polyline points="%s" stroke="%s" stroke-width="2" fill="none"/>`+"\n", strings.Join(pts, " "), s.color)
	}
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	p := math.Pow(10, math.Floor(math.Log10(max(v, 1))))
	for _, m := range []float64{1, 2, 5} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}
