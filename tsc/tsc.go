package tsc

import (
	"errors"
	"slices"
	"sync"
	"time"
)

const (
	// samples is how many intervals are measured; the median is kept, so
	// that one interval stretched by preemption does not count.
	samples = 5
	// interval is how long each sample lasts.
	interval = 20 * time.Millisecond
	// minKHz and maxKHz bound a plausible counter rate.
	minKHz, maxKHz = 100_000, 10_000_000
)

var (
	once     sync.Once
	khz      uint64
	rateErr  error
	readTSC  = rdtsc // the counter; tests replace it
	errNoTSC = errors.New("no time stamp counter on this architecture")
)

// KHz returns the host's time stamp counter rate in kHz, measured once
// against the monotonic clock (100 ms, the first time it is called).
func KHz() (uint64, error) {
	once.Do(func() { khz, rateErr = measure() })
	return khz, rateErr
}

// measure times the counter over samples intervals and returns the median
// rate.
func measure() (uint64, error) {
	if !haveTSC {
		return 0, errNoTSC
	}
	rates := make([]uint64, 0, samples)
	for range samples {
		t0, c0 := time.Now(), readTSC()
		time.Sleep(interval)
		c1, t1 := readTSC(), time.Now()
		elapsed := t1.Sub(t0)
		if c1 <= c0 || elapsed <= 0 {
			continue
		}
		rates = append(rates, (c1-c0)*uint64(time.Millisecond)/uint64(elapsed))
	}
	if len(rates) == 0 {
		return 0, errors.New("time stamp counter did not advance")
	}
	slices.Sort(rates)
	r := rates[len(rates)/2]
	if r < minKHz || r > maxKHz {
		return 0, errors.New("time stamp counter rate out of range")
	}
	return r, nil
}
