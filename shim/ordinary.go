package shim

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/vmshim/vmshim/config"
	"github.com/vmshim/vmshim/launch"
	"github.com/vmshim/vmshim/runcshim"
)

// runcSocketDir is where the pod's runc shim listens: a directory of the
// shim's own, so that its socket, named after the pod as this shim's is,
// is not this shim's.
const runcSocketDir = "/run/vmshim/runc"

// ordinaryTasks are the containers of the pod whose image holds no VM:
// containerd's runc shim runs them, one for the pod, started with the
// first of them, and the task service forwards their calls to it. It
// publishes their events itself.
type ordinaryTasks struct {
	cfg runcshim.Config // the runc shim's, without its binary until the first create

	mu    sync.Mutex // guards pod and tasks
	pod   *runcshim.Pod
	tasks map[string]*ordinaryTask
}

// ordinaryTask is one ordinary container.
type ordinaryTask struct {
	shim   *runcshim.Shim
	bundle string
}

// newOrdinaryTasks returns the pod's ordinary containers, none yet; cfg
// says how to reach containerd.
func newOrdinaryTasks(cfg runcshim.Config) *ordinaryTasks {
	return &ordinaryTasks{cfg: cfg, tasks: make(map[string]*ordinaryTask)}
}

// get is the runc shim's task service for ordinary container id, nil
// when id is not one.
func (o *ordinaryTasks) get(id string) taskAPI.TTRPCTaskService {
	o.mu.Lock()
	defer o.mu.Unlock()
	if t := o.tasks[id]; t != nil {
		return t.shim.Task()
	}
	return nil
}

// count is how many ordinary containers there are.
func (o *ordinaryTasks) count() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.tasks)
}

// create has the pod's runc shim, started now if need be, create the
// ordinary container r describes. The record written into its bundle
// first lets the delete action find the runc shim after a crash.
func (o *ordinaryTasks) create(ctx context.Context, r *taskAPI.CreateTaskRequest, class launch.Class) (*taskAPI.CreateTaskResponse, error) {
	o.mu.Lock()
	if o.pod == nil {
		cfg := o.cfg
		cfg.Binary, cfg.Runc = class.RuncShim, class.Runc
		o.pod = runcshim.NewPod(cfg)
	}
	pod := o.pod
	o.mu.Unlock()
	sh, err := pod.Get(ctx, r.ID, r.Bundle)
	if err != nil {
		return nil, err
	}
	if err := runcshim.WriteRecord(r.Bundle, runcshim.Record{ID: r.ID, Address: sh.Address()}); err != nil {
		return nil, err
	}
	cr, err := pod.CreateRequest(r)
	if err == nil {
		var resp *taskAPI.CreateTaskResponse
		if resp, err = sh.Task().Create(ctx, cr); err == nil {
			o.mu.Lock()
			o.tasks[r.ID] = &ordinaryTask{shim: sh, bundle: r.Bundle}
			o.mu.Unlock()
			log.G(ctx).WithFields(log.Fields{"id": r.ID, "pid": resp.Pid}).Info("ordinary container created by the runc shim")
			return resp, nil
		}
	}
	if rerr := runcshim.RemoveRecord(r.Bundle); rerr != nil {
		log.G(ctx).WithError(rerr).Warn("remove runc record")
	}
	return nil, err
}

// deleted forgets ordinary container id once the runc shim has deleted
// it.
func (o *ordinaryTasks) deleted(ctx context.Context, id string) {
	o.mu.Lock()
	t := o.tasks[id]
	delete(o.tasks, id)
	o.mu.Unlock()
	if t == nil {
		return
	}
	if err := runcshim.RemoveRecord(t.bundle); err != nil && !os.IsNotExist(err) {
		log.G(ctx).WithError(err).WithField("id", id).Warn("remove runc record")
	}
}

// shutdown ends the pod's runc shim, once it serves no container.
func (o *ordinaryTasks) shutdown(ctx context.Context) {
	o.mu.Lock()
	pod := o.pod
	o.mu.Unlock()
	if pod != nil {
		pod.Shutdown(ctx)
	}
}

// refuseVMTarget refuses an ordinary container that would join the PID
// namespace of one of the pod's VMs (an ephemeral container whose
// `kubectl debug --target` names the VM container): the task's process is
// QEMU, and the VM's processes are the guest's, out of any container's
// reach. Joining the pod sandbox's, shared by the pod, is allowed.
func (s *service) refuseVMTarget(id, bundle string) error {
	spec, err := config.ReadSpec(bundle)
	if err != nil {
		return err
	}
	pid := specPIDNamespacePid(spec)
	if pid == 0 {
		return nil
	}
	sandbox := config.SandboxID(spec)
	s.mu.Lock()
	defer s.mu.Unlock()
	for tid, t := range s.tasks {
		if t.pid == pid && tid != sandbox {
			return fmt.Errorf("container %s: container %s runs a VM, whose processes are the guest's and cannot be shared (kubectl debug --target names a VM container): %w",
				id, tid, errdefs.ErrFailedPrecondition)
		}
	}
	return nil
}

// specPIDNamespacePid is N when spec joins the PID namespace
// /proc/N/ns/pid, as the CRI points a container at another's; 0 else.
func specPIDNamespacePid(spec *specs.Spec) int {
	if spec.Linux == nil {
		return 0
	}
	for _, ns := range spec.Linux.Namespaces {
		if ns.Type != specs.PIDNamespace {
			continue
		}
		rest, ok := strings.CutPrefix(ns.Path, "/proc/")
		if !ok {
			return 0
		}
		n, ok := strings.CutSuffix(rest, "/ns/pid")
		if !ok {
			return 0
		}
		pid, err := strconv.Atoi(n)
		if err != nil || pid <= 0 {
			return 0
		}
		return pid
	}
	return 0
}
