// Command vmshim-pause is the process of a VM pod's sandbox container
// (see package pause). The shim starts it in the pod's network
// namespace, and in the IPC, UTS and PID namespaces the sandbox's spec
// asks for; its first argument names the network namespace, for ps.
package main

import (
	"os"

	"github.com/vmshim/vmshim/pause"
)

func main() {
	os.Exit(pause.Run(os.Args[1:]))
}
