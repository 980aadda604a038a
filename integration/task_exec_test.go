package integration

import (
	"bytes"
	"context"
	"strings"
	"testing"

	cgroup1stats "github.com/containerd/cgroups/v3/cgroup1/stats"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// TestTaskExecAndMetrics runs a command in a VM through containerd's task
// API, as `ctr task exec` does, and reads the task's metrics, as `ctr task
// metrics` does.
func TestTaskExecAndMetrics(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*bootTimeout)
	defer cancel()
	v := startVM(ctx, t, imageKernelAgent)
	v.console.waitFor(ctx, t, markerAgent)
	v.console.waitFor(ctx, t, markerBooted)

	var stdout, stderr bytes.Buffer
	proc, statusC := execProcess(ctx, t, v, "e1", &specs.Process{Args: []string{"sh", "-c", "uname -s; echo oops >&2; exit 4"}, Cwd: "/"},
		cio.NewCreator(cio.WithStreams(nil, &stdout, &stderr)))
	st := <-statusC
	proc.IO().Wait()
	if code, _, err := st.Result(); err != nil || code != 4 {
		t.Errorf("exec exit: %d, %v; want 4", code, err)
	}
	if _, err := proc.Delete(ctx); err != nil {
		t.Errorf("exec delete: %v", err)
	}
	if stdout.String() != "Linux\n" || stderr.String() != "oops\n" {
		t.Errorf("exec output: stdout %q stderr %q", stdout.String(), stderr.String())
	}

	m, err := v.task.Metrics(ctx)
	if err != nil {
		t.Fatalf("metrics: %v", err)
	}
	data, err := typeurl.UnmarshalAny(m.Data)
	if err != nil {
		t.Fatalf("metrics data: %v", err)
	}
	cg, ok := data.(*cgroup1stats.Metrics)
	if !ok {
		t.Fatalf("metrics are %T, want cgroup v1 metrics on this host", data)
	}
	if cg.GetCPU().GetUsage().GetTotal() == 0 || cg.GetMemory().GetUsage().GetUsage() == 0 {
		t.Errorf("metrics: cpu %v memory %v", cg.GetCPU().GetUsage(), cg.GetMemory().GetUsage())
	}
	if !strings.HasSuffix(m.Data.GetTypeUrl(), "Metrics") {
		t.Errorf("metrics type %s", m.Data.GetTypeUrl())
	}
	v.remove(t)
	assertNothingLeft(ctx, t, v.id)
}
