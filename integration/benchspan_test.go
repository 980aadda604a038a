package integration

import (
	"bufio"
	"os"
	"regexp"
	"strconv"
	"strings"
)

// spanSteps are the steps of a VM container's Create and Start, in their
// order, as the shim's span log lines name them (launch/span.go, and
// launch/steps.go for Create's). The qemu
// step holds the three phases after it; the rest follow one another.
var spanSteps = []string{
	"classify", "resolve config", "record", "claim pod", "cgroup", "rootfs", "netns", "disks", "firmware", "host devices",
	"shares", "network", "seed", "accelerator", "jail", "kernel", "resources",
	"qemu", "qemu exec", "qmp greeting", "qmp setup", "pin vcpus", "start hooks", "cont",
}

// spanPhase reports whether a step is part of another one (of qemu).
func spanPhase(step string) bool {
	return step == "qemu exec" || step == "qmp greeting" || step == "qmp setup"
}

// spanLine matches a shim's span log line in containerd's log.
var (
	spanLine  = regexp.MustCompile(`\bmsg=span\b`)
	spanID    = regexp.MustCompile(`\bid=([0-9a-f]+)\b`)
	spanStep  = regexp.MustCompile(`\bstep=("[^"]*"|\S+)`)
	spanMilli = regexp.MustCompile(`\bms=("?)([0-9.]+)`)
)

// readSpans returns the steps the shim timed for container id, from
// containerd's log at path: milliseconds by step.
func readSpans(path, id string) map[string]float64 {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !spanLine.MatchString(line) || !strings.Contains(line, id) {
			continue
		}
		m, s, ms := spanID.FindStringSubmatch(line), spanStep.FindStringSubmatch(line), spanMilli.FindStringSubmatch(line)
		if m == nil || m[1] != id || s == nil || ms == nil {
			continue
		}
		step, err := strconv.Unquote(s[1])
		if err != nil {
			step = s[1]
		}
		if v, err := strconv.ParseFloat(ms[2], 64); err == nil {
			out[step] += v
		}
	}
	return out
}

// spanTotal is the time of the shim's own steps before the guest runs:
// every step but the phases of qemu, which its span holds.
func spanTotal(spans map[string]float64) float64 {
	var sum float64
	for step, ms := range spans {
		if !spanPhase(step) {
			sum += ms
		}
	}
	return sum
}

// spanOwn is the shim's own work before the guest runs: its steps less
// QEMU's exec and start-up until its QMP monitor answers, which bare QEMU
// spends as well.
func spanOwn(spans map[string]float64) float64 {
	return spanTotal(spans) - spans["qemu exec"] - spans["qmp greeting"]
}
