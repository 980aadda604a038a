package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

// qmpScript plays QEMU's side of a connection after the handshake: it
// answers each command with what reply returns, the "return" or "error"
// member of the reply ("" says nothing), and records the commands. It
// stops when the connection closes and never touches t, so it may
// outlive a failed test body.
type qmpScript struct {
	mu   sync.Mutex
	cmds []string // "execute arguments", in order
}

func scriptPeer(p *peer, reply func(peerRequest) string) *qmpScript {
	s := &qmpScript{}
	go func() {
		for {
			var r peerRequest
			if err := p.dec.Decode(&r); err != nil {
				return
			}
			s.mu.Lock()
			s.cmds = append(s.cmds, strings.TrimSpace(r.Execute+" "+string(r.Arguments)))
			s.mu.Unlock()
			if ans := reply(r); ans != "" {
				if _, err := fmt.Fprintf(p.conn, "{%s, \"id\": %s}\r\n", ans, r.ID); err != nil {
					return
				}
			}
		}
	}()
	return s
}

// commands returns the commands the script has read so far.
func (s *qmpScript) commands() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.cmds...)
}

// hotplugClient returns a client whose QEMU is reply, checking that
// nothing of the test outlives it.
func hotplugClient(t *testing.T, reply func(peerRequest) string) (*Client, *qmpScript) {
	t.Helper()
	t.Cleanup(noLeak(t)) // runs after the client and the pipe are closed
	c, p := connect(t)
	return c, scriptPeer(p, reply)
}

const okReply = `"return": {}`

func TestQueryCPUs(t *testing.T) {
	c, s := hotplugClient(t, func(peerRequest) string {
		return `"return": [
			{"cpu-index": 0, "thread-id": 4711, "qom-path": "/machine/unattached/device[0]", "target": "x86_64",
			 "props": {"socket-id": 0, "core-id": 0, "thread-id": 0}},
			{"cpu-index": 3, "thread-id": 4714, "qom-path": "/machine/peripheral/vcpu3", "target": "x86_64",
			 "props": {"socket-id": 0, "core-id": 3, "thread-id": 0}}]`
	})
	got, err := c.QueryCPUs(testCtx(t, time.Second))
	if err != nil {
		t.Fatal(err)
	}
	want := []CPUInfo{
		{Index: 0, ThreadID: 4711, QOMPath: "/machine/unattached/device[0]"},
		{Index: 3, ThreadID: 4714, QOMPath: "/machine/peripheral/vcpu3"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("QueryCPUs = %+v, want %+v", got, want)
	}
	if cmds := s.commands(); !reflect.DeepEqual(cmds, []string{"query-cpus-fast"}) {
		t.Errorf("QEMU got %q, want query-cpus-fast without arguments", cmds)
	}
}

func TestAddCPU(t *testing.T) {
	tests := []struct {
		name    string
		accel   Accel
		topo    Topology
		index   int
		reply   string
		wantReq string
		wantErr error
	}{
		{
			// Topology{2,2,2}, vcpu 5: socket 5/4 = 1, core (5/2)%2 = 0, thread 5%2 = 1.
			name: "tcg", accel: AccelTCG, topo: Topology{2, 2, 2}, index: 5, reply: okReply,
			wantReq: `device_add {"core-id":0,"driver":"max-x86_64-cpu","id":"vcpu5","socket-id":1,"thread-id":1}`,
		},
		{
			// Topology{2,3,2}, vcpu 9: socket 9/6 = 1, core (9/2)%3 = 1, thread 9%2 = 1.
			name: "kvm", accel: AccelKVM, topo: Topology{2, 3, 2}, index: 9, reply: okReply,
			wantReq: `device_add {"core-id":1,"driver":"host-x86_64-cpu","id":"vcpu9","socket-id":1,"thread-id":1}`,
		},
		{
			name: "one socket of cores", accel: AccelKVM, topo: Topology{1, 8, 1}, index: 7, reply: okReply,
			wantReq: `device_add {"core-id":7,"driver":"host-x86_64-cpu","id":"vcpu7","socket-id":0,"thread-id":0}`,
		},
		{
			name: "qemu refuses", accel: AccelTCG, topo: Topology{1, 4, 1}, index: 1,
			reply:   `"error": {"class": "GenericError", "desc": "CPU[1] with APIC ID 1 exists"}`,
			wantReq: `device_add {"core-id":1,"driver":"max-x86_64-cpu","id":"vcpu1","socket-id":0,"thread-id":0}`,
			wantErr: errdefs.ErrUnknown,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, s := hotplugClient(t, func(peerRequest) string { return tt.reply })
			err := c.AddCPU(testCtx(t, time.Second), tt.accel, tt.topo, tt.index)
			if tt.wantErr == nil && err != nil {
				t.Fatalf("AddCPU: %v", err)
			}
			if tt.wantErr != nil {
				var qerr *Error
				if !errors.As(err, &qerr) || !errors.Is(err, tt.wantErr) {
					t.Fatalf("AddCPU error = %v, want QEMU's error mapped to %v", err, tt.wantErr)
				}
			}
			if cmds := s.commands(); !reflect.DeepEqual(cmds, []string{tt.wantReq}) {
				t.Errorf("QEMU got %q, want %q", cmds, tt.wantReq)
			}
		})
	}
}

// cpuList is a query-cpus-fast reply listing the boot vCPU and the
// hot-plugged vCPUs named.
func cpuList(ids ...string) string {
	entries := []string{`{"cpu-index": 0, "thread-id": 100, "qom-path": "/machine/unattached/device[0]"}`}
	for i, id := range ids {
		entries = append(entries, fmt.Sprintf(`{"cpu-index": %d, "thread-id": %d, "qom-path": "/machine/peripheral/%s"}`, i+1, 101+i, id))
	}
	return `"return": [` + strings.Join(entries, ", ") + "]"
}

func TestDeleteCPU(t *testing.T) {
	const del = `device_del {"id":"vcpu3"}`
	tests := []struct {
		name     string
		del      string   // the reply to device_del
		polls    []string // the replies to query-cpus-fast, the last repeated
		timeout  time.Duration
		wantErr  error
		wantText string // in the error
		wantCmds []string
	}{
		{
			// vcpu30 and vcpu31 only share a prefix with the vCPU going.
			name: "released on the second poll", del: okReply,
			polls:    []string{cpuList("vcpu3", "vcpu31"), cpuList("vcpu30", "vcpu31")},
			timeout:  time.Second,
			wantCmds: []string{del, "query-cpus-fast", "query-cpus-fast"},
		},
		{
			name: "released at once", del: okReply, polls: []string{cpuList("vcpu1")}, timeout: time.Second,
			wantCmds: []string{del, "query-cpus-fast"},
		},
		{
			// A deadline between two polls (100 ms apart) ends the wait:
			// polls at 0, 100 and 200 ms.
			name: "never released", del: okReply, polls: []string{cpuList("vcpu3")}, timeout: 250 * time.Millisecond,
			wantErr: context.DeadlineExceeded, wantText: "vcpu 3: the guest has not released it",
		},
		{
			name:     "device_del fails",
			del:      `"error": {"class": "DeviceNotFound", "desc": "Device 'vcpu3' not found"}`,
			timeout:  time.Second,
			wantErr:  errdefs.ErrNotFound,
			wantText: "Device 'vcpu3' not found",
			wantCmds: []string{del},
		},
		{
			name: "query fails", del: okReply, timeout: time.Second,
			polls:    []string{`"error": {"class": "GenericError", "desc": "no cpus"}`},
			wantErr:  errdefs.ErrUnknown,
			wantText: "no cpus",
			wantCmds: []string{del, "query-cpus-fast"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var polls int // the script's
			c, s := hotplugClient(t, func(r peerRequest) string {
				if r.Execute == "device_del" {
					return tt.del
				}
				polls++
				return tt.polls[min(polls, len(tt.polls))-1]
			})
			start := time.Now()
			err := c.DeleteCPU(testCtx(t, tt.timeout), 3)
			elapsed := time.Since(start)
			switch {
			case tt.wantErr == nil && err != nil:
				t.Fatalf("DeleteCPU: %v", err)
			case tt.wantErr != nil && !errors.Is(err, tt.wantErr):
				t.Fatalf("DeleteCPU error = %v, want %v", err, tt.wantErr)
			case tt.wantErr != nil && !strings.Contains(err.Error(), tt.wantText):
				t.Errorf("DeleteCPU error %q does not say %q", err, tt.wantText)
			}
			cmds := s.commands()
			switch {
			case tt.wantCmds != nil && !reflect.DeepEqual(cmds, tt.wantCmds):
				t.Errorf("QEMU got %q, want %q", cmds, tt.wantCmds)
			case tt.wantCmds == nil && (len(cmds) < 3 || cmds[0] != del ||
				slices.ContainsFunc(cmds[1:], func(c string) bool { return c != "query-cpus-fast" })):
				t.Errorf("QEMU got %q, want %s and polls", cmds, del)
			}
			if want := time.Duration(len(cmds)-2) * cpuPoll; elapsed < want {
				t.Errorf("DeleteCPU polled %d times in %s: less than %s apart", len(cmds)-1, elapsed, cpuPoll)
			}
		})
	}
}

func TestVirtioMemSize(t *testing.T) {
	const (
		getSize      = `qom-get {"path":"/machine/peripheral/vmem0","property":"size"}`
		getRequested = `qom-get {"path":"/machine/peripheral/vmem0","property":"requested-size"}`
	)
	tests := []struct {
		name          string
		size, request string // the replies
		wantSize      int64
		wantRequested int64
		wantErr       error
		wantCmds      []string
	}{
		{
			name: "shrinking", size: `"return": 1073741824`, request: `"return": 536870912`,
			wantSize: 1 << 30, wantRequested: 512 << 20, wantCmds: []string{getSize, getRequested},
		},
		{
			name: "nothing plugged", size: `"return": 0`, request: `"return": 0`, wantCmds: []string{getSize, getRequested},
		},
		{
			name:     "no virtio-mem device",
			size:     `"error": {"class": "DeviceNotFound", "desc": "Device '/machine/peripheral/vmem0' not found"}`,
			wantErr:  errdefs.ErrNotFound,
			wantCmds: []string{getSize},
		},
		{
			name: "requested-size fails", size: `"return": 4096`,
			request:  `"error": {"class": "GenericError", "desc": "Property 'virtio-mem-pci.requested-size' not found"}`,
			wantErr:  errdefs.ErrUnknown,
			wantCmds: []string{getSize, getRequested},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, s := hotplugClient(t, func(r peerRequest) string {
				if strings.Contains(string(r.Arguments), `"requested-size"`) {
					return tt.request
				}
				return tt.size
			})
			size, requested, err := c.VirtioMemSize(testCtx(t, time.Second))
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("VirtioMemSize error = %v, want %v", err, tt.wantErr)
			}
			if size != tt.wantSize || requested != tt.wantRequested {
				t.Errorf("VirtioMemSize = %d, %d; want %d, %d", size, requested, tt.wantSize, tt.wantRequested)
			}
			if cmds := s.commands(); !reflect.DeepEqual(cmds, tt.wantCmds) {
				t.Errorf("QEMU got %q, want %q", cmds, tt.wantCmds)
			}
		})
	}
}

// virtioMem is a virtio-mem device whose guest plugs or unplugs step
// bytes towards the requested size each time its size is read (step 0:
// a guest that does not move). Only its script's goroutine touches it.
type virtioMem struct {
	size, requested, step int64
	setErr                string // when set, the reply to qom-set
}

func (m *virtioMem) reply(r peerRequest) string {
	args := string(r.Arguments)
	switch {
	case r.Execute == "qom-set" && m.setErr != "":
		return m.setErr
	case r.Execute == "qom-set":
		var v struct{ Value int64 }
		if err := json.Unmarshal(r.Arguments, &v); err != nil {
			return `"error": {"class": "GenericError", "desc": "bad value"}`
		}
		m.requested = v.Value
		return okReply
	case r.Execute == "qom-get" && strings.Contains(args, `"requested-size"`):
		return fmt.Sprintf(`"return": %d`, m.requested)
	case r.Execute == "qom-get" && strings.Contains(args, `"size"`):
		size := m.size
		switch {
		case m.size < m.requested:
			m.size = min(m.size+m.step, m.requested)
		case m.size > m.requested:
			m.size = max(m.size-m.step, m.requested)
		}
		return fmt.Sprintf(`"return": %d`, size)
	}
	return `"error": {"class": "CommandNotFound", "desc": "unexpected command"}`
}

// vmemCmd is the command that reads or sets property of the virtio-mem
// device, setting it to value when value >= 0.
func vmemCmd(property string, value int64) string {
	if value < 0 {
		return `qom-get {"path":"/machine/peripheral/vmem0","property":"` + property + `"}`
	}
	return fmt.Sprintf(`qom-set {"path":"/machine/peripheral/vmem0","property":"%s","value":%d}`, property, value)
}

// vmemSets returns the qom-set commands among cmds.
func vmemSets(cmds []string) []string {
	var sets []string
	for _, c := range cmds {
		if strings.HasPrefix(c, "qom-set ") {
			sets = append(sets, c)
		}
	}
	return sets
}

func TestResizeVirtioMem(t *testing.T) {
	var (
		get   = []string{vmemCmd("size", -1), vmemCmd("requested-size", -1)} // one VirtioMemSize
		polls = func(n int) []string { return slices.Repeat(get, n) }
		set   = func(v int64) string { return vmemCmd("requested-size", v) }
	)
	tests := []struct {
		name     string
		mem      virtioMem
		request  int64
		timeout  time.Duration
		wantErr  error
		wantText []string // in the error
		wantSets []string // the qom-set commands, in order
		wantCmds []string // nil: not checked
	}{
		{
			// 256 MiB to 1 GiB in 256 MiB steps: reached on the fourth poll.
			name: "grows", mem: virtioMem{size: 256 << 20, requested: 256 << 20, step: 256 << 20},
			request: 1 << 30, timeout: 1500 * time.Millisecond, wantSets: []string{set(1 << 30)},
			wantCmds: slices.Concat(get, []string{set(1 << 30)}, polls(4)),
		},
		{
			name: "shrinks", mem: virtioMem{size: 1 << 30, requested: 1 << 30, step: 512 << 20},
			request: 256 << 20, timeout: 1500 * time.Millisecond, wantSets: []string{set(256 << 20)},
			wantCmds: slices.Concat(get, []string{set(256 << 20)}, polls(3)),
		},
		{
			name: "already there", mem: virtioMem{size: 1 << 30, requested: 1 << 30},
			request: 1 << 30, timeout: time.Second, wantSets: []string{set(1 << 30)},
			wantCmds: slices.Concat(get, []string{set(1 << 30)}),
		},
		{
			// The guest keeps 512 MiB of 256 MiB; the deadline falls between
			// two polls (100 ms apart).
			name: "guest holds on", mem: virtioMem{size: 512 << 20, requested: 512 << 20},
			request: 256 << 20, timeout: 250 * time.Millisecond, wantErr: context.DeadlineExceeded,
			wantText: []string{"guest holds 512 MiB of 256 MiB asked", "set back to 512 MiB"},
			wantSets: []string{set(256 << 20), set(512 << 20)},
		},
		{
			name: "qom-set fails",
			mem: virtioMem{size: 512 << 20, requested: 512 << 20,
				setErr: `"error": {"class": "GenericError", "desc": "virtio-mem device cannot get unplugged"}`},
			request: 1 << 30, timeout: time.Second, wantErr: errdefs.ErrUnknown,
			wantText: []string{"cannot get unplugged"},
			wantSets: []string{set(1 << 30)},
			wantCmds: slices.Concat(get, []string{set(1 << 30)}),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mem := tt.mem
			c, s := hotplugClient(t, mem.reply)
			start := time.Now()
			err := c.ResizeVirtioMem(testCtx(t, tt.timeout), tt.request)
			elapsed := time.Since(start)
			switch {
			case tt.wantErr == nil && err != nil:
				t.Fatalf("ResizeVirtioMem: %v", err)
			case tt.wantErr != nil && !errors.Is(err, tt.wantErr):
				t.Fatalf("ResizeVirtioMem error = %v, want %v", err, tt.wantErr)
			}
			for _, want := range tt.wantText {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("ResizeVirtioMem error %q does not say %q", err, want)
				}
			}
			cmds := s.commands()
			if sets := vmemSets(cmds); !reflect.DeepEqual(sets, tt.wantSets) {
				t.Errorf("QEMU got the sets %q, want %q", sets, tt.wantSets)
			}
			if tt.wantCmds != nil && !reflect.DeepEqual(cmds, tt.wantCmds) {
				t.Errorf("QEMU got %q, want %q", cmds, tt.wantCmds)
			}
			if tt.wantErr != nil && tt.wantErr != context.DeadlineExceeded && elapsed >= virtioMemPoll {
				t.Errorf("failing took %s: ResizeVirtioMem waited", elapsed)
			}
		})
	}
}

// TestResizeVirtioMemPollCut: a deadline that cuts a poll short is a
// deadline like any other: the guest holds what the last poll found (256
// MiB here) and the request is set back.
func TestResizeVirtioMemPollCut(t *testing.T) {
	for _, request := range []int64{0, 512 << 20} {
		t.Run(fmt.Sprint(request>>20, "MiB"), func(t *testing.T) {
			var sets int // the script's
			c, s := hotplugClient(t, func(r peerRequest) string {
				switch {
				case r.Execute == "qom-set":
					sets++
					return okReply
				case sets == 1:
					return "" // the first poll is never answered
				default:
					return fmt.Sprintf(`"return": %d`, 256<<20)
				}
			})
			err := c.ResizeVirtioMem(testCtx(t, 300*time.Millisecond), request)
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("ResizeVirtioMem cut short = %v, want deadline exceeded", err)
			}
			if want := "guest holds 256 MiB"; !strings.Contains(err.Error(), want) {
				t.Errorf("ResizeVirtioMem error %q does not say %q", err, want)
			}
			want := []string{vmemCmd("requested-size", request), vmemCmd("requested-size", 256<<20)}
			if got := vmemSets(s.commands()); !reflect.DeepEqual(got, want) {
				t.Errorf("QEMU got the sets %q, want %q (the request set back)", got, want)
			}
		})
	}
}
