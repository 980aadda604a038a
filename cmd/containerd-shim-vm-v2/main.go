// Command containerd-shim-vm-v2 is containerd's runtime v2 shim for VM
// images: runtime type io.containerd.vm.v2.
package main

import (
	"context"
	"os"
	"path/filepath"
	"runtime"

	"github.com/containerd/containerd/v2/pkg/shim"

	"github.com/vmshim/vmshim/pause"
	vmshim "github.com/vmshim/vmshim/shim"
)

func init() {
	// The main goroutine keeps the main thread, whose state /proc/PID/*
	// shows, to itself: the shim never lends it to a goroutine that moves
	// its thread (into a netns, or a jail for good).
	runtime.LockOSThread()
}

func main() {
	if filepath.Base(os.Args[0]) == pause.Name {
		os.Exit(pause.Run(os.Args[1:]))
	}
	vmshim.Register()
	shim.RunShim(context.Background(), vmshim.NewManager(vmshim.RuntimeName), func(c *shim.Config) {
		// QEMU is our direct child and exec.Cmd.Wait reaps it; a global
		// reaper would steal its exit status.
		c.NoReaper = true
		c.NoSubreaper = true
	})
}
