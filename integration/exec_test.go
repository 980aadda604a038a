package integration

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/client-go/transport/spdy"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// markerAgent is printed by the agent guest once qemu-ga runs.
const markerAgent = "VMSHIM-AGENT-STARTED"

// execSync runs a command in the container through the CRI, as exec
// probes and `kubectl exec` without a stream do.
func (c *criContainer) execSync(ctx context.Context, t *testing.T, timeout int64, cmd ...string) (*runtimeapi.ExecSyncResponse, error) {
	t.Helper()
	return c.p.c.runtime.ExecSync(ctx, &runtimeapi.ExecSyncRequest{ContainerId: c.id, Cmd: cmd, Timeout: timeout})
}

// mustExec runs a command that must succeed and returns its stdout.
func (c *criContainer) mustExec(ctx context.Context, t *testing.T, cmd ...string) string {
	t.Helper()
	r, err := c.execSync(ctx, t, 60, cmd...)
	if err != nil {
		t.Fatalf("exec %q: %v", cmd, err)
	}
	if r.ExitCode != 0 {
		t.Fatalf("exec %q: exit %d, stderr %q", cmd, r.ExitCode, r.Stderr)
	}
	return string(r.Stdout)
}

// runAgentVM runs a pod whose VM runs qemu-guest-agent and waits for it.
func runAgentVM(ctx context.Context, t *testing.T, name string) (*pod, *criContainer) {
	t.Helper()
	p := newCRI(t, env.daemon).runPod(ctx, t, name)
	vm := p.startVM(ctx, t, imageKernelAgent, nil)
	vm.waitLog(ctx, t, markerAgent)
	vm.waitLog(ctx, t, markerBooted)
	return p, vm
}

// TestCRIExecSync runs commands in the guest through its agent: output
// and exit codes come back, a timeout is reported as one, and the agent
// still serves the next exec.
func TestCRIExecSync(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*bootTimeout)
	defer cancel()
	p, vm := runAgentVM(ctx, t, "execsync")

	if out := vm.mustExec(ctx, t, "cat", "/proc/cpuinfo"); !strings.Contains(out, "processor") {
		t.Errorf("cat /proc/cpuinfo: %q", out)
	}
	r, err := vm.execSync(ctx, t, 60, "sh", "-c", "echo to-stdout; echo to-stderr >&2; exit 3")
	if err != nil {
		t.Fatalf("exec exit 3: %v", err)
	}
	if r.ExitCode != 3 || string(r.Stdout) != "to-stdout\n" || string(r.Stderr) != "to-stderr\n" {
		t.Errorf("exec exit 3: code %d stdout %q stderr %q", r.ExitCode, r.Stdout, r.Stderr)
	}
	if r, err := vm.execSync(ctx, t, 60, "/no/such/program"); err == nil && r.ExitCode == 0 {
		t.Errorf("a missing program succeeded: %+v", r)
	}

	start := time.Now()
	_, err = vm.execSync(ctx, t, 2, "sleep", "600")
	if err == nil || !strings.Contains(err.Error(), "timeout") {
		t.Errorf("exec past its timeout: %v, want a timeout error", err)
	}
	t.Logf("exec with a 2 s timeout returned after %v: %v", time.Since(start).Round(time.Millisecond), err)
	if ps := vm.mustExec(ctx, t, "ps"); strings.Contains(ps, "sleep 600") {
		t.Errorf("the timed-out program still runs in the guest:\n%s", ps)
	}
	if out := vm.mustExec(ctx, t, "echo", "still-here"); out != "still-here\n" {
		t.Errorf("exec after a timeout: %q", out)
	}
	p.remove(t)
	assertNothingLeftCRI(t, vm.id)
}

// TestCRIExecStream runs a non-interactive streaming exec (`kubectl exec`
// without -t) with stdin (TestExecTTYCRI runs one with -t).
func TestCRIExecStream(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*bootTimeout)
	defer cancel()
	p, vm := runAgentVM(ctx, t, "execstream")

	resp, err := p.c.runtime.Exec(ctx, &runtimeapi.ExecRequest{
		ContainerId: vm.id, Cmd: []string{"sh", "-c", "tr a-z A-Z; echo done >&2; exit 5"}, Stdin: true, Stdout: true, Stderr: true,
	})
	if err != nil {
		t.Fatalf("Exec: %v", err)
	}
	var stdout, stderr bytes.Buffer
	err = streamExec(ctx, resp.Url, remotecommand.StreamOptions{Stdin: strings.NewReader("hello from stdin\n"), Stdout: &stdout, Stderr: &stderr})
	if err == nil || !strings.Contains(err.Error(), "exit code 5") {
		t.Errorf("stream exec: %v, want exit code 5", err)
	}
	if stdout.String() != "HELLO FROM STDIN\n" || stderr.String() != "done\n" {
		t.Errorf("stream exec: stdout %q stderr %q", stdout.String(), stderr.String())
	}
	p.remove(t)
}

// streamExec runs an exec stream from the CRI stream server, which listens
// in the daemon's network namespace.
func streamExec(ctx context.Context, rawURL string, opts remotecommand.StreamOptions) error {
	u, err := url.Parse(rawURL)
	if err != nil {
		return err
	}
	return inNetns("/run/netns/"+env.daemon.netns, func() error {
		exec, err := remotecommand.NewSPDYExecutor(&rest.Config{}, "POST", u)
		if err != nil {
			return err
		}
		return exec.StreamWithContext(ctx, opts)
	})
}

// TestCRIExecNoAgent: exec into a guest without an agent fails at once
// with an error that names the missing agent.
func TestCRIExecNoAgent(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*bootTimeout)
	defer cancel()
	p, vm := runLeasedVM(ctx, t, "noagent")
	start := time.Now()
	_, err := vm.execSync(ctx, t, 60, "true")
	if err == nil || !strings.Contains(err.Error(), "no guest agent") || strings.Contains(err.Error(), "timeout") {
		t.Fatalf("exec without an agent: %v, want the missing agent named", err)
	}
	t.Logf("exec without an agent failed after %v: %v", time.Since(start).Round(time.Millisecond), err)
	p.remove(t)
}

// TestCRIPortForward forwards a port of the pod, as `kubectl port-forward`
// does, to the HTTP server in the guest.
func TestCRIPortForward(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*bootTimeout)
	defer cancel()
	p, vm := runLeasedVM(ctx, t, "portfwd")
	vm.waitLog(ctx, t, "VMSHIM-HTTP-READY")
	ip := p.ip(ctx, t)
	for i := range 2 {
		body := p.portForward(ctx, t, 8080, "GET / HTTP/1.0\r\n\r\n")
		if !strings.Contains(body, "VMSHIM-HTTP-OK portfwd "+ip) {
			t.Fatalf("port-forward %d to the guest's :8080: %q", i, body)
		}
	}
	p.remove(t)
	assertNothingLeftCRI(t, vm.id)
}

// portForward sends request to port of the pod through the CRI's
// port-forward stream and returns all that comes back.
func (p *pod) portForward(ctx context.Context, t *testing.T, port int32, request string) string {
	t.Helper()
	conn, errStream, data, err := p.openForward(ctx, int(port))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(data, request); err != nil {
		t.Fatalf("port-forward write: %v", err)
	}
	got := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(data)
		got <- b
	}()
	errs := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(errStream)
		errs <- b
	}()
	select {
	case b := <-got:
		select {
		case e := <-errs:
			if len(e) > 0 {
				t.Errorf("port-forward error stream: %s", e)
			}
		case <-time.After(time.Second):
		}
		return string(b)
	case <-ctx.Done():
		t.Fatalf("port-forward: no answer")
	}
	return ""
}

// openForward opens a CRI port-forward stream to port of the pod, as the
// kubelet's streaming server would for kubectl port-forward: the
// connection, its error stream (write side closed) and its data stream.
func (p *pod) openForward(ctx context.Context, port int) (httpstream.Connection, httpstream.Stream, httpstream.Stream, error) {
	resp, err := p.c.runtime.PortForward(ctx, &runtimeapi.PortForwardRequest{PodSandboxId: p.id, Port: []int32{int32(port)}})
	if err != nil {
		return nil, nil, nil, fmt.Errorf("PortForward: %w", err)
	}
	u, err := url.Parse(resp.Url)
	if err != nil {
		return nil, nil, nil, err
	}
	var conn httpstream.Connection
	err = inNetns("/run/netns/"+p.c.d.netns, func() error {
		tr, upgrader, err := spdy.RoundTripperFor(&rest.Config{})
		if err != nil {
			return err
		}
		conn, _, err = spdy.NewDialer(upgrader, &http.Client{Transport: tr}, "POST", u).Dial(portforward.PortForwardProtocolV1Name)
		return err
	})
	if err != nil {
		return nil, nil, nil, fmt.Errorf("port-forward stream: %w", err)
	}
	h := http.Header{}
	h.Set(corev1.StreamType, corev1.StreamTypeError)
	h.Set(corev1.PortHeader, strconv.Itoa(port))
	h.Set(corev1.PortForwardRequestIDHeader, "0")
	errStream, err := conn.CreateStream(h)
	if err != nil {
		conn.Close()
		return nil, nil, nil, fmt.Errorf("error stream: %w", err)
	}
	errStream.Close()
	h.Set(corev1.StreamType, corev1.StreamTypeData)
	data, err := conn.CreateStream(h)
	if err != nil {
		conn.Close()
		return nil, nil, nil, fmt.Errorf("data stream: %w", err)
	}
	return conn, errStream, data, nil
}
