package tsc

// haveTSC says rdtsc reads the counter.
const haveTSC = true

// rdtsc reads the time stamp counter.
func rdtsc() uint64
