package thread

import (
	"fmt"
	"os/exec"
	"runtime"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Step moves the calling goroutine's locked OS thread into something
// a child forked from it inherits (a cgroup, a namespace). It returns how
// to move the thread back; back reports whether that worked. A step that
// fails after it moved the thread returns its back with the error, so the
// thread is moved back, or discarded.
type Step func() (back func() bool, err error)

// Fork starts cmd from an OS thread that the steps, in order, have
// moved; the child inherits where the thread was moved to.
func Fork(cmd *exec.Cmd, steps ...Step) error {
	return Run(cmd.Start, steps...)
}

// Run runs fn on an OS thread that the steps, in order, have moved,
// and undoes the steps in reverse. Should undoing fail, the thread stays
// locked and ends with its goroutine, so it never runs other Go code. (The
// runtime makes new threads from a template thread, never from a locked
// one.)
func Run(fn func() error, steps ...Step) error {
	if len(steps) == 0 {
		return fn()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		var backs []func() bool
		undo := func() bool {
			ok := true
			for i := len(backs) - 1; i >= 0; i-- {
				ok = backs[i]() && ok
			}
			return ok
		}
		for _, step := range steps {
			back, err := step()
			if back != nil {
				backs = append(backs, back)
			}
			if err != nil {
				if undo() {
					runtime.UnlockOSThread()
				}
				errc <- err
				return
			}
		}
		err := fn()
		if undo() {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

// JoinNetns is the Step that enters the network namespace at path.
func JoinNetns(path string) Step {
	return func() (func() bool, error) {
		target, err := netns.GetFromPath(path)
		if err != nil {
			return nil, fmt.Errorf("open netns %s: %w", path, err)
		}
		defer target.Close()
		orig, err := netns.Get()
		if err != nil {
			return nil, fmt.Errorf("current netns: %w", err)
		}
		if err := netns.Set(target); err != nil {
			orig.Close()
			return nil, fmt.Errorf("enter netns %s: %w", path, err)
		}
		return func() bool {
			defer orig.Close()
			return netns.Set(orig) == nil
		}, nil
	}
}

// NewNetns is the Step that moves the calling thread into a new,
// empty network namespace.
func NewNetns() (func() bool, error) {
	orig, err := netns.Get()
	if err != nil {
		return nil, fmt.Errorf("current netns: %w", err)
	}
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		orig.Close()
		return nil, fmt.Errorf("new netns: %w", err)
	}
	return func() bool {
		defer orig.Close()
		return netns.Set(orig) == nil
	}, nil
}
