package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/vmshim/vmshim/config"
)

// suspendGuestsMiB are the guest RAM sizes the suspend section measures.
var suspendGuestsMiB = [...]int{512, 2048}

// The container log lines of a suspend and a resume (launch/suspend.go).
const (
	suspendedMarker = "vmshim: suspended:"
	resumedMarker   = "vmshim: resumed the state saved on volume"
)

var (
	suspendedLine = regexp.MustCompile(`vmshim: suspended: ([0-9.]+) MiB written to volume \S+ in ([0-9.]+) s`)
	resumedLine   = regexp.MustCompile(`vmshim: resumed the state saved on volume \S+ at \S+, in ([0-9.]+) s`)
)

// suspendSample is one VM's boot, suspend onto its root-disk volume at a
// stop, and resume in a new pod.
type suspendSample struct {
	GuestMiB int `json:"guest_mib"`
	// Boot is from the CreateContainer call to VMSHIM-GUEST-BOOTED.
	Boot float64 `json:"boot_ready_at_ms"`
	// StopContainer is the call; Exited is from the call to the
	// container's finish time as the CRI reports it.
	StopContainer float64 `json:"stop_container_ms"`
	Exited        float64 `json:"stop_to_exited_ms"`
	// ShimSaveS and ShimWrittenMiB are what the shim's "suspended:" line says.
	ShimSaveS      float64 `json:"shim_save_s"`
	ShimWrittenMiB float64 `json:"shim_written_mib"`
	// StateBytes is the state file's size, StateAllocated its blocks'.
	StateBytes     int64 `json:"state_file_bytes"`
	StateAllocated int64 `json:"state_file_allocated_bytes"`
	// Resume is from the CreateContainer call to the "resumed" line,
	// ShimLoadS the time that line says.
	Resume    float64 `json:"resumed_at_ms"`
	ShimLoadS float64 `json:"shim_load_s"`
}

// benchSuspend boots, suspends and resumes a disk:wait VM of each size
// runs times.
func benchSuspend(ctx context.Context, t *testing.T, c *cri, runs int) []suspendSample {
	var out []suspendSample
	for i := range runs {
		for _, mib := range suspendGuestsMiB {
			s, err := suspendOnce(ctx, t, c, fmt.Sprintf("bench-suspend-%d-%d", mib, i), mib)
			if err != nil {
				t.Errorf("suspend, %d MiB guest: %v", mib, err)
				continue
			}
			out = append(out, s)
		}
	}
	return out
}

// suspendOnce boots a VM of mib MiB with its root disk on a volume of its
// own and on-stop suspend, stops it, and resumes it in a second pod; both
// pods and the volume are removed.
func suspendOnce(ctx context.Context, t *testing.T, c *cri, name string, mib int) (s suspendSample, err error) {
	s.GuestMiB = mib
	vol := filepath.Join(c.d.dir, "volumes", name)
	if err := os.MkdirAll(vol, 0o700); err != nil {
		return s, err
	}
	defer os.RemoveAll(vol)
	state := filepath.Join(vol, "vmshim-state")
	edit := func(suspend bool) func(*runtimeapi.ContainerConfig) {
		return func(cfg *runtimeapi.ContainerConfig) {
			cfg.Annotations = map[string]string{config.AnnotationRootDiskVolume: "/data"}
			if suspend {
				cfg.Annotations[config.AnnotationOnStop] = "suspend"
			}
			cfg.Mounts = []*runtimeapi.Mount{{ContainerPath: "/data", HostPath: vol}}
			cfg.Linux = &runtimeapi.LinuxContainerConfig{Resources: &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: int64(mib) << 20}}
		}
	}

	v, err := bootBenchVM(ctx, t, c, name, runtimeHandler, imageDiskWait, edit(true), markerBooted)
	if err != nil {
		return s, err
	}
	defer v.p.remove(t) // when a step fails; teardown removes it otherwise
	if got := qemuMemMiB(v.qemuPid); got != mib {
		return s, fmt.Errorf("pod %s: QEMU has %d MiB of guest RAM, not the container's limit of %d", name, got, mib)
	}
	s.Boot = millis(v.marks[markerBooted].at.Sub(v.create0))
	time.Sleep(2 * time.Second) // let the guest settle after BOOTED
	if err := v.suspend(ctx, &s); err != nil {
		return s, err
	}
	fi, err := os.Stat(state)
	if err != nil {
		return s, fmt.Errorf("the state on the volume: %w", err)
	}
	s.StateBytes, s.StateAllocated = fi.Size(), fi.Sys().(*syscall.Stat_t).Blocks*512
	if _, err := v.teardown(ctx, t, 0); err != nil {
		return s, err
	}
	assertNothingLeftCRI(t, v.ct.id)

	w, err := bootBenchVM(ctx, t, c, name+"-resume", runtimeHandler, imageDiskWait, edit(false), resumedMarker)
	if err != nil {
		return s, err
	}
	defer w.p.remove(t)
	line := w.marks[resumedMarker]
	s.Resume = millis(line.at.Sub(w.create0))
	m := resumedLine.FindStringSubmatch(line.text)
	if m == nil {
		return s, fmt.Errorf("pod %s: resume line %q", w.p.name, line.text)
	}
	s.ShimLoadS, _ = strconv.ParseFloat(m[1], 64)
	if _, err := os.Stat(state); !errors.Is(err, os.ErrNotExist) {
		return s, fmt.Errorf("the state is still on the volume after the resume: %v", err)
	}
	if _, err := w.teardown(ctx, t, 0); err != nil {
		return s, err
	}
	assertNothingLeftCRI(t, w.ct.id)
	return s, nil
}

// suspend stops the container as the kubelet does (30 s grace period),
// waits until it has exited, and reads what the shim says it saved.
func (v *benchVM) suspend(ctx context.Context, s *suspendSample) error {
	rt := v.p.c.runtime
	t0 := time.Now()
	_, err := rt.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: v.ct.id, Timeout: 30})
	if s.StopContainer = millis(time.Since(t0)); err != nil {
		return fmt.Errorf("pod %s: StopContainer: %w", v.p.name, err)
	}
	var st *runtimeapi.ContainerStatus
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		resp, err := rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: v.ct.id})
		st = resp.GetStatus()
		return st.GetState() == runtimeapi.ContainerState_CONTAINER_EXITED, err
	})
	if err != nil {
		return fmt.Errorf("pod %s: wait for the exit: %w", v.p.name, err)
	}
	if st.ExitCode != 0 {
		return fmt.Errorf("pod %s: the suspended VM exited %d (%s)", v.p.name, st.ExitCode, st.Message)
	}
	s.Exited = millis(time.Unix(0, st.FinishedAt).Sub(t0))
	// The line is written before QEMU ends, but reaches the log through
	// containerd's copy, which may lag the exit.
	var line string
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		var ok bool
		line, ok = findLogLine(v.ct.log, suspendedMarker)
		return ok, nil
	})
	if err != nil {
		data, _ := os.ReadFile(v.ct.log)
		return fmt.Errorf("pod %s: no %q line: %w; its last line: %s", v.p.name, suspendedMarker, err, lastLine(string(data)))
	}
	m := suspendedLine.FindStringSubmatch(line)
	if m == nil {
		return fmt.Errorf("pod %s: suspend line %q", v.p.name, line)
	}
	s.ShimWrittenMiB, _ = strconv.ParseFloat(m[1], 64)
	s.ShimSaveS, _ = strconv.ParseFloat(m[2], 64)
	return nil
}

// suspendRows adds each guest size's boot, suspend and resume: medians,
// with the least and greatest of the runs.
func (r *benchReport) suspendRows(tab *summary) {
	for _, mib := range suspendGuestsMiB {
		samples := slices.DeleteFunc(slices.Clone(r.Suspend), func(s suspendSample) bool { return s.GuestMiB != mib })
		p := fmt.Sprintf("suspend, %d MiB guest: ", mib)
		of := func(f func(suspendSample) float64) []float64 {
			var v []float64
			for _, s := range samples {
				v = append(v, f(s))
			}
			return v
		}
		const mebi = 1 << 20
		tab.spread(p+"cold boot, CreateContainer call → ready", of(func(s suspendSample) float64 { return s.Boot }), "ms")
		tab.spread(p+"StopContainer call", of(func(s suspendSample) float64 { return s.StopContainer }), "ms")
		tab.spread(p+"StopContainer call → container exited", of(func(s suspendSample) float64 { return s.Exited }), "ms")
		tab.spread(p+"the save, as the shim reports it", of(func(s suspendSample) float64 { return s.ShimSaveS }), "s")
		tab.spread(p+"written, as the shim reports it", of(func(s suspendSample) float64 { return s.ShimWrittenMiB }), "MiB")
		tab.spread(p+"state file size", of(func(s suspendSample) float64 { return float64(s.StateBytes) / mebi }), "MiB")
		tab.spread(p+"state file allocated (st_blocks)", of(func(s suspendSample) float64 { return float64(s.StateAllocated) / mebi }), "MiB")
		tab.spread(p+"resume, CreateContainer call → resumed line", of(func(s suspendSample) float64 { return s.Resume }), "ms")
		tab.spread(p+"the resume's load, as the shim reports it", of(func(s suspendSample) float64 { return s.ShimLoadS }), "s")
	}
}
