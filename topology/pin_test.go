package topology

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// helperEnv, set to "threads", makes the test binary a child with
// helperThreads locked threads that prints "ready" and lives until its
// stdin closes.
const helperEnv = "TOPOLOGY_TEST_HELPER"

// helperThreads is how many locked OS threads the helper child starts.
const helperThreads = 3

// noSuchTID is above Linux's PID_MAX_LIMIT, so no thread ever has it.
const noSuchTID = 1<<22 + 1

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "threads" {
		runHelper()
		return
	}
	os.Exit(m.Run())
}

// runHelper is the helper child's main.
func runHelper() {
	time.AfterFunc(time.Minute, func() { os.Exit(2) })
	locked := make(chan struct{})
	block := make(chan struct{})
	for range helperThreads {
		go func() {
			runtime.LockOSThread()
			locked <- struct{}{}
			<-block
		}()
	}
	for range helperThreads {
		<-locked
	}
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
}

// startHelper starts the test binary as a child with several threads and
// returns its pid once they run; the child ends with the test.
func startHelper(t *testing.T) int {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), helperEnv+"=threads")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = stdin.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	ready := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		ready <- line
	}()
	select {
	case line := <-ready:
		if line != "ready\n" {
			t.Fatalf("helper child said %q", line)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("helper child did not start its threads")
	}
	return cmd.Process.Pid
}

// startSleep starts a single-threaded child and returns its pid.
func startSleep(t *testing.T) int {
	t.Helper()
	if _, err := exec.LookPath("sleep"); err != nil {
		t.Skip("no sleep program")
	}
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd.Process.Pid
}

// hostCPUs returns the CPUs this test may run on, skipping the test if
// there are fewer than n.
func hostCPUs(t *testing.T, n int) CPUSet {
	t.Helper()
	cpus, err := Affinity(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if len(cpus) < n || runtime.NumCPU() < n {
		t.Skipf("needs %d cpus, has %s", n, cpus)
	}
	return cpus
}

// allowedList reads Cpus_allowed_list from a thread's proc status.
func allowedList(t *testing.T, pid, tid int) (CPUSet, error) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/status", pid, tid))
	if err != nil {
		return nil, err
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "Cpus_allowed_list:"); ok {
			return ParseCPUSet(v)
		}
	}
	t.Fatalf("no Cpus_allowed_list in status of thread %d", tid)
	return nil, nil
}

func TestPinThreads(t *testing.T) {
	for _, tc := range []struct {
		name  string
		need  int  // cpus
		sleep bool // a single-threaded child, not the helper
		vcpus int  // how many of the child's threads are vCPUs
		pin   func(c CPUSet) []int
		all   func(c CPUSet) CPUSet
	}{
		{name: "one cpu", need: 1, vcpus: 1,
			pin: func(c CPUSet) []int { return []int{c[0]} },
			all: func(c CPUSet) CPUSet { return c[:1] }},
		{name: "vcpu apart", need: 2, vcpus: 1,
			pin: func(c CPUSet) []int { return []int{c[1]} },
			all: func(c CPUSet) CPUSet { return c[:1] }},
		{name: "two vcpus", need: 2, vcpus: 2,
			pin: func(c CPUSet) []int { return []int{c[1], c[0]} },
			all: func(c CPUSet) CPUSet { return c[:2] }},
		{name: "more pins than threads", need: 2, vcpus: 1,
			pin: func(c CPUSet) []int { return []int{c[1], c[0], c[1]} },
			all: func(c CPUSet) CPUSet { return c }},
		{name: "sleep", need: 2, sleep: true, vcpus: 1,
			pin: func(c CPUSet) []int { return []int{c[1]} },
			all: func(c CPUSet) CPUSet { return c[:1] }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cpus := hostCPUs(t, tc.need)
			var pid int
			if tc.sleep {
				pid = startSleep(t)
			} else {
				pid = startHelper(t)
			}
			tids, err := threads(pid)
			if err != nil {
				t.Fatal(err)
			}
			if len(tids) < tc.vcpus {
				t.Fatalf("child has threads %v, want %d or more", tids, tc.vcpus)
			}
			if !tc.sleep && len(tids) <= helperThreads {
				t.Fatalf("helper child has threads %v, want more than %d", tids, helperThreads)
			}
			// vCPU 0 is the main thread, further vCPUs the last threads.
			vcpuTIDs := map[int]int{0: pid}
			for i := 1; i < tc.vcpus; i++ {
				vcpuTIDs[i] = tids[len(tids)-i]
			}
			pin, all := tc.pin(cpus), tc.all(cpus)
			if err := PinThreads(pid, vcpuTIDs, pin, all); err != nil {
				t.Fatal(err)
			}
			want := make(map[int]CPUSet, len(tids))
			for _, tid := range tids {
				want[tid] = all
			}
			for i, tid := range vcpuTIDs {
				want[tid] = CPUSet{pin[i]}
			}
			for _, tid := range tids {
				got, err := Affinity(tid)
				if errors.Is(err, unix.ESRCH) {
					continue
				}
				if err != nil || !got.Equal(want[tid]) {
					t.Errorf("thread %d affinity %s, %v; want %s", tid, got, err, want[tid])
				}
				status, err := allowedList(t, pid, tid)
				if errors.Is(err, os.ErrNotExist) {
					continue
				}
				if err != nil || !status.Equal(want[tid]) {
					t.Errorf("thread %d Cpus_allowed_list %s, %v; want %s", tid, status, err, want[tid])
				}
			}
		})
	}
}

func TestPinThreadsRefuses(t *testing.T) {
	cpus := hostCPUs(t, 1)
	pid := startSleep(t)
	self := os.Getpid()
	before, err := Affinity(self)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		vcpus map[int]int
		pin   []int
		all   CPUSet
		err   string
		kind  func(error) bool
	}{
		{name: "index beyond pin", vcpus: map[int]int{2: pid}, pin: []int{cpus[0], cpus[0]}, all: cpus,
			err: fmt.Sprintf("pin threads of process %d: vcpu 2 has no cpu in a plan of 2", pid), kind: errdefs.IsInvalidArgument},
		{name: "negative index", vcpus: map[int]int{-1: pid}, pin: []int{cpus[0]}, all: cpus,
			err: fmt.Sprintf("pin threads of process %d: vcpu -1 has no cpu in a plan of 1", pid), kind: errdefs.IsInvalidArgument},
		{name: "no pin", vcpus: map[int]int{0: pid}, all: cpus,
			err: fmt.Sprintf("pin threads of process %d: vcpu 0 has no cpu in a plan of 0", pid), kind: errdefs.IsInvalidArgument},
		{name: "empty all", vcpus: map[int]int{0: pid}, pin: []int{cpus[0]},
			err: fmt.Sprintf("pin threads of process %d: no cpus for its other threads", pid), kind: errdefs.IsInvalidArgument},
		{name: "pin out of range", vcpus: map[int]int{0: pid}, pin: []int{MaxCPUID + 1}, all: cpus,
			err: fmt.Sprintf("pin vcpu 0 of process %d: cpu 8192 is not in 0-8191", pid), kind: errdefs.IsInvalidArgument},
		{name: "all out of range", vcpus: map[int]int{0: pid}, pin: []int{cpus[0]}, all: CPUSet{-1},
			err: fmt.Sprintf("pin threads of process %d: cpu -1 is not in 0-8191", pid), kind: errdefs.IsInvalidArgument},
		{name: "thread twice", vcpus: map[int]int{0: pid, 1: pid}, pin: []int{cpus[0], cpus[0]}, all: cpus,
			err: fmt.Sprintf("pin threads of process %d: vcpus 0 and 1 are both thread %d", pid, pid), kind: errdefs.IsInvalidArgument},
		{name: "foreign thread", vcpus: map[int]int{0: pid, 1: self}, pin: []int{cpus[0], cpus[0]}, all: cpus,
			err: fmt.Sprintf("pin threads of process %d: vcpu 1 thread %d is not a thread of the process", pid, self), kind: errdefs.IsInvalidArgument},
		{name: "cpu offline", vcpus: map[int]int{0: pid}, pin: []int{MaxCPUID}, all: cpus,
			err: fmt.Sprintf("pin thread %d of process %d (vcpu 0 to cpu 8191): invalid argument", pid, pid), kind: func(err error) bool { return errors.Is(err, unix.EINVAL) }},
		{name: "no process", vcpus: map[int]int{0: noSuchTID}, pin: []int{cpus[0]}, all: cpus,
			err: fmt.Sprintf("list threads of process %d: open /proc/%d/task: no such file or directory", noSuchTID, noSuchTID), kind: func(err error) bool { return errors.Is(err, os.ErrNotExist) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := pid
			if tc.name == "no process" {
				p = noSuchTID
			}
			err := PinThreads(p, tc.vcpus, tc.pin, tc.all)
			if err == nil || err.Error() != tc.err || !tc.kind(err) {
				t.Fatalf("PinThreads = %v; want %q", err, tc.err)
			}
			if after, err := Affinity(self); err != nil || !after.Equal(before) {
				t.Fatalf("this process's affinity went from %s to %s, %v", before, after, err)
			}
		})
	}
}

// TestPinThreadsExited lists threads that no longer exist, as if they
// ended between the listing and the pinning.
func TestPinThreadsExited(t *testing.T) {
	cpus := hostCPUs(t, 1)
	pid := startSleep(t)
	fake := t.TempDir()
	for _, tid := range []int{pid, noSuchTID} {
		if err := os.MkdirAll(filepath.Join(fake, strconv.Itoa(pid), "task", strconv.Itoa(tid)), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	old := procRoot
	procRoot = fake
	t.Cleanup(func() { procRoot = old })

	for _, vcpus := range []map[int]int{{0: pid}, {0: noSuchTID}, {0: noSuchTID, 1: pid}} {
		if err := PinThreads(pid, vcpus, []int{cpus[0], cpus[0]}, cpus); err != nil {
			t.Errorf("PinThreads(%v) = %v", vcpus, err)
		}
	}
	if got, err := Affinity(pid); err != nil || !got.Equal(CPUSet{cpus[0]}) {
		t.Errorf("affinity of %d is %s, %v; want %d", pid, got, err, cpus[0])
	}
}

func TestAffinity(t *testing.T) {
	if _, err := Affinity(noSuchTID); !errors.Is(err, unix.ESRCH) {
		t.Errorf("Affinity of no thread = %v, want ESRCH", err)
	}
	got, err := Affinity(os.Getpid())
	if err != nil || len(got) != runtime.NumCPU() {
		t.Fatalf("Affinity(self) = %s, %v", got, err)
	}
}
