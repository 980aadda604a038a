//go:build !amd64

package tsc

// haveTSC says rdtsc reads the counter.
const haveTSC = false

// rdtsc reads nothing where there is no time stamp counter.
func rdtsc() uint64 { return 0 }
