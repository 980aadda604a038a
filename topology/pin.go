package topology

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"

	"golang.org/x/sys/unix"
)

// procRoot is where proc(5) is mounted; tests point it at a fake tree.
var procRoot = "/proc"

// PinThreads sets the CPU affinity of the threads of process pid: the
// thread vcpuTIDs[i] of vCPU i gets the one CPU pin[i], every other thread
// listed in /proc/<pid>/task gets all. A thread that exits meanwhile is
// skipped. A vCPU thread id that is not a thread of pid is an error, not
// a thread to pin: QEMU in another PID namespace reports ids that mean
// other threads here. Threads started while PinThreads runs may keep the
// affinity of the thread that started them; call it again to catch them.
// Arguments are checked before any thread is changed, but an error from
// the kernel may leave some threads pinned and others not.
func PinThreads(pid int, vcpuTIDs map[int]int, pin []int, all CPUSet) error {
	if len(all) == 0 {
		return invalidf("pin threads of process %d: no cpus for its other threads", pid)
	}
	allMask, err := mask(all...)
	if err != nil {
		return fmt.Errorf("pin threads of process %d: %w", pid, err)
	}
	byTID := make(map[int]int, len(vcpuTIDs))                // thread id -> vCPU index
	masks := make(map[int]unix.CPUSetDynamic, len(vcpuTIDs)) // thread id -> its one cpu
	for _, i := range slices.Sorted(maps.Keys(vcpuTIDs)) {
		tid := vcpuTIDs[i]
		if i < 0 || i >= len(pin) {
			return invalidf("pin threads of process %d: vcpu %d has no cpu in a plan of %d", pid, i, len(pin))
		}
		if j, ok := byTID[tid]; ok {
			return invalidf("pin threads of process %d: vcpus %d and %d are both thread %d", pid, j, i, tid)
		}
		byTID[tid] = i
		if masks[tid], err = mask(pin[i]); err != nil {
			return fmt.Errorf("pin vcpu %d of process %d: %w", i, pid, err)
		}
	}

	tids, err := threads(pid)
	if err != nil {
		return err
	}
	listed := make(map[int]bool, len(tids))
	for _, tid := range tids {
		listed[tid] = true
	}
	for _, i := range slices.Sorted(maps.Keys(vcpuTIDs)) {
		if tid := vcpuTIDs[i]; !listed[tid] {
			return invalidf("pin threads of process %d: vcpu %d thread %d is not a thread of the process", pid, i, tid)
		}
	}

	for _, tid := range tids {
		set, what := allMask, "cpus "+all.String()
		if i, ok := byTID[tid]; ok {
			set, what = masks[tid], fmt.Sprintf("vcpu %d to cpu %d", i, pin[i])
		}
		err = unix.SchedSetaffinityDynamic(tid, set)
		if errors.Is(err, unix.ESRCH) {
			continue // the thread has exited
		}
		if err != nil {
			return fmt.Errorf("pin thread %d of process %d (%s): %w", tid, pid, what, err)
		}
	}
	return nil
}

// Affinity returns the CPUs thread tid may run on.
func Affinity(tid int) (CPUSet, error) {
	set := unix.NewCPUSet(MaxCPUID + 1)
	if err := unix.SchedGetaffinityDynamic(tid, set); err != nil {
		return nil, fmt.Errorf("cpu affinity of thread %d: %w", tid, err)
	}
	cpus := CPUSet{}
	for c := range MaxCPUID + 1 {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	return cpus, nil
}

// threads lists the thread ids of process pid from /proc/<pid>/task.
func threads(pid int) ([]int, error) {
	dir := filepath.Join(procRoot, strconv.Itoa(pid), "task")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("list threads of process %d: %w", pid, err)
	}
	tids := make([]int, 0, len(entries))
	for _, e := range entries {
		tid, err := strconv.Atoi(e.Name())
		if err != nil || tid <= 0 {
			continue
		}
		tids = append(tids, tid)
	}
	sort.Ints(tids)
	return tids, nil
}

// mask returns an affinity mask of cpus, which must lie in 0-MaxCPUID.
func mask(cpus ...int) (unix.CPUSetDynamic, error) {
	set := unix.NewCPUSet(MaxCPUID + 1)
	for _, c := range cpus {
		if c < 0 || c > MaxCPUID {
			return nil, invalidf("cpu %d is not in 0-%d", c, MaxCPUID)
		}
		set.Set(c)
	}
	return set, nil
}
