package shim

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	apitask "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/runtime"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/protobuf"
	"github.com/containerd/containerd/v2/pkg/shim"
	"github.com/containerd/containerd/v2/pkg/shutdown"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/log"
	"github.com/containerd/ttrpc"
	"github.com/containerd/typeurl/v2"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/vmshim/vmshim/cgroup"
	"github.com/vmshim/vmshim/launch"
	"github.com/vmshim/vmshim/runcshim"
)

var _ shim.TTRPCService = (*service)(nil)

// publishTimeout bounds how long shutdown waits for queued events to be
// published.
const publishTimeout = 5 * time.Second

// service is the ttrpc task service: each RPC finds the task, calls it,
// and maps the error once.
type service struct {
	ctx      context.Context
	launcher launch.Launcher
	shutdown shutdown.Service

	evMu     sync.Mutex // guards queue and evClosed; a leaf: nothing else is locked under it
	evCond   *sync.Cond // on evMu; signalled when queue grows or is closed
	queue    []any      // events not yet handed to the publisher, oldest first
	evClosed bool
	drained  chan struct{} // closed once every queued event has been handed to the publisher

	mu       sync.Mutex // guards tasks and creating
	tasks    map[string]*task
	creating map[string]bool // ids whose Create is under way

	cgroup    string    // the cgroup of its own the shim runs in, inside its pod's; "" for none
	leaveOnce sync.Once // leaves and removes cgroup

	ordinary *ordinaryTasks // the pod's containers whose image holds no VM, run by containerd's runc shim
}

// NewTaskService returns the task service; it publishes events until the
// shim shuts down.
func NewTaskService(ctx context.Context, publisher shim.Publisher, sd shutdown.Service, l launch.Launcher, rc runcshim.Config) (taskAPI.TTRPCTaskService, error) {
	s := &service{
		ordinary: newOrdinaryTasks(rc),
		ctx:      ctx,
		launcher: l,
		shutdown: sd,
		tasks:    make(map[string]*task),
		creating: make(map[string]bool),
		drained:  make(chan struct{}),
	}
	s.evCond = sync.NewCond(&s.evMu)
	go s.forward(ctx, publisher)
	s.reportGuestMemoryOnSignal(ctx)
	sd.RegisterCallback(s.closeEvents)
	// The start action put the shim of a CRI pod in a cgroup of its own,
	// inside the pod's, and named it in the bundle (the working
	// directory), which containerd may remove before the shim ends.
	if raw, err := cgroup.ReadShim("."); err != nil {
		log.G(ctx).WithError(err).Warn("the shim's cgroup is not removed at shutdown")
	} else if raw != "" {
		s.cgroup = raw
		sd.RegisterCallback(func(context.Context) error { s.leaveCgroup(); return nil })
	}
	if address, err := shim.ReadAddress("address"); err == nil {
		sd.RegisterCallback(func(context.Context) error { return shim.RemoveSocket(address) })
	}
	return s, nil
}

// RegisterTTRPC registers the service with the shim's ttrpc server.
func (s *service) RegisterTTRPC(server *ttrpc.Server) error {
	taskAPI.RegisterTTRPCTaskService(server, s)
	return nil
}

// Create creates a VM with its vCPUs stopped.
func (s *service) Create(ctx context.Context, r *taskAPI.CreateTaskRequest) (*taskAPI.CreateTaskResponse, error) {
	s.mu.Lock()
	_, exists := s.tasks[r.ID]
	if exists || s.creating[r.ID] {
		s.mu.Unlock()
		return nil, errgrpc.ToGRPCf(errdefs.ErrAlreadyExists, "task %s", r.ID)
	}
	s.creating[r.ID] = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.creating, r.ID)
		s.mu.Unlock()
	}()
	req := &launch.Request{ID: r.ID, Bundle: r.Bundle, Rootfs: mount.FromProto(r.Rootfs), Checkpoint: r.Checkpoint}
	if r.Options != nil {
		req.Options = r.Options
	}
	begin := time.Now()
	class, err := s.launcher.Classify(ctx, req)
	launch.Span(log.G(ctx).WithField("id", r.ID), "classify", begin)
	if err != nil {
		return nil, toGRPC(createError(err))
	}
	if !class.VM {
		if err := s.refuseVMTarget(r.ID, r.Bundle); err != nil {
			return nil, toGRPC(err)
		}
		resp, err := s.ordinary.create(ctx, r, class)
		if err != nil {
			return nil, toGRPC(createError(err))
		}
		return resp, nil
	}
	io := stdio{stdin: r.Stdin, stdout: r.Stdout, stderr: r.Stderr, terminal: r.Terminal}
	ns, _ := namespaces.Namespace(ctx)
	out, err := openOutput(ctx, r.ID, ns, io)
	if err != nil {
		return nil, toGRPC(createError(fmt.Errorf("task %s output: %w", r.ID, err)))
	}
	req.Log = out.line
	vm, err := s.launcher.Launch(ctx, req)
	if err != nil {
		if cerr := out.Close(); cerr != nil {
			log.G(ctx).WithError(cerr).Warn("close task output")
		}
		return nil, toGRPC(createError(err))
	}
	t := newTask(s.ctx, r.ID, r.Bundle, io, out, vm, s.send)
	// TaskCreate is queued before any RPC can find the task and before its
	// exit can be noticed, so it comes first of the task's events.
	s.send(&eventstypes.TaskCreate{
		ContainerID: r.ID,
		Bundle:      r.Bundle,
		Rootfs:      r.Rootfs,
		IO:          &eventstypes.TaskIO{Stdin: r.Stdin, Stdout: r.Stdout, Stderr: r.Stderr, Terminal: r.Terminal},
		Pid:         uint32(t.pid),
	})
	s.mu.Lock()
	s.tasks[r.ID] = t
	s.mu.Unlock()
	t.watch(s.ctx)
	return &taskAPI.CreateTaskResponse{Pid: uint32(t.pid)}, nil
}

// toGRPC maps err to the gRPC status of its errdefs class, with err's
// message as it is and nothing else: errgrpc would add each cause an
// error wraps with %w (a connection's error, a context's) as a detail of
// its own, which containerd's client joins to the message on lines of
// their own, and the CRI hands on to kubectl describe. The shim's errors
// are one line, and cross the edge as one.
func toGRPC(err error) error {
	if err == nil {
		return nil
	}
	st, _ := status.FromError(errgrpc.ToGRPC(err))
	return status.New(st.Code(), st.Message()).Err()
}

// createError keeps Create from failing with NotImplemented: containerd
// reads that as a shim without the current task API, retries with an older
// one and loses the message. Something the shim cannot do for this task is
// a failed precondition of the task instead.
func createError(err error) error {
	if !errdefs.IsNotImplemented(err) {
		return err
	}
	msg := strings.TrimSuffix(err.Error(), ": "+errdefs.ErrNotImplemented.Error())
	return fmt.Errorf("%s: %w", msg, errdefs.ErrFailedPrecondition)
}

// Start runs the VM, or an exec's program in the guest; the task or exec
// queues TaskStart or TaskExecStarted as it starts.
func (s *service) Start(ctx context.Context, r *taskAPI.StartRequest) (*taskAPI.StartResponse, error) {
	if rt := s.ordinary.get(r.ID); rt != nil {
		return rt.Start(ctx, r)
	}
	t, e, err := s.get(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	if e != nil {
		pid, err := e.start(ctx)
		if err != nil {
			return nil, toGRPC(err)
		}
		return &taskAPI.StartResponse{Pid: uint32(pid)}, nil
	}
	if err := t.start(ctx); err != nil {
		return nil, toGRPC(err)
	}
	return &taskAPI.StartResponse{Pid: uint32(t.pid)}, nil
}

// Delete releases a stopped task or exec; the task queues TaskDelete.
func (s *service) Delete(ctx context.Context, r *taskAPI.DeleteRequest) (*taskAPI.DeleteResponse, error) {
	if rt := s.ordinary.get(r.ID); rt != nil {
		resp, err := rt.Delete(ctx, r)
		if err == nil && r.ExecID == "" {
			s.ordinary.deleted(ctx, r.ID)
		}
		return resp, err
	}
	t, e, err := s.get(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	if e != nil {
		if err := t.deleteExec(e); err != nil {
			return nil, toGRPC(err)
		}
		_, pid, code, at := e.snapshot()
		return &taskAPI.DeleteResponse{Pid: uint32(pid), ExitStatus: uint32(code), ExitedAt: protobuf.ToTimestamp(at)}, nil
	}
	if err := t.delete(ctx); err != nil {
		return nil, toGRPC(err)
	}
	s.mu.Lock()
	delete(s.tasks, r.ID)
	s.mu.Unlock()
	_, code, at := t.snapshot()
	return &taskAPI.DeleteResponse{Pid: uint32(t.pid), ExitStatus: uint32(code), ExitedAt: protobuf.ToTimestamp(at)}, nil
}

// State reports the task's or exec's status.
func (s *service) State(ctx context.Context, r *taskAPI.StateRequest) (*taskAPI.StateResponse, error) {
	if rt := s.ordinary.get(r.ID); rt != nil {
		return rt.State(ctx, r)
	}
	t, e, err := s.get(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	if e != nil {
		st, pid, code, at := e.snapshot()
		return &taskAPI.StateResponse{
			ID: e.id, ExecID: e.id, Bundle: t.bundle, Pid: uint32(pid), Status: st.status(),
			Stdin: e.stdio.stdin, Stdout: e.stdio.stdout, Stderr: e.stdio.stderr, Terminal: e.tty != nil,
			ExitStatus: uint32(code), ExitedAt: protobuf.ToTimestamp(at),
		}, nil
	}
	st, code, at := t.snapshot()
	return &taskAPI.StateResponse{
		ID: t.id, Bundle: t.bundle, Pid: uint32(t.pid), Status: st.status(),
		Stdin: t.stdio.stdin, Stdout: t.stdio.stdout, Stderr: t.stdio.stderr, Terminal: t.stdio.terminal,
		ExitStatus: uint32(code), ExitedAt: protobuf.ToTimestamp(at),
	}, nil
}

// Kill delivers a signal to the VM (see task.kill) or to an exec's
// program in the guest.
func (s *service) Kill(ctx context.Context, r *taskAPI.KillRequest) (*emptypb.Empty, error) {
	if rt := s.ordinary.get(r.ID); rt != nil {
		return rt.Kill(ctx, r)
	}
	t, e, err := s.get(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	if e != nil {
		err = e.kill(ctx, r.Signal)
	} else {
		err = t.kill(ctx, r.Signal)
	}
	if err != nil {
		return nil, toGRPC(err)
	}
	return &emptypb.Empty{}, nil
}

// Wait blocks until the task or exec exits.
func (s *service) Wait(ctx context.Context, r *taskAPI.WaitRequest) (*taskAPI.WaitResponse, error) {
	if rt := s.ordinary.get(r.ID); rt != nil {
		return rt.Wait(ctx, r)
	}
	t, e, err := s.get(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	if e != nil {
		if err := e.wait(ctx); err != nil {
			return nil, toGRPC(err)
		}
		_, _, code, at := e.snapshot()
		return &taskAPI.WaitResponse{ExitStatus: uint32(code), ExitedAt: protobuf.ToTimestamp(at)}, nil
	}
	if err := t.wait(ctx); err != nil {
		return nil, toGRPC(err)
	}
	_, code, at := t.snapshot()
	return &taskAPI.WaitResponse{ExitStatus: uint32(code), ExitedAt: protobuf.ToTimestamp(at)}, nil
}

// Pids lists the VM's process.
func (s *service) Pids(ctx context.Context, r *taskAPI.PidsRequest) (*taskAPI.PidsResponse, error) {
	if rt := s.ordinary.get(r.ID); rt != nil {
		return rt.Pids(ctx, r)
	}
	t, _, err := s.get(r.ID, "")
	if err != nil {
		return nil, err
	}
	return &taskAPI.PidsResponse{Processes: []*apitask.ProcessInfo{{Pid: uint32(t.pid)}}}, nil
}

// Pause stops the VM's vCPUs; the task queues TaskPaused.
func (s *service) Pause(ctx context.Context, r *taskAPI.PauseRequest) (*emptypb.Empty, error) {
	if rt := s.ordinary.get(r.ID); rt != nil {
		return rt.Pause(ctx, r)
	}
	t, _, err := s.get(r.ID, "")
	if err != nil {
		return nil, err
	}
	if err := t.pause(ctx); err != nil {
		return nil, toGRPC(err)
	}
	return &emptypb.Empty{}, nil
}

// Resume restarts the VM's vCPUs; the task queues TaskResumed.
func (s *service) Resume(ctx context.Context, r *taskAPI.ResumeRequest) (*emptypb.Empty, error) {
	if rt := s.ordinary.get(r.ID); rt != nil {
		return rt.Resume(ctx, r)
	}
	t, _, err := s.get(r.ID, "")
	if err != nil {
		return nil, err
	}
	if err := t.resume(ctx); err != nil {
		return nil, toGRPC(err)
	}
	return &emptypb.Empty{}, nil
}

// CloseIO stops forwarding stdin to the guest console, or to an exec's
// terminal, which then hangs up. An exec without a terminal reads stdin
// until containerd closes its fifo, so there is nothing to do for one.
func (s *service) CloseIO(ctx context.Context, r *taskAPI.CloseIORequest) (*emptypb.Empty, error) {
	if rt := s.ordinary.get(r.ID); rt != nil {
		return rt.CloseIO(ctx, r)
	}
	t, e, err := s.get(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	switch {
	case !r.Stdin:
	case e != nil:
		e.closeStdin()
	default:
		t.cons.closeStdin()
	}
	return &emptypb.Empty{}, nil
}

// ResizePty sets the window size of an exec's terminal; it returns at
// once, and the size reaches the guest in the background. For the task
// it is accepted and ignored: the guest's serial console has no window
// size to set.
func (s *service) ResizePty(ctx context.Context, r *taskAPI.ResizePtyRequest) (*emptypb.Empty, error) {
	if rt := s.ordinary.get(r.ID); rt != nil {
		return rt.ResizePty(ctx, r)
	}
	_, e, err := s.get(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	if e != nil {
		if err := e.resize(r.Width, r.Height); err != nil {
			return nil, toGRPC(err)
		}
	}
	return &emptypb.Empty{}, nil
}

// Exec adds a program to run in the guest through its agent; the task
// queues TaskExecAdded.
func (s *service) Exec(ctx context.Context, r *taskAPI.ExecProcessRequest) (*emptypb.Empty, error) {
	if rt := s.ordinary.get(r.ID); rt != nil {
		return rt.Exec(ctx, r)
	}
	t, _, err := s.get(r.ID, "")
	if err != nil {
		return nil, err
	}
	io := stdio{stdin: r.Stdin, stdout: r.Stdout, stderr: r.Stderr, terminal: r.Terminal}
	if _, err := t.addExec(s.ctx, r.ExecID, r.Spec.GetValue(), io); err != nil {
		return nil, toGRPC(err)
	}
	return &emptypb.Empty{}, nil
}

// Checkpoint writes a VM's state into r.Path, the directory containerd
// makes its checkpoint of (see task.checkpoint); the VM then ends.
func (s *service) Checkpoint(ctx context.Context, r *taskAPI.CheckpointTaskRequest) (*emptypb.Empty, error) {
	if rt := s.ordinary.get(r.ID); rt != nil {
		return rt.Checkpoint(ctx, r)
	}
	t, _, err := s.get(r.ID, "")
	if err != nil {
		return nil, err
	}
	if !filepath.IsAbs(r.Path) {
		return nil, errgrpc.ToGRPCf(errdefs.ErrInvalidArgument, "checkpoint of task %s: path %q is not absolute", r.ID, r.Path)
	}
	if err := t.checkpoint(ctx, r.Path); err != nil {
		return nil, toGRPC(err)
	}
	return &emptypb.Empty{}, nil
}

// Update applies new resource limits to a VM (see task.update).
func (s *service) Update(ctx context.Context, r *taskAPI.UpdateTaskRequest) (*emptypb.Empty, error) {
	if rt := s.ordinary.get(r.ID); rt != nil {
		return rt.Update(ctx, r)
	}
	t, _, err := s.get(r.ID, "")
	if err != nil {
		return nil, err
	}
	if err := t.update(ctx, r.Resources); err != nil {
		return nil, toGRPC(err)
	}
	return &emptypb.Empty{}, nil
}

// Stats reports the VM's cgroup usage.
func (s *service) Stats(ctx context.Context, r *taskAPI.StatsRequest) (*taskAPI.StatsResponse, error) {
	if rt := s.ordinary.get(r.ID); rt != nil {
		return rt.Stats(ctx, r)
	}
	t, _, err := s.get(r.ID, "")
	if err != nil {
		return nil, err
	}
	m, err := t.vm.Stats(ctx)
	if err != nil {
		return nil, toGRPC(err)
	}
	a, err := typeurl.MarshalAnyToProto(m)
	if err != nil {
		return nil, toGRPC(fmt.Errorf("marshal stats of %s: %w", t.id, err))
	}
	return &taskAPI.StatsResponse{Stats: a}, nil
}

// Connect returns the shim's and the VM's pids.
func (s *service) Connect(ctx context.Context, r *taskAPI.ConnectRequest) (*taskAPI.ConnectResponse, error) {
	if rt := s.ordinary.get(r.ID); rt != nil {
		return rt.Connect(ctx, r)
	}
	resp := &taskAPI.ConnectResponse{ShimPid: uint32(os.Getpid())}
	if t, _, err := s.get(r.ID, ""); err == nil {
		resp.TaskPid = uint32(t.pid)
	}
	return resp, nil
}

// Shutdown ends the shim once it serves no task.
func (s *service) Shutdown(ctx context.Context, r *taskAPI.ShutdownRequest) (*emptypb.Empty, error) {
	s.mu.Lock()
	n := len(s.tasks) + len(s.creating) + s.ordinary.count()
	s.mu.Unlock()
	if n == 0 {
		s.ordinary.shutdown(ctx)
		// Before the reply: the pod's cgroup has no child of the shim's
		// left once containerd is done with the pod.
		s.leaveCgroup()
		s.shutdown.Shutdown()
	}
	return &emptypb.Empty{}, nil
}

// leaveCgroup takes the shim out of its cgroup and removes it, once.
func (s *service) leaveCgroup() {
	s.leaveOnce.Do(func() {
		if s.cgroup == "" {
			return
		}
		if err := shimCgroups().LeaveShim(s.ctx, s.cgroup); err != nil {
			log.G(s.ctx).WithError(err).WithField("cgroup", s.cgroup).Warn("remove the shim's cgroup")
		}
	})
}

// get finds a task and, for a non-empty execID, one of its execs; errors
// are already mapped for the RPC.
func (s *service) get(id, execID string) (*task, *execProcess, error) {
	s.mu.Lock()
	t := s.tasks[id]
	s.mu.Unlock()
	if t == nil {
		return nil, nil, errgrpc.ToGRPCf(errdefs.ErrNotFound, "task %s", id)
	}
	if execID == "" {
		return t, nil, nil
	}
	e, err := t.exec(execID)
	if err != nil {
		return nil, nil, toGRPC(err)
	}
	return t, e, nil
}

// send queues an event for containerd. It never blocks, so tasks and
// execs call it with their locks held, and events are published in the
// order of the state changes that queue them. Once the shim is shutting
// down, events have nowhere to go and are dropped.
func (s *service) send(e any) {
	s.evMu.Lock()
	defer s.evMu.Unlock()
	if s.evClosed {
		log.G(s.ctx).WithField("topic", runtime.GetTopic(e)).Warn("event after shutdown dropped")
		return
	}
	s.queue = append(s.queue, e)
	s.evCond.Signal()
}

// closeEvents closes the event queue as the shim shuts down and waits, at
// most publishTimeout, until the events queued before are published: the
// shim exits once shutdown is done, and containerd must still hear the
// last TaskExit and TaskDelete.
func (s *service) closeEvents(ctx context.Context) error {
	s.evMu.Lock()
	s.evClosed = true
	s.evCond.Broadcast()
	s.evMu.Unlock()
	t := time.NewTimer(publishTimeout)
	defer t.Stop()
	select {
	case <-s.drained:
	case <-t.C:
		log.G(s.ctx).Warnf("events not published within %v of shutdown", publishTimeout)
	case <-ctx.Done():
	}
	return nil
}

// take waits for queued events and hands them all over; done reports
// that the queue is closed and nothing more will come.
func (s *service) take() (events []any, done bool) {
	s.evMu.Lock()
	defer s.evMu.Unlock()
	for len(s.queue) == 0 && !s.evClosed {
		s.evCond.Wait()
	}
	events, s.queue = s.queue, nil
	return events, s.evClosed
}

// forward publishes events to containerd in order until the queue is
// closed and drained, then closes the publisher.
func (s *service) forward(ctx context.Context, publisher shim.Publisher) {
	ns, _ := namespaces.Namespace(ctx)
	ctx = namespaces.WithNamespace(context.Background(), ns)
	for done := false; !done; {
		var events []any
		events, done = s.take()
		for _, e := range events {
			if err := publisher.Publish(ctx, runtime.GetTopic(e), e); err != nil {
				log.G(ctx).WithError(err).Error("publish event")
			}
		}
	}
	if err := publisher.Close(); err != nil {
		log.G(ctx).WithError(err).Debug("close publisher")
	}
	close(s.drained)
}
