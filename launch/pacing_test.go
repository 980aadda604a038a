package launch

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/log"

	"github.com/vmshim/vmshim/bootslot"
	"github.com/vmshim/vmshim/qemu"
)

// TestBootSlots sizes pacing: the config's count, else the host's CPUs
// under TCG, and none under KVM or when turned off.
func TestBootSlots(t *testing.T) {
	cpus := bootSlots(0, qemu.AccelTCG)
	if cpus < 1 {
		t.Fatalf("auto under tcg: %d", cpus)
	}
	for _, tc := range []struct {
		n     int
		accel qemu.Accel
		want  int
	}{
		{0, qemu.AccelKVM, 0}, {-1, qemu.AccelTCG, 0}, {-1, qemu.AccelKVM, 0},
		{3, qemu.AccelTCG, 3}, {3, qemu.AccelKVM, 3}, {0, qemu.AccelTCG, cpus},
	} {
		if got := bootSlots(tc.n, tc.accel); got != tc.want {
			t.Errorf("bootSlots(%d, %s) = %d, want %d", tc.n, tc.accel, got, tc.want)
		}
	}
}

// pacedVM is a VM under a pacer of a test: it records its runs and its
// notes, and ends when its done is closed.
type pacedVM struct {
	p    *pacer
	done chan struct{}

	mu    sync.Mutex
	runs  int
	notes []string
	ran   chan struct{} // closed at the first run
	once  sync.Once
}

func newPacedVM(t *testing.T, dir string, n int) *pacedVM {
	t.Helper()
	slots, err := bootslot.New(dir, n)
	if err != nil {
		t.Fatal(err)
	}
	v := &pacedVM{done: make(chan struct{}), ran: make(chan struct{})}
	v.p = &pacer{slots: slots, n: n, hold: time.Hour, logger: log.L, note: func(s string) {
		v.mu.Lock()
		defer v.mu.Unlock()
		v.notes = append(v.notes, s)
	}}
	t.Cleanup(func() {
		v.end()
		v.p.close()
	})
	return v
}

func (v *pacedVM) run(context.Context) error {
	v.mu.Lock()
	v.runs++
	v.mu.Unlock()
	v.once.Do(func() { close(v.ran) })
	return nil
}

func (v *pacedVM) start(t *testing.T) {
	t.Helper()
	if err := v.p.start(context.Background(), v.run, v.done); err != nil {
		t.Fatal(err)
	}
}

func (v *pacedVM) end() {
	select {
	case <-v.done:
	default:
		close(v.done)
	}
}

func (v *pacedVM) state() (int, []string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.runs, append([]string(nil), v.notes...)
}

// kernelAt tells the pacer the guest's kernel clock.
type kernelAt time.Duration

func (k kernelAt) KernelTime() time.Duration { return time.Duration(k) }

func waitRan(t *testing.T, v *pacedVM) {
	t.Helper()
	select {
	case <-v.ran:
	case <-time.After(10 * time.Second):
		t.Fatal("the waiting VM never ran")
	}
}

// TestPacerOneSlot: with one slot the first VM runs at once and the
// second waits, saying so, until the first's kernel is past its early
// boot; a paused wait does not run when the slot frees, and runs once
// resumed, saying how long it waited.
func TestPacerOneSlot(t *testing.T) {
	dir := t.TempDir() + "/slots"
	a := newPacedVM(t, dir, 1)
	b := newPacedVM(t, dir, 1)
	a.start(t)
	if runs, notes := a.state(); runs != 1 || len(notes) != 0 {
		t.Fatalf("first VM: %d runs, notes %q; want it run at once, silently", runs, notes)
	}
	b.start(t)
	if runs, notes := b.state(); runs != 0 || len(notes) != 1 || !strings.HasPrefix(notes[0], "waiting to boot: the node's 1 boot slots are taken") {
		t.Fatalf("second VM: %d runs, notes %q; want it waiting", runs, notes)
	}
	if !b.p.pause() {
		t.Fatal("pause of a waiting VM says it does not wait")
	}
	a.p.seen(kernelAt(time.Second))
	time.Sleep(300 * time.Millisecond)
	if runs, _ := b.state(); runs != 0 {
		t.Fatal("a VM ran before the first's kernel was past its early boot")
	}
	a.p.seen(kernelAt(pastEarlyBoot))
	time.Sleep(300 * time.Millisecond) // more than one of Acquire's polls
	if runs, _ := b.state(); runs != 0 {
		t.Fatal("a paused VM ran when the slot freed")
	}
	if !b.p.resume() {
		t.Fatal("resume of a waiting VM says it does not wait")
	}
	waitRan(t, b)
	if _, notes := b.state(); len(notes) != 2 || !strings.HasPrefix(notes[1], "booting after waiting ") {
		t.Errorf("notes %q, want a booting line", notes)
	}
	if b.p.pause() || b.p.resume() || b.p.abandon() {
		t.Error("a VM that runs is still said to wait")
	}
}

// TestPacerAbandon: a VM stopped while it waits never runs, and gives
// nothing back that it did not hold.
func TestPacerAbandon(t *testing.T) {
	dir := t.TempDir() + "/slots"
	a := newPacedVM(t, dir, 1)
	b := newPacedVM(t, dir, 1)
	a.start(t)
	b.start(t)
	if !b.p.abandon() {
		t.Fatal("abandon of a waiting VM says it did not wait")
	}
	b.end()
	a.end() // the first VM ends: its slot goes back
	c := newPacedVM(t, dir, 1)
	deadline := time.Now().Add(10 * time.Second)
	for {
		slot, ok, err := c.p.slots.TryAcquire()
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			slot.Release()
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the slot never came back after the VM ended")
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond)
	if runs, _ := b.state(); runs != 0 {
		t.Errorf("an abandoned VM ran %d times", runs)
	}
}

// TestPacerHold gives a slot back after hold even when the guest never
// prints a kernel time, and at once when it is already past its early
// boot before the run returns.
func TestPacerHold(t *testing.T) {
	dir := t.TempDir() + "/slots"
	a := newPacedVM(t, dir, 1)
	a.p.hold = 100 * time.Millisecond
	a.start(t)
	b := newPacedVM(t, dir, 1)
	b.start(t)
	waitRan(t, b)

	c := newPacedVM(t, t.TempDir()+"/slots", 1)
	c.p.seen(kernelAt(10 * time.Second))
	c.start(t)
	if _, ok, err := c.p.slots.TryAcquire(); err != nil || !ok {
		t.Errorf("a VM past its early boot still holds its slot: %v %v", ok, err)
	}
}

// TestPacerRunFails gives the slot back when the vCPUs could not run.
func TestPacerRunFails(t *testing.T) {
	dir := t.TempDir() + "/slots"
	a := newPacedVM(t, dir, 1)
	boom := errors.New("qmp cont failed")
	if err := a.p.start(context.Background(), func(context.Context) error { return boom }, a.done); !errors.Is(err, boom) {
		t.Fatalf("start: %v, want %v", err, boom)
	}
	if slot, ok, err := a.p.slots.TryAcquire(); err != nil || !ok {
		t.Fatalf("the slot of a failed run is still held: %v %v", ok, err)
	} else {
		slot.Release()
	}
}
