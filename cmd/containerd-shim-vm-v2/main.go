// Command containerd-shim-vm-v2 is containerd's runtime v2 shim for VM
// images: runtime type io.containerd.vm.v2.
package main

import (
	"context"

	"github.com/containerd/containerd/v2/pkg/shim"

	vmshim "github.com/vmshim/vmshim/shim"
)

func main() {
	vmshim.Register()
	shim.RunShim(context.Background(), vmshim.NewManager(vmshim.RuntimeName), func(c *shim.Config) {
		// QEMU is our direct child and exec.Cmd.Wait reaps it; a global
		// reaper would steal its exit status.
		c.NoReaper = true
		c.NoSubreaper = true
	})
}
