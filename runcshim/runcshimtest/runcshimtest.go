// Package runcshimtest gives tests a fake of containerd's runc shim: the
// test binary plays its start and delete actions (Main, Setup), and a
// task service served on a unix socket records what it is asked (Serve).
package runcshimtest

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/containerd/ttrpc"
	"github.com/containerd/typeurl/v2"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	bootapi "github.com/containerd/containerd/api/runtime/bootstrap/v1"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/api/types/runc/options"
)

// A test binary plays containerd's runc shim when ModeEnv names how (see
// Main): it answers the start action with the address in AddrEnv
// (writing the bootstrap parameters it got to ParamsEnv, and its
// arguments, as JSON, to ParamsEnv+".args"), and the delete action with
// a DeleteResponse.
const (
	ModeEnv   = "RUNCSHIM_FAKE"
	AddrEnv   = "RUNCSHIM_FAKE_ADDR"
	ParamsEnv = "RUNCSHIM_FAKE_PARAMS"
)

// Main is the TestMain of a package whose tests run the test binary as
// the runc shim: it plays the shim when ModeEnv is set ("ok"; "fail":
// exit 1 with a message; "garbage": an unreadable answer), and runs the
// tests otherwise.
func Main(m *testing.M) {
	if mode := os.Getenv(ModeEnv); mode != "" {
		os.Exit(play(mode, os.Args[1:]))
	}
	os.Exit(m.Run())
}

// play is the runc shim the test binary plays.
func play(mode string, args []string) int {
	action := args[len(args)-1]
	switch {
	case mode == "fail":
		os.Stderr.WriteString("some warning\nruntime exploded\n")
		return 1
	case mode == "garbage":
		os.Stdout.WriteString("not a bootstrap result")
		return 0
	case action == "start":
		in, _ := readAll(os.Stdin)
		_ = os.WriteFile(os.Getenv(ParamsEnv), in, 0o600)
		b, _ := json.Marshal(args)
		_ = os.WriteFile(os.Getenv(ParamsEnv)+".args", b, 0o600)
		out, _ := proto.Marshal(&bootapi.BootstrapResult{Version: 3, Protocol: "ttrpc", Address: os.Getenv(AddrEnv)})
		os.Stdout.Write(out)
		return 0
	case action == "delete":
		out, _ := proto.Marshal(&taskAPI.DeleteResponse{Pid: 42, ExitStatus: 137, ExitedAt: timestamppb.Now()})
		os.Stdout.Write(out)
		return 0
	}
	return 2
}

func readAll(f *os.File) ([]byte, error) {
	var b []byte
	buf := make([]byte, 4096)
	for {
		n, err := f.Read(buf)
		b = append(b, buf[:n]...)
		if err != nil {
			return b, nil
		}
	}
}

// Tasks is the runc shim's task service, as far as the tests call it: it
// records the calls it gets.
type Tasks struct {
	taskAPI.TTRPCTaskService // unimplemented calls panic

	mu    sync.Mutex
	calls []string
	opts  *options.Options // of the last Create
	srv   *ttrpc.Server
}

// Stop stops serving and closes every connection, as a runc shim that
// dies does.
func (f *Tasks) Stop() { _ = f.srv.Close() }

// Options are the runc options of the last Create.
func (f *Tasks) Options() *options.Options {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.opts
}

func (f *Tasks) note(call string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, call)
}

// Calls lists the calls so far, oldest first ("create ID", "kill ID",
// "wait ID", "delete ID", "state ID", "shutdown").
func (f *Tasks) Calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

func (f *Tasks) Create(_ context.Context, r *taskAPI.CreateTaskRequest) (*taskAPI.CreateTaskResponse, error) {
	f.note("create " + r.ID)
	v, err := typeurl.UnmarshalAny(r.Options)
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	f.opts = v.(*options.Options)
	f.mu.Unlock()
	return &taskAPI.CreateTaskResponse{Pid: 99}, nil
}

func (f *Tasks) Kill(_ context.Context, r *taskAPI.KillRequest) (*emptypb.Empty, error) {
	f.note("kill " + r.ID)
	return &emptypb.Empty{}, nil
}

func (f *Tasks) Wait(_ context.Context, r *taskAPI.WaitRequest) (*taskAPI.WaitResponse, error) {
	f.note("wait " + r.ID)
	return &taskAPI.WaitResponse{ExitStatus: 137}, nil
}

func (f *Tasks) Delete(_ context.Context, r *taskAPI.DeleteRequest) (*taskAPI.DeleteResponse, error) {
	f.note("delete " + r.ID)
	return &taskAPI.DeleteResponse{Pid: 7, ExitStatus: 137, ExitedAt: timestamppb.Now()}, nil
}

func (f *Tasks) Shutdown(context.Context, *taskAPI.ShutdownRequest) (*emptypb.Empty, error) {
	f.note("shutdown")
	return &emptypb.Empty{}, nil
}

// Serve serves a Tasks on a unix socket until the test ends and returns
// it with its address.
func Serve(t *testing.T) (*Tasks, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "s")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := ttrpc.NewServer()
	if err != nil {
		t.Fatal(err)
	}
	f := &Tasks{srv: srv}
	taskAPI.RegisterTTRPCTaskService(srv, f)
	go func() { _ = srv.Serve(context.Background(), l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return f, "unix://" + path
}

// State reports a running container.
func (f *Tasks) State(_ context.Context, r *taskAPI.StateRequest) (*taskAPI.StateResponse, error) {
	f.note("state " + r.ID)
	return &taskAPI.StateResponse{ID: r.ID, Pid: 99}, nil
}

// Setup makes the test binary the runc shim of the test, playing mode
// and answering with addr, and returns the binary and the file its start
// action writes the bootstrap parameters to.
func Setup(t *testing.T, mode, addr string) (binary, params string) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	params = filepath.Join(t.TempDir(), "params")
	t.Setenv(ModeEnv, mode)
	t.Setenv(AddrEnv, addr)
	t.Setenv(ParamsEnv, params)
	return self, params
}
