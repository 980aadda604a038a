// Package nodeapi is what vmshim-nodectl, run inside the cgroup v2 test
// node, reports as JSON to the test that drives it.
package nodeapi

import "time"

// Created is what create and oom report of a task.
type Created struct {
	ID      string `json:"id"`
	QEMUPid int    `json:"qemu_pid"`
	ShimPid int    `json:"shim_pid"`
}

// Event is one task event of the container, in the order containerd sent it.
type Event struct {
	Topic      string    `json:"topic"`
	At         time.Time `json:"at"`
	ExitStatus *uint32   `json:"exit_status,omitempty"`
}

// OOMReport is what oom prints.
type OOMReport struct {
	Created
	MemoryMax string `json:"memory_max"` // of the cgroup, once the task is created
	// MemoryEvents is the cgroup's memory.events after the exit, or "" if
	// the cgroup is gone by then.
	MemoryEvents string  `json:"memory_events"`
	GuestRAM     string  `json:"guest_ram"` // the mapping filled, as in /proc/PID/maps
	Filled       int64   `json:"filled"`    // bytes written before the writes stopped
	FillError    string  `json:"fill_error,omitempty"`
	Events       []Event `json:"events"`
	Waited       string  `json:"waited"` // "exit", or why waiting for the exit stopped
}
