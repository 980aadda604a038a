package guestconsole_test

import (
	"fmt"
	"io"
	"strings"

	"github.com/vmshim/vmshim/guestconsole"
)

// Example copies a guest's console to the task's log and to a watcher,
// then asks the watcher whether the guest died and how far its kernel
// got.
func Example() {
	console := strings.NewReader("[    0.000000] Linux version 6.1.0-18-amd64\r\n" +
		"[    1.234567] Kernel panic - not syncing: VFS: Unable to mount root fs on unknown-block(0,0)\r\n" +
		"[    1.234600] CPU: 0 PID: 1 Comm: swapper/0 Not tainted 6.1.0-18-amd64 #1  Debian 6.1.76-1\r\n")
	w := guestconsole.New()
	_, _ = io.Copy(io.MultiWriter(io.Discard, w), console)

	if reason, ok := w.Dead(); ok {
		fmt.Println("dead:", reason)
	}
	fmt.Println("kernel time:", w.KernelTime())
	// Output:
	// dead: kernel panic: VFS: Unable to mount root fs on unknown-block(0,0)
	// kernel time: 1.2346s
}
