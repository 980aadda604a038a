package qemu

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

func TestAgentSetOnlineVCPUs(t *testing.T) {
	// Logical CPU 0 online and pinned, 1 offline, 2 online.
	const mixed = `{"return": [{"logical-id": 0, "online": true, "can-offline": false},
		{"logical-id": 1, "online": false, "can-offline": true},
		{"logical-id": 2, "online": true, "can-offline": true}]}`
	const (
		get      = "guest-get-vcpus "
		swap     = `guest-set-vcpus {"vcpus":[{"logical-id":1,"online":true},{"logical-id":2,"online":false}]}`
		agentErr = `{"error": {"class": "GenericError", "desc": "Guest agent command failed"}}`
	)
	tests := []struct {
		name     string
		vcpus    string // the reply to guest-get-vcpus
		n        int
		set      string // the reply to guest-set-vcpus
		want     int
		wantErr  error
		wantText string // in the error
		wantCmds []string
	}{
		{
			name: "one on, one off", vcpus: mixed, n: 2, set: `{"return": 2}`, want: 2,
			wantCmds: []string{get, swap},
		},
		{
			name: "only the first done", vcpus: mixed, n: 2, set: `{"return": 1}`, want: 3,
			wantErr: errdefs.ErrFailedPrecondition, wantText: "logical cpu 2 stays online",
			wantCmds: []string{get, swap},
		},
		{
			name: "none done", vcpus: mixed, n: 2, set: `{"return": 0}`, want: 2,
			wantErr: errdefs.ErrFailedPrecondition, wantText: "logical cpu 1 stays offline",
			wantCmds: []string{get, swap},
		},
		{
			name: "grow", vcpus: mixed, n: 3, set: `{"return": 1}`, want: 3,
			wantCmds: []string{get, `guest-set-vcpus {"vcpus":[{"logical-id":1,"online":true}]}`},
		},
		{
			name: "more than listed", vcpus: mixed, n: 8, set: `{"return": 1}`, want: 3,
			wantCmds: []string{get, `guest-set-vcpus {"vcpus":[{"logical-id":1,"online":true}]}`},
		},
		{
			// CPU 0 cannot go offline: it is never asked to.
			name: "pinned cpu stays", vcpus: mixed, n: 0, set: `{"return": 1}`, want: 1,
			wantCmds: []string{get, `guest-set-vcpus {"vcpus":[{"logical-id":2,"online":false}]}`},
		},
		{
			name: "nothing to change", n: 2, want: 2,
			vcpus: `{"return": [{"logical-id": 0, "online": true}, {"logical-id": 1, "online": true, "can-offline": true},
				{"logical-id": 2, "online": false, "can-offline": true}]}`,
			wantCmds: []string{get},
		},
		{
			name: "only pinned cpus to change", n: 1, want: 2,
			vcpus:    `{"return": [{"logical-id": 0, "online": true}, {"logical-id": 1, "online": true, "can-offline": false}]}`,
			wantCmds: []string{get},
		},
		{
			name: "guest-get-vcpus fails", vcpus: agentErr, n: 2, want: 0,
			wantErr: errdefs.ErrUnknown, wantText: "guest-get-vcpus", wantCmds: []string{get},
		},
		{
			name: "guest-set-vcpus fails", vcpus: mixed, n: 2, set: agentErr, want: 0,
			wantErr: errdefs.ErrUnknown, wantText: "guest-set-vcpus", wantCmds: []string{get, swap},
		},
		{
			// A guest's nonsense count is not a crash of the shim.
			name: "negative count", vcpus: mixed, n: 2, set: `{"return": -1}`, want: 2,
			wantErr: errdefs.ErrFailedPrecondition, wantText: "logical cpu 1 stays offline",
			wantCmds: []string{get, swap},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Cleanup(noLeak(t)) // runs after the fake agent's cleanup
			f := newFakeAgent(t, func(r fakeRequest) string {
				if r.Execute == "guest-get-vcpus" {
					return tt.vcpus
				}
				return tt.set
			})
			a := NewAgent(f.path, nil)
			defer a.Close()
			got, err := a.SetOnlineVCPUs(testCtx(t, time.Second), tt.n)
			switch {
			case tt.wantErr == nil && err != nil:
				t.Fatalf("SetOnlineVCPUs: %v", err)
			case tt.wantErr != nil && !errors.Is(err, tt.wantErr):
				t.Fatalf("SetOnlineVCPUs error = %v, want %v", err, tt.wantErr)
			case tt.wantErr != nil && !strings.Contains(err.Error(), tt.wantText):
				t.Errorf("SetOnlineVCPUs error %q does not say %q", err, tt.wantText)
			}
			if got != tt.want {
				t.Errorf("SetOnlineVCPUs = %d online, want %d", got, tt.want)
			}
			if _, cmds := f.stats(); !reflect.DeepEqual(cmds, tt.wantCmds) {
				t.Errorf("agent got %q, want %q", cmds, tt.wantCmds)
			}
		})
	}
}
