package oom_test

import (
	"context"
	"fmt"
	"log"
	"sync"

	"github.com/vmshim/vmshim/oom"
)

// ExampleWatch publishes an OOM event for every rise of the kill count,
// and never after the exit of the task the cgroup belongs to.
func ExampleWatch() {
	w, err := oom.Watch(context.Background(), "/sys/fs/cgroup/kubepods.slice/cri-containerd-0123.scope")
	if err != nil {
		log.Fatal(err)
	}
	defer w.Close()

	var (
		mu       sync.Mutex // guards reported and exited
		reported uint64     // kills published; zero for a cgroup made for the task
		exited   bool       // the exit is published
	)
	// publishKills publishes an OOM event if Killed counts kills not yet
	// published; the caller holds mu.
	publishKills := func() {
		n, err := w.Killed()
		if err != nil {
			log.Print(err)
		}
		if n > reported && !exited {
			reported = n
			fmt.Println("TaskOOM")
		}
	}
	go func() {
		for range w.Events() {
			mu.Lock()
			publishKills()
			mu.Unlock()
		}
	}()

	// Once the task's process has been reaped:
	mu.Lock()
	publishKills()
	exited = true
	fmt.Println("TaskExit")
	mu.Unlock()
}
