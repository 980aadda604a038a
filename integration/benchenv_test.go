package integration

import (
	"cmp"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// envInts reads comma-separated positive numbers from env var name or def.
func envInts(t *testing.T, name, def string) (out []int) {
	spec := cmp.Or(os.Getenv(name), def)
	for _, f := range strings.Split(spec, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want positive numbers like %s", name, spec, def)
		}
		out = append(out, n)
	}
	return out
}

// envSections reads the sections to run from VMSHIM_BENCH_ONLY: names
// of the sections, comma-separated, or all of them when it is unset.
func envSections(t *testing.T) []string {
	all := []string{sectionStart, sectionRunc, sectionDensity, sectionCold, sectionPacing, sectionSuspend, sectionMemory, sectionBurst}
	spec := os.Getenv(envBenchOnly)
	if spec == "" {
		return all
	}
	var out []string
	for _, f := range strings.Split(spec, ",") {
		if f = strings.TrimSpace(f); !slices.Contains(all, f) {
			t.Fatalf("%s=%q: %q is none of the sections %s", envBenchOnly, spec, f, strings.Join(all, ", "))
		}
		out = append(out, f)
	}
	return out
}
