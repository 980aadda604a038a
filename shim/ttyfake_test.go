package shim

import (
	"bufio"
	"context"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmshim/vmshim/launch"
)

var _ launch.TerminalGuest = (*fakeAgent)(nil)

// fakePort is a terminal port of the fake agent's VM. The shim holds one
// end of a socketpair (Conn); the test plays the guest on the other. Its
// AddPort and Remove go through the agent's call, so they can be held,
// failed and answered out of order like the agent's own calls.
type fakePort struct {
	name  string
	agent *fakeAgent
	host  net.Conn // the shim's end
	guest net.Conn // the guest's end; closed when the port is removed

	opened, gone, removed          chan struct{}
	openOnce, goneOnce, removeOnce sync.Once
}

// AddPort adds a port named as the VM would name it.
func (a *fakeAgent) AddPort(ctx context.Context) (launch.GuestPort, error) {
	a.mu.Lock()
	name := "vmshim.tty." + strconv.Itoa(len(a.ports)+1)
	a.mu.Unlock()
	if err := a.call(ctx, &agentCall{name: "addport", port: name}); err != nil {
		return nil, err
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	p := &fakePort{
		name: name, agent: a,
		opened: make(chan struct{}), gone: make(chan struct{}), removed: make(chan struct{}),
	}
	for i, c := range []*net.Conn{&p.host, &p.guest} {
		f := os.NewFile(uintptr(fds[i]), name)
		*c, err = net.FileConn(f)
		f.Close()
		if err != nil {
			return nil, err
		}
	}
	a.mu.Lock()
	a.ports = append(a.ports, p)
	a.mu.Unlock()
	return p, nil
}

// port returns the port named name, or nil.
func (a *fakeAgent) port(name string) *fakePort {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, p := range a.ports {
		if p.name == name {
			return p
		}
	}
	return nil
}

// portList returns the ports added so far.
func (a *fakeAgent) portList() []*fakePort {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]*fakePort(nil), a.ports...)
}

// Name is the port's name in the guest.
func (p *fakePort) Name() string { return p.name }

// Conn is the shim's end.
func (p *fakePort) Conn() net.Conn { return p.host }

// Opened is closed once the guest has opened the port (open).
func (p *fakePort) Opened() <-chan struct{} { return p.opened }

// Gone is closed once the VM has gone (vanish).
func (p *fakePort) Gone() <-chan struct{} { return p.gone }

// Remove unplugs the port: QEMU then closes its end. Once the VM has
// gone, the port has gone with it: a held call then returns.
func (p *fakePort) Remove(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-p.gone:
			cancel()
		case <-ctx.Done():
		}
	}()
	err := p.agent.call(ctx, &agentCall{name: "removeport", port: p.name})
	if isClosedNow(p.gone) {
		return nil
	}
	if err != nil {
		return err
	}
	p.removeOnce.Do(func() {
		close(p.removed)
		_ = p.guest.Close()
	})
	return nil
}

// open plays the guest opening the port.
func (p *fakePort) open() { p.openOnce.Do(func() { close(p.opened) }) }

// vanish plays the VM going away: the port is gone, QEMU's end closed.
func (p *fakePort) vanish() {
	p.goneOnce.Do(func() {
		close(p.gone)
		_ = p.guest.Close()
	})
}

// vanishPorts plays the VM's exit for its ports.
func (a *fakeAgent) vanishPorts() {
	for _, p := range a.portList() {
		p.vanish()
	}
}

// isRemoved reports whether Remove has succeeded.
func (p *fakePort) isRemoved() bool { return isClosedNow(p.removed) }

// hostClosed reports whether the shim has closed its end.
func (p *fakePort) hostClosed() bool {
	_ = p.guest.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
	defer p.guest.SetReadDeadline(time.Time{})
	_, err := p.guest.Read(make([]byte, 1))
	return err != nil && !os.IsTimeout(err)
}

// fakeTTY plays the guest's end of a terminal: the header line, then a
// line discipline that echoes what it reads.
type fakeTTY struct {
	port   *fakePort
	header string      // the size line the shim sent first
	input  chan string // what the guest read, chunk by chunk
}

// guestTTY reads the header from the port and then echoes its input
// until the port is removed.
func guestTTY(t *testing.T, p *fakePort) *fakeTTY {
	t.Helper()
	r := bufio.NewReader(p.guest)
	_ = p.guest.SetReadDeadline(time.Now().Add(waitTimeout))
	line, err := r.ReadString('\n')
	_ = p.guest.SetReadDeadline(time.Time{})
	if err != nil {
		t.Fatalf("guest reading the terminal's header: %v", err)
	}
	g := &fakeTTY{port: p, header: strings.TrimSuffix(line, "\n"), input: make(chan string, 64)}
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := r.Read(buf)
			if n > 0 {
				g.input <- string(buf[:n])
				_, _ = p.guest.Write(buf[:n])
			}
			if err != nil {
				close(g.input)
				return
			}
		}
	}()
	return g
}
