package qemu

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"
)

// unixPeer is a scripted QMP server on a unix socket, which sees the fds
// that come with each message.
type unixPeer struct {
	t    *testing.T
	conn *net.UnixConn
	buf  []byte // read, not yet handed out
	fds  []int  // received with what buf holds
}

// socketPair returns a connected pair of unix stream sockets.
func socketPair(t *testing.T) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	var conns [2]*net.UnixConn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "pair")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = c.(*net.UnixConn)
		t.Cleanup(func() { c.Close() })
	}
	return conns[0], conns[1]
}

// connectUnix returns a client talking to a scripted unix peer after the
// handshake.
func connectUnix(t *testing.T) (*Client, *unixPeer) {
	t.Helper()
	mine, theirs := socketPair(t)
	p := &unixPeer{t: t, conn: theirs}
	go func() {
		p.send("%s", greeting)
		r, _ := p.recv()
		if r.Execute != "qmp_capabilities" {
			t.Errorf("first command = %+v", r)
		}
		p.reply(r, `{}`)
	}()
	c, err := NewClient(testCtx(t, 5*time.Second), mine)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, p
}

func (p *unixPeer) send(format string, args ...any) {
	if _, err := fmt.Fprintf(p.conn, format+"\r\n", args...); err != nil {
		p.t.Errorf("peer send: %v", err)
	}
}

// reply answers r with a return value.
func (p *unixPeer) reply(r peerRequest, ret string) {
	p.send(`{"return": %s, "id": %s}`, ret, r.ID)
}

// fail answers r with an error of class.
func (p *unixPeer) fail(r peerRequest, class string) {
	p.send(`{"error": {"class": %q, "desc": "scripted"}, "id": %s}`, class, r.ID)
}

// event sends a QMP event.
func (p *unixPeer) event(name, data string) {
	p.send(`{"event": %q, "data": %s, "timestamp": {"seconds": 1, "microseconds": 0}}`, name, data)
}

// recv reads the next request and the fds that came with it.
func (p *unixPeer) recv() (peerRequest, []int) {
	for {
		if i := bytes.IndexByte(p.buf, '\n'); i >= 0 {
			line := p.buf[:i]
			p.buf = p.buf[i+1:]
			fds := p.fds
			p.fds = nil
			var r peerRequest
			if err := json.Unmarshal(line, &r); err != nil {
				p.t.Errorf("peer decode %q: %v", line, err)
			}
			return r, fds
		}
		buf, oob := make([]byte, 4096), make([]byte, unix.CmsgSpace(4*4))
		n, oobn, _, _, err := p.conn.ReadMsgUnix(buf, oob)
		if err != nil {
			p.t.Errorf("peer recv: %v", err)
			return peerRequest{}, nil
		}
		p.buf = append(p.buf, buf[:n]...)
		msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
		for _, m := range msgs {
			fds, _ := unix.ParseUnixRights(&m)
			p.fds = append(p.fds, fds...)
		}
	}
}

// expect reads the next request and checks its command and arguments
// (args "" skips the check).
func (p *unixPeer) expect(cmd, args string) (peerRequest, []int) {
	p.t.Helper()
	r, fds := p.recv()
	if r.Execute != cmd {
		p.t.Errorf("command %q (%s), want %q", r.Execute, r.Arguments, cmd)
	}
	if args != "" && !jsonEqual(r.Arguments, args) {
		p.t.Errorf("%s arguments %s, want %s", cmd, r.Arguments, args)
	}
	return r, fds
}

// jsonEqual reports whether two JSON documents hold the same value.
func jsonEqual(a json.RawMessage, b string) bool {
	var x, y any
	return json.Unmarshal(a, &x) == nil && json.Unmarshal([]byte(b), &y) == nil && fmt.Sprint(x) == fmt.Sprint(y)
}

// portVM is a VM whose QMP peer is a scripted unix peer, with a
// virtio-serial controller and its events followed.
func portVM(t *testing.T) (*VM, *unixPeer) {
	t.Helper()
	c, p := connectUnix(t)
	v := &VM{qmp: c, agent: NewAgent(filepath.Join(t.TempDir(), "none.sock"), nil), cmd: &exec.Cmd{Process: &os.Process{Pid: 4242}}}
	events, _ := c.Events()
	go v.follow(log.G(context.Background()), events)
	return v, p
}

// addsPort plays QEMU's side of AddSerialPort for port n and returns
// QEMU's end of the port's socket.
func (p *unixPeer) addsPort(n int) *os.File {
	p.t.Helper()
	r, fds := p.expect("getfd", fmt.Sprintf(`{"fdname": "tty%d-fd"}`, n))
	if len(fds) != 1 {
		p.t.Fatalf("getfd came with %d fds, want 1", len(fds))
	}
	p.reply(r, `{}`)
	r, _ = p.expect("chardev-add", fmt.Sprintf(`{"id": "tty%d", "backend": {"type": "socket",
		"data": {"addr": {"type": "fd", "data": {"str": "tty%[1]d-fd"}}, "server": false}}}`, n))
	p.reply(r, `{}`)
	r, _ = p.expect("device_add", fmt.Sprintf(`{"driver": "virtserialport", "bus": "vser0.0",
		"id": "tty%d-port", "chardev": "tty%[1]d", "name": "vmshim.tty.%[1]d"}`, n))
	p.reply(r, `{}`)
	return os.NewFile(uintptr(fds[0]), "qemu-end")
}

// TestSerialPortLife adds a port, carries bytes both ways, sees the
// guest open it, and removes it: device_del, DEVICE_DELETED, then
// chardev-remove; the next port gets the next number.
func TestSerialPortLife(t *testing.T) {
	v, p := portVM(t)
	ctx := testCtx(t, 5*time.Second)
	theirs := make(chan *os.File, 1)
	go func() { theirs <- p.addsPort(1) }()
	port, err := v.AddSerialPort(ctx)
	if err != nil {
		t.Fatal(err)
	}
	q := <-theirs
	defer q.Close()
	if port.Name() != "vmshim.tty.1" {
		t.Errorf("name %q", port.Name())
	}
	if _, err := q.WriteString("from guest"); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	if n, err := port.Conn().Read(buf); err != nil || string(buf[:n]) != "from guest" {
		t.Errorf("read %q, %v", buf[:n], err)
	}
	if _, err := port.Conn().Write([]byte("to guest")); err != nil {
		t.Fatal(err)
	}
	if n, err := q.Read(buf); err != nil || string(buf[:n]) != "to guest" {
		t.Errorf("qemu read %q, %v", buf[:n], err)
	}

	p.event("VSERPORT_CHANGE", `{"id": "agent-port", "open": true}`)
	p.event("VSERPORT_CHANGE", `{"id": "tty1-port", "open": false}`)
	select {
	case <-port.Opened():
		t.Fatal("opened by another port's event, or by a close")
	case <-time.After(50 * time.Millisecond):
	}
	p.event("VSERPORT_CHANGE", `{"id": "tty1-port", "open": true}`)
	select {
	case <-port.Opened():
	case <-ctx.Done():
		t.Fatal("not opened")
	}

	go func() {
		r, _ := p.expect("device_del", `{"id": "tty1-port"}`)
		p.reply(r, `{}`)
		p.event("DEVICE_DELETED", `{"device": "tty1-port", "path": "/machine/peripheral/tty1-port"}`)
		r, _ = p.expect("chardev-remove", `{"id": "tty1"}`)
		p.reply(r, `{}`)
		theirs <- p.addsPort(2)
	}()
	if err := port.Remove(ctx); err != nil {
		t.Fatalf("remove: %v", err)
	}
	second, err := v.AddSerialPort(ctx)
	if err != nil || second.Name() != "vmshim.tty.2" {
		t.Fatalf("second port %v, %v", second, err)
	}
	(<-theirs).Close()
}

// TestSerialPortUndo: a port that cannot be added leaves nothing in QEMU
// as far as QEMU answers, and its host end is closed.
func TestSerialPortUndo(t *testing.T) {
	tests := []struct {
		name  string
		qemu  func(p *unixPeer) // QEMU's side after getfd
		wantE string
	}{
		{"chardev-add fails", func(p *unixPeer) {
			r, _ := p.expect("chardev-add", "")
			p.fail(r, "GenericError")
			r, _ = p.expect("closefd", `{"fdname": "tty1-fd"}`)
			p.reply(r, `{}`)
		}, "chardev-add"},
		{"device_add fails", func(p *unixPeer) {
			r, _ := p.expect("chardev-add", "")
			p.reply(r, `{}`)
			r, _ = p.expect("device_add", "")
			p.fail(r, "GenericError")
			r, _ = p.expect("device_del", `{"id": "tty1-port"}`)
			p.fail(r, "DeviceNotFound")
			r, _ = p.expect("chardev-remove", `{"id": "tty1"}`)
			p.reply(r, `{}`)
			r, _ = p.expect("closefd", `{"fdname": "tty1-fd"}`)
			p.fail(r, "GenericError")
		}, "device_add"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, p := portVM(t)
			done := make(chan struct{})
			go func() {
				defer close(done)
				r, fds := p.expect("getfd", "")
				for _, fd := range fds {
					unix.Close(fd)
				}
				p.reply(r, `{}`)
				tt.qemu(p)
			}()
			_, err := v.AddSerialPort(testCtx(t, 5*time.Second))
			if err == nil || !strings.Contains(err.Error(), tt.wantE) || !strings.Contains(err.Error(), "vmshim.tty.1") {
				t.Fatalf("error %v, want one naming %s and the port", err, tt.wantE)
			}
			<-done
			if n := len(v.ports.ports); n != 0 {
				t.Errorf("%d ports still in the table", n)
			}
		})
	}
}

// TestSerialPortGone: once QMP ends, ports are gone, Remove has nothing
// to do, and no port can be added.
func TestSerialPortGone(t *testing.T) {
	v, p := portVM(t)
	ctx := testCtx(t, 5*time.Second)
	go func() { p.addsPort(1).Close() }()
	port, err := v.AddSerialPort(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p.conn.Close()
	select {
	case <-port.Gone():
	case <-ctx.Done():
		t.Fatal("port not gone with QMP")
	}
	if err := port.Remove(ctx); err != nil {
		t.Errorf("remove after the vm went: %v", err)
	}
	if _, err := v.AddSerialPort(ctx); !errors.Is(err, ErrPortGone) {
		t.Errorf("add after the vm went: %v", err)
	}
}

// TestSerialPortRemoveDeadline: a device QEMU never reports deleted
// fails Remove at the caller's deadline; the chardev, still in use, is
// not removed.
func TestSerialPortRemoveDeadline(t *testing.T) {
	v, p := portVM(t)
	go func() { p.addsPort(1).Close() }()
	port, err := v.AddSerialPort(testCtx(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		r, _ := p.expect("device_del", "")
		p.reply(r, `{}`)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	err = port.Remove(ctx)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "not deleted") {
		t.Errorf("remove: %v", err)
	}
}

// TestSendFD: getfd carries exactly the fd given, usable by QEMU; calls
// that pass fds do not overlap; a connection that is not a unix socket
// cannot pass one.
func TestSendFD(t *testing.T) {
	c, p := connectUnix(t)
	ctx := testCtx(t, 5*time.Second)
	a, b := socketPair(t)
	f, err := b.File()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	errs := make(chan error, 2)
	for range 2 {
		go func() { errs <- c.SendFD(ctx, "x", f) }()
	}
	r, fds := p.expect("getfd", `{"fdname": "x"}`)
	if len(fds) != 1 {
		t.Fatalf("%d fds, want 1", len(fds))
	}
	got := os.NewFile(uintptr(fds[0]), "got")
	defer got.Close()
	if _, err := got.WriteString("ping"); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(a, buf); err != nil || string(buf) != "ping" {
		t.Errorf("through the passed fd: %q, %v", buf, err)
	}
	second := make(chan []int, 1)
	go func() {
		_, fds := p.recv()
		second <- fds
	}()
	select {
	case <-second:
		t.Fatal("a second getfd was sent before the first was answered")
	case <-time.After(100 * time.Millisecond):
	}
	p.reply(r, `{}`)
	fds = <-second
	for _, fd := range fds {
		unix.Close(fd)
	}
	if len(fds) != 1 {
		t.Errorf("second getfd: %d fds", len(fds))
	}
	p.reply(peerRequest{ID: json.RawMessage(`"3"`)}, `{}`)
	for range 2 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}

	pc, _ := connect(t)
	if err := pc.SendFD(ctx, "y", f); !errdefs.IsNotImplemented(err) {
		t.Errorf("fd over a pipe: %v", err)
	}
}

// TestSerialPortRealQEMU adds and removes a port on a real QEMU (paused,
// sandboxed): the fd reaches it through getfd, and removing the port
// closes QEMU's end.
func TestSerialPortRealQEMU(t *testing.T) {
	bin := qemuBinary(t)
	dir := t.TempDir()
	spec := testSpec(dir)
	spec.Paused, spec.Sandbox = true, true
	spec.AgentSocket = filepath.Join(dir, "agent.sock")
	ctx := testCtx(t, 30*time.Second)
	v, err := Launch(ctx, LaunchConfig{Binary: bin, Spec: spec, Stderr: os.Stderr})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		v.Kill()
		waitDone(t, v)
	}()
	port, err := v.AddSerialPort(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var devs []chardevInfo
	if err := v.QMP().Execute(ctx, "query-chardev", nil, &devs); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(fmt.Sprint(devs), "tty1") {
		t.Errorf("chardevs %+v, want tty1", devs)
	}
	if err := port.Remove(ctx); err != nil {
		t.Fatalf("remove: %v", err)
	}
	_ = port.Conn().SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := port.Conn().Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Errorf("read after remove: %d, %v; want EOF", n, err)
	}
	port.Conn().Close()
	second, err := v.AddSerialPort(ctx)
	if err != nil || second.Name() != "vmshim.tty.2" {
		t.Fatalf("second port: %v, %v", second, err)
	}
	v.Kill()
	waitDone(t, v)
	select {
	case <-second.Gone():
	case <-time.After(5 * time.Second):
		t.Error("port not gone with qemu")
	}
	second.Conn().Close()
}
