// Package tsc measures the rate of the host's time stamp counter, which a
// guest under TCG reads as its own: QEMU's TCG answers RDTSC from the
// host's counter.
package tsc
