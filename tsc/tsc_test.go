package tsc

import (
	"runtime"
	"testing"
)

func TestKHzStable(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		if _, err := KHz(); err == nil {
			t.Fatal("KHz measured a counter on an architecture without one")
		}
		return
	}
	a, err := KHz()
	if err != nil {
		t.Fatal(err)
	}
	b, err := measure()
	if err != nil {
		t.Fatal(err)
	}
	// Two measurements agree within 2 %, preemption of a sample apart.
	if diff := max(a, b) - min(a, b); diff*50 > a {
		t.Fatalf("two measurements: %d kHz and %d kHz", a, b)
	}
	t.Logf("time stamp counter: %d kHz", a)
}

func TestMeasureRefusesStuckCounter(t *testing.T) {
	defer func(f func() uint64) { readTSC = f }(readTSC)
	readTSC = func() uint64 { return 42 }
	if _, err := measure(); err == nil && haveTSC {
		t.Fatal("a counter that does not advance was measured")
	}
}

func TestMeasureRefusesImplausibleRate(t *testing.T) {
	defer func(f func() uint64) { readTSC = f }(readTSC)
	n := uint64(0)
	readTSC = func() uint64 { n += 1 << 50; return n }
	if _, err := measure(); err == nil && haveTSC {
		t.Fatal("an implausible rate was accepted")
	}
}
