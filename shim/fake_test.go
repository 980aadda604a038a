package shim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/events"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/shim"
	"github.com/containerd/containerd/v2/pkg/shutdown"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/vmshim/vmshim/launch"
	"github.com/vmshim/vmshim/logtest"
	"github.com/vmshim/vmshim/runcshim"
)

// waitTimeout bounds every wait in these tests; nothing should come close.
const waitTimeout = 5 * time.Second

// fakeVM is a VM whose exit the test controls. Its console is one end of
// a net.Pipe; the test plays the guest on the other end.
type fakeVM struct {
	pid   int
	host  net.Conn // handed to the task as Console
	guest net.Conn // the guest's side of the serial port
	done  chan struct{}

	exitOnce sync.Once
	mu       sync.Mutex // guards everything below
	calls    []string
	code     int
	at       time.Time
	released int
	// startErr and pauseErr, when set, fail Start and Pause.
	startErr, pauseErr error
	// killKeepsRunning stops Kill from ending the VM (the default mimics
	// QEMU: SIGKILL ends it with 137).
	killKeepsRunning bool
	// frozen, when set, makes Start, Powerdown, Pause and Resume wait, as
	// calls to a QEMU stopped with SIGSTOP do, until it is closed, their
	// context ends or the VM exits (QMP's connection then closes).
	frozen chan struct{}
	// noDeadline lists the QMP calls made with a context without deadline.
	noDeadline []string
	// onStart, when set, runs as Start succeeds: what the guest does as
	// its vCPUs start. hooks are the VM's start hooks (nil: none).
	onStart func()
	hooks   launch.StartHooks
	// agent is the guest agent (nil: none); stats what Stats returns;
	// updates what Update was given.
	agent   launch.GuestAgent
	stats   proto.Message
	updates []*specs.LinuxResources
	// releaseErrs fail Release, one call each, in turn.
	releaseErrs []error
	// oom counts OOM kills (nil: not watched); ioPause and ioChanged
	// play QEMU's disk-error pause (see setIOPause).
	oom       *fakeOOM
	ioPause   fmt.Stringer
	ioChanged chan struct{}
	// onExit, when set, runs as the VM exits, before Done is closed:
	// what goes with QEMU (its ports).
	onExit func()
}

// fakeOOM is an OOM kill counter the test raises.
type fakeOOM struct {
	events chan struct{}
	mu     sync.Mutex
	count  uint64
}

func newFakeOOM() *fakeOOM { return &fakeOOM{events: make(chan struct{}, 1)} }

func (o *fakeOOM) Events() <-chan struct{} { return o.events }

func (o *fakeOOM) Killed() (uint64, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.count, nil
}

// kill counts one OOM kill; notify says whether the watch reports it
// (the kernel's notification may come after the process is gone).
func (o *fakeOOM) kill(notify bool) {
	o.mu.Lock()
	o.count++
	o.mu.Unlock()
	if notify {
		select {
		case o.events <- struct{}{}:
		default:
		}
	}
}

func newFakeVM(pid int) *fakeVM {
	host, guest := net.Pipe()
	return &fakeVM{pid: pid, host: host, guest: guest, done: make(chan struct{})}
}

var _ launch.VM = (*fakeVM)(nil)

func (v *fakeVM) Pid() int { return v.pid }

func (v *fakeVM) Console() io.ReadWriteCloser { return v.host }

func (v *fakeVM) record(call string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.calls = append(v.calls, call)
}

// qmp stands for a QMP call: it waits while the VM is frozen.
func (v *fakeVM) qmp(ctx context.Context, call string) error {
	v.record(call)
	v.mu.Lock()
	frozen := v.frozen
	if _, ok := ctx.Deadline(); !ok {
		v.noDeadline = append(v.noDeadline, call)
	}
	v.mu.Unlock()
	if frozen == nil {
		return nil
	}
	select {
	case <-frozen:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-v.done:
		return errors.New("qmp connection closed")
	}
}

func (v *fakeVM) Start(ctx context.Context) error {
	if err := v.qmp(ctx, "start"); err != nil {
		return err
	}
	v.mu.Lock()
	err, onStart := v.startErr, v.onStart
	v.mu.Unlock()
	if err == nil && onStart != nil {
		onStart()
	}
	return err
}

func (v *fakeVM) Powerdown(ctx context.Context) error {
	return v.qmp(ctx, "powerdown")
}

func (v *fakeVM) Kill() error {
	v.record("kill")
	v.mu.Lock()
	keep := v.killKeepsRunning
	v.mu.Unlock()
	if !keep {
		v.exit(137)
	}
	return nil
}

func (v *fakeVM) Pause(ctx context.Context) error {
	if err := v.qmp(ctx, "pause"); err != nil {
		return err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.pauseErr
}

// Resume restarts the vCPUs: QEMU then retries a request that had
// failed, which (in this fake) now succeeds.
func (v *fakeVM) Resume(ctx context.Context) error {
	if err := v.qmp(ctx, "resume"); err != nil {
		return err
	}
	v.mu.Lock()
	paused := v.ioPause != nil
	v.mu.Unlock()
	if paused {
		v.setIOPause(nil)
	}
	return nil
}

func (v *fakeVM) Done() <-chan struct{} { return v.done }

func (v *fakeVM) StartHooks() launch.StartHooks {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.hooks
}

func (v *fakeVM) GuestAgent() launch.GuestAgent {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.agent
}

func (v *fakeVM) Stats(context.Context) (proto.Message, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.stats == nil {
		return nil, fmt.Errorf("no cgroup: %w", errdefs.ErrNotFound)
	}
	return v.stats, nil
}

func (v *fakeVM) Update(_ context.Context, r *specs.LinuxResources) error {
	v.record("update")
	v.mu.Lock()
	defer v.mu.Unlock()
	v.updates = append(v.updates, r)
	return nil
}

func (v *fakeVM) ExitStatus() (int, time.Time) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.code, v.at
}

func (v *fakeVM) Release(context.Context) error {
	v.record("release")
	v.mu.Lock()
	defer v.mu.Unlock()
	if len(v.releaseErrs) > 0 {
		err := v.releaseErrs[0]
		v.releaseErrs = v.releaseErrs[1:]
		if err != nil {
			return err
		}
	}
	v.released++
	return nil
}

func (v *fakeVM) OOMKills() launch.OOMCounter {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.oom == nil {
		return nil
	}
	return v.oom
}

func (v *fakeVM) IOPause() (fmt.Stringer, <-chan struct{}) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.ioChanged == nil {
		v.ioChanged = make(chan struct{})
	}
	return v.ioPause, v.ioChanged
}

// setIOPause plays QEMU pausing the VM at a disk error (p), or running it
// again (nil).
func (v *fakeVM) setIOPause(p fmt.Stringer) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.ioPause = p
	if v.ioChanged != nil {
		close(v.ioChanged)
	}
	v.ioChanged = make(chan struct{})
}

// exit ends the VM the way QEMU's exit does: the serial port closes, then
// Done is closed. Only the first call counts.
func (v *fakeVM) exit(code int) {
	v.exitOnce.Do(func() {
		v.mu.Lock()
		v.code, v.at = code, time.Now()
		onExit := v.onExit
		v.mu.Unlock()
		_ = v.guest.Close()
		if onExit != nil {
			onExit()
		}
		close(v.done)
	})
}

// callList returns the calls made so far, in order.
func (v *fakeVM) callList() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return append([]string(nil), v.calls...)
}

// count reports how many times call was made.
func (v *fakeVM) count(call string) int {
	n := 0
	for _, c := range v.callList() {
		if c == call {
			n++
		}
	}
	return n
}

func (v *fakeVM) releaseCount() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.released
}

// fakeLauncher hands out fake VMs and records what it was asked for.
type fakeLauncher struct {
	mu  sync.Mutex // guards everything below
	err error      // when set, Launch fails with it
	// prepare, when set, changes each VM before Launch returns it.
	prepare func(*fakeVM)
	next    int
	vms     map[string]*fakeVM
	reqs    []*launch.Request
	// ordinary names the containers Classify finds ordinary, to be run
	// by runcShim.
	ordinary map[string]bool
	runcShim string
}

// Classify finds every container a VM, but for those ordinary names.
func (l *fakeLauncher) Classify(_ context.Context, r *launch.Request) (launch.Class, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ordinary[r.ID] {
		return launch.Class{RuncShim: l.runcShim}, nil
	}
	return launch.Class{VM: true}, nil
}

func newFakeLauncher() *fakeLauncher {
	return &fakeLauncher{next: 1000, vms: make(map[string]*fakeVM)}
}

func (l *fakeLauncher) Launch(_ context.Context, r *launch.Request) (launch.VM, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.reqs = append(l.reqs, r)
	if l.err != nil {
		return nil, l.err
	}
	l.next++
	v := newFakeVM(l.next)
	if l.prepare != nil {
		l.prepare(v)
	}
	l.vms[r.ID] = v
	return v, nil
}

// vm returns the VM launched for id.
func (l *fakeLauncher) vm(t *testing.T, id string) *fakeVM {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	v := l.vms[id]
	if v == nil {
		t.Fatalf("no vm launched for %s", id)
	}
	return v
}

// requests returns the launch requests so far.
func (l *fakeLauncher) requests() []*launch.Request {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]*launch.Request(nil), l.reqs...)
}

// exitAll ends every VM still running.
func (l *fakeLauncher) exitAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, v := range l.vms {
		v.exit(0)
	}
}

// published is one event as the publisher saw it.
type published struct {
	ns    string
	topic string
	event any
}

// fakePublisher records events in order.
type fakePublisher struct {
	mu      sync.Mutex // guards everything below
	events  []published
	cursor  int           // next event handed out by next
	changed chan struct{} // closed and replaced on every change
	closed  bool
	// onPublish, when set, runs inside Publish before the event is recorded.
	onPublish func(topic string, event any)
}

func newFakePublisher() *fakePublisher {
	return &fakePublisher{changed: make(chan struct{})}
}

var _ shim.Publisher = (*fakePublisher)(nil)

func (p *fakePublisher) Publish(ctx context.Context, topic string, event events.Event) error {
	p.mu.Lock()
	hook := p.onPublish
	p.mu.Unlock()
	if hook != nil {
		hook(topic, event)
	}
	ns, _ := namespaces.Namespace(ctx)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.events = append(p.events, published{ns: ns, topic: topic, event: event})
	close(p.changed)
	p.changed = make(chan struct{})
	return nil
}

func (p *fakePublisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	close(p.changed)
	p.changed = make(chan struct{})
	return nil
}

func (p *fakePublisher) setHook(fn func(topic string, event any)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.onPublish = fn
}

// waitUntil waits until cond, checked under p.mu, holds.
func (p *fakePublisher) waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(waitTimeout)
	for {
		p.mu.Lock()
		ok, changed := cond(), p.changed
		p.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// next returns the next event not yet handed out, waiting for it.
func (p *fakePublisher) next(t *testing.T) published {
	t.Helper()
	p.waitUntil(t, "an event", func() bool { return len(p.events) > p.cursor })
	p.mu.Lock()
	defer p.mu.Unlock()
	e := p.events[p.cursor]
	p.cursor++
	return e
}

// expect returns the next event and checks its topic and type.
func expect[E any](t *testing.T, p *fakePublisher, topic string) E {
	t.Helper()
	e := p.next(t)
	if e.topic != topic {
		t.Fatalf("event %s (%T), want %s", e.topic, e.event, topic)
	}
	ev, ok := e.event.(E)
	if !ok {
		t.Fatalf("event %s is %T", topic, e.event)
	}
	return ev
}

// all returns every event published so far.
func (p *fakePublisher) all() []published {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]published(nil), p.events...)
}

// testLogger returns a context whose logger prints nothing and the
// recorder of its warnings and errors.
func testLogger(t *testing.T) (context.Context, *logtest.Recorder) {
	t.Helper()
	return logtest.New()
}

// newService starts a task service with fakes, in namespace "test".
func newService(t *testing.T) (*service, *fakeLauncher, *fakePublisher, shutdown.Service) {
	t.Helper()
	s, l, p, sd, _ := newLoggedService(t)
	return s, l, p, sd
}

// newLoggedService is newService that also returns the service's
// warnings and errors.
func newLoggedService(t *testing.T) (*service, *fakeLauncher, *fakePublisher, shutdown.Service, *logtest.Recorder) {
	t.Helper()
	base, rec := testLogger(t)
	ctx, sd := shutdown.WithShutdown(namespaces.WithNamespace(base, "test"))
	l, p := newFakeLauncher(), newFakePublisher()
	ts, err := NewTaskService(ctx, p, sd, l, runcshim.Config{})
	if err != nil {
		t.Fatal(err)
	}
	s, ok := ts.(*service)
	if !ok {
		t.Fatalf("NewTaskService returned %T", ts)
	}
	t.Cleanup(l.exitAll)
	return s, l, p, sd, rec
}

// mkfifo makes a fifo in a fresh temporary directory.
func mkfifo(t *testing.T, name string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := unix.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// openFifo opens a fifo in the background (opening one end blocks until
// the other end is open) and closes it when the test ends. The cleanup,
// which runs before the fifo's directory is removed, first ends an open
// still waiting, by holding both ends itself (O_RDWR never blocks), and
// waits for it: an open never outlives its test.
func openFifo(t *testing.T, path string, flag int) <-chan *os.File {
	t.Helper()
	ch := make(chan *os.File, 1)
	done := make(chan *os.File, 1) // the file opened, or nil; keeps it reachable
	go func() {
		f, err := os.OpenFile(path, flag, 0)
		if err != nil {
			t.Errorf("open fifo %s: %v", path, err)
			close(ch)
			done <- nil
			return
		}
		done <- f
		ch <- f
	}()
	t.Cleanup(func() {
		if both, err := os.OpenFile(path, os.O_RDWR, 0); err == nil {
			defer both.Close()
		}
		if f := <-done; f != nil {
			_ = f.Close()
		}
	})
	return ch
}

// receive waits for a value from ch.
func receive[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v, ok := <-ch:
		if !ok {
			t.Fatalf("%s: channel closed", what)
		}
		return v
	case <-time.After(waitTimeout):
		t.Fatalf("timed out waiting for %s", what)
	}
	panic("unreachable")
}

// closedWithin reports whether ch is closed within waitTimeout.
func closedWithin(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	case <-time.After(waitTimeout):
		return false
	}
}

// isClosedNow reports whether ch is already closed.
func isClosedNow(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// wantErr checks that err, as returned by an RPC, maps back to the
// errdefs class that is (errdefs.IsNotFound, ...) tests for.
func wantErr(t *testing.T, err error, class string, is func(error) bool) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want %s", class)
	}
	if native := errgrpc.ToNative(err); !is(native) {
		t.Fatalf("error %q is not %s", err, class)
	}
}
