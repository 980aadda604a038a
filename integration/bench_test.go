package integration

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/vmshim/vmshim/config"
	"github.com/vmshim/vmshim/qemu"
)

// Environment of make bench.
const (
	envBench             = "VMSHIM_BENCH"               // 1 to run TestBench
	envBenchOut          = "VMSHIM_BENCH_OUT"           // directory for bench.json and density.svg
	envBenchDensity      = "VMSHIM_BENCH_DENSITY"       // pod counts of the density runs, "1,10,25,50" by default
	envBenchRuns         = "VMSHIM_BENCH_RUNS"          // samples of each start and teardown figure, 5 by default
	envBenchOnly         = "VMSHIM_BENCH_ONLY"          // the sections to run, comma-separated; all by default
	envBenchPacing       = "VMSHIM_BENCH_PACING"        // pod counts of the pacing runs, "1,10,25,50" by default
	envBenchPacingRepeat = "VMSHIM_BENCH_PACING_REPEAT" // runs with pacing on of the largest count, 3 by default
)

// The sections of the bench, in the order they run.
const (
	sectionStart   = "start"   // VM pod starts, their memory and teardown; jail, microvm, firmware, bare QEMU
	sectionRunc    = "runc"    // the runc shim's memory
	sectionDensity = "density" // pods started at once
	sectionCold    = "cold"    // pods started at once from an image not unpacked
	sectionPacing  = "pacing"  // disk-boot pods started at once, with boot pacing off and on
	sectionSuspend = "suspend" // VMs suspended onto a volume at a stop and resumed
	sectionMemory  = "memory"  // idle VM pods' host memory, the balloon giving freed memory back, KSM
	sectionBurst   = "burst"   // a Deployment of VM pods scaled 0 → N → 0 through a real kubelet
)

// More markers of the test guest (integration/guest/init.sh).
const (
	benchMarkUptime = "VMSHIM-GUEST-UPTIME"
	benchMarkLease  = "VMSHIM-LEASE"
	benchMarkHTTP   = "VMSHIM-HTTP-READY"
	benchMarkPanic  = "Kernel panic - not syncing"
)

// errBenchGuestPanic is a guest kernel's panic during boot.
var errBenchGuestPanic = errors.New("guest kernel panicked")

// TestBench measures what a VM pod costs next to bare QEMU and runc: start
// latency, shim and host memory, density, teardown, boots at once with
// and without boot pacing, suspend and resume, memory given back by the
// balloon and merged by KSM, bursts through the kubelet. It prints a
// table and writes bench.json and density.svg. It asserts no timing: it
// fails only when something it measures does not run.
func TestBench(t *testing.T) {
	if os.Getenv(envBench) != "1" {
		t.Skipf("set %s=1 to run the benchmark (make bench does)", envBench)
	}
	outDir := cmp.Or(os.Getenv(envBenchOut), filepath.Join("..", "_output", "bench"))
	runs, sizes := envInts(t, envBenchRuns, "5"), envInts(t, envBenchDensity, "1,10,25,50")
	pacing, pacingRepeat := envInts(t, envBenchPacing, "1,10,25,50"), envInts(t, envBenchPacingRepeat, "3")
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Minute)
	defer cancel()
	r, began, c := newBenchReport(runs[0], envSections(t)), time.Now(), newCRI(t, env.daemon)

	if r.ran(sectionStart) {
		r.BareArgv = benchStarts(ctx, t, c, runs[0], r)
	}
	if r.ran(sectionRunc) {
		r.RuncShim, r.RuncNote = benchRuncShim(ctx, t)
	} else {
		r.RuncNote = "not run (" + envBenchOnly + ")"
	}
	if r.ran(sectionDensity) {
		for _, n := range sizes {
			r.Density = append(r.Density, benchDensity(ctx, t, c, "density", n))
		}
	}
	if r.ran(sectionCold) {
		r.Cold = benchCold(ctx, t, c, coldPods)
	}
	if r.ran(sectionPacing) {
		r.Pacing = benchPacing(ctx, t, c, pacing, pacingRepeat[0])
	}
	if r.ran(sectionSuspend) {
		r.Suspend = benchSuspend(ctx, t, c, runs[0])
	}
	if r.ran(sectionMemory) {
		r.Memory = benchMemory(ctx, t, c)
	}
	if r.ran(sectionBurst) {
		r.Burst = startKube(t).bursts(t, envInts(t, envKubeBurst, "10,20,30"))
	}
	r.Seconds = time.Since(began).Seconds()
	if err := r.write(outDir); err != nil {
		t.Errorf("write results: %v", err)
	}
}

// benchStarts starts kernel:wait VM pods 2×runs times after a warm-up,
// each followed by a boot of bare QEMU with the same argv for a paired
// comparison. Each run's first pod also gives the idle pod's memory and a
// graceful teardown, its second a forced teardown. It returns the argv.
func benchStarts(ctx context.Context, t *testing.T, c *cri, runs int, r *benchReport) []string {
	warm, err := bootBenchVM(ctx, t, c, "bench-warmup", runtimeHandler, imageKernelWait, nil, markerBooted)
	if err != nil {
		t.Fatalf("warm-up pod: %v\ncontainerd log:\n%s", err, c.d.logTail())
	}
	if _, err := warm.teardown(ctx, t, 0); err != nil {
		t.Errorf("warm-up teardown: %v", err)
	}
	var argv []string
	for i := 0; i < runs; i++ {
		for _, graceful := range []bool{true, false} {
			v, err := bootBenchVM(ctx, t, c, fmt.Sprintf("bench-%d-%v", i, graceful), runtimeHandler, imageKernelWait, nil, markerBooted, benchMarkUptime, benchMarkLease, benchMarkHTTP)
			if err != nil {
				t.Errorf("start pod: %v", err)
				continue
			}
			start, timeout, samples := v.startSample(), int64(0), &r.Forced
			if graceful {
				timeout, samples = 30, &r.Graceful
				if argv == nil {
					if argv, err = bareArgv(v.qemuPid, t.TempDir()); err != nil {
						t.Errorf("bare QEMU argv: %v", err)
					}
				}
				time.Sleep(2 * time.Second) // let the guest settle after its last marker
				if m, err := v.memory(ctx, t); err != nil {
					t.Errorf("pod memory: %v", err)
				} else {
					r.PodMemory = append(r.PodMemory, m)
				}
			}
			if s, err := v.teardown(ctx, t, timeout); err != nil {
				t.Errorf("teardown: %v", err)
			} else {
				*samples = append(*samples, s)
			}
			if argv != nil {
				if start.Bare, err = bareBoot(ctx, argv); err != nil {
					t.Errorf("bare QEMU: %v", err)
				}
			}
			r.Start = append(r.Start, start)
		}
	}
	// The same starts with config jail = false: what the jail costs.
	for i := 0; i < runs; i++ {
		v, err := bootBenchVM(ctx, t, c, fmt.Sprintf("bench-nojail-%d", i), noJailHandler, imageKernelWait, nil, markerBooted, benchMarkUptime)
		if err != nil {
			t.Errorf("start pod without the jail: %v", err)
			continue
		}
		r.StartNoJail = append(r.StartNoJail, v.startSample())
		if _, err := v.teardown(ctx, t, 0); err != nil {
			t.Errorf("teardown: %v", err)
		}
	}
	// The same kernel boots on the microvm machine, and one's memory.
	for i := 0; i < runs; i++ {
		v, err := bootBenchVM(ctx, t, c, fmt.Sprintf("bench-microvm-%d", i), runtimeHandler, imageKernelWait,
			withAnnotations(map[string]string{config.AnnotationMachine: config.MachineMicroVM}), markerBooted, benchMarkUptime, benchMarkLease)
		if err != nil {
			t.Errorf("start microvm pod: %v", err)
			continue
		}
		r.StartMicroVM = append(r.StartMicroVM, v.startSample())
		if i == 0 {
			time.Sleep(2 * time.Second) // as the q35 pods' memory is measured
			if m, err := v.memory(ctx, t); err != nil {
				t.Errorf("microvm pod memory: %v", err)
			} else {
				r.MicroVMMemory = append(r.MicroVMMemory, m)
			}
		}
		if _, err := v.teardown(ctx, t, 0); err != nil {
			t.Errorf("teardown: %v", err)
		}
	}
	// Disk boots through each firmware: SeaBIOS, and OVMF (the cost of UEFI).
	for i := 0; i < runs; i++ {
		for _, fw := range []struct {
			name  string
			image string
			ann   map[string]string
			to    *[]startSample
		}{{"bios", imageDiskWait, nil, &r.StartBIOS}, {"uefi", imageDiskUEFI, map[string]string{annotationFirmware: "uefi"}, &r.StartUEFI}} {
			// Each pod has a log directory of its own: a marker in another
			// pod's log would end the wait at once.
			v, err := bootBenchVM(ctx, t, c, fmt.Sprintf("bench-fw-%s-%d", fw.name, i), runtimeHandler, fw.image, withAnnotations(fw.ann), markerBooted, benchMarkUptime)
			if err != nil {
				t.Errorf("start disk pod: %v", err)
				continue
			}
			*fw.to = append(*fw.to, v.startSample())
			if _, err := v.teardown(ctx, t, 0); err != nil {
				t.Errorf("teardown: %v", err)
			}
		}
	}
	return argv
}

// benchVM is a pod started for the benchmark, with the times of the CRI
// calls that started it.
type benchVM struct {
	p       *pod
	ct      *criContainer
	qemuPid int // 0 for a runc pod

	run0, run1, create0, create1, start1, qemuStart time.Time
	marks                                           map[string]logLine // a marker's first line; "" is the log's first line
}

// bootBenchVM runs a pod sandbox with the runtime handler given ("" is
// runc), starts a container of image in it, its config changed by edit
// (nil for none), with the calls the kubelet makes and waits for the
// markers on its console. It reports failure rather than failing the
// test, so goroutines may call it; a pod that fails is removed at once (a
// guest that panicked spins on the CPU).
func bootBenchVM(ctx context.Context, t *testing.T, c *cri, name, handler, image string, edit func(*runtimeapi.ContainerConfig), markers ...string) (_ *benchVM, retErr error) {
	uid := uniqueID(t)
	cfg := &runtimeapi.PodSandboxConfig{
		Metadata:     &runtimeapi.PodSandboxMetadata{Name: name, Uid: uid, Namespace: "default"},
		Hostname:     name,
		LogDirectory: filepath.Join(c.logDir, name),
		Linux:        &runtimeapi.LinuxPodSandboxConfig{CgroupParent: podCgroupBase + "/pod" + uid},
	}
	v := &benchVM{run0: time.Now()}
	resp, err := c.runtime.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: cfg, RuntimeHandler: handler})
	if v.run1 = time.Now(); err != nil {
		return nil, fmt.Errorf("RunPodSandbox %s: %w", name, err)
	}
	v.p = &pod{c: c, id: resp.PodSandboxId, name: name, config: cfg, cgroup: &podCgroup{path: cfg.Linux.CgroupParent}}
	t.Cleanup(func() { v.p.remove(t) })
	defer func() {
		if retErr != nil {
			v.p.remove(t)
		}
	}()
	ccfg := &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: "c"}, Image: &runtimeapi.ImageSpec{Image: image},
		LogPath: "c.log",
	}
	if edit != nil {
		edit(ccfg)
	}
	v.create0 = time.Now()
	created, err := c.runtime.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: v.p.id, Config: ccfg, SandboxConfig: cfg})
	if v.create1 = time.Now(); err == nil {
		v.ct = &criContainer{p: v.p, id: created.ContainerId, log: filepath.Join(cfg.LogDirectory, ccfg.LogPath)}
		_, err = c.runtime.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: v.ct.id})
	}
	if v.start1 = time.Now(); err != nil {
		return nil, fmt.Errorf("start container in %s: %w", name, err)
	}
	if handler == runtimeHandler || handler == noJailHandler || handler == unpacedHandler { // the CRI creates the task, and so QEMU, in StartContainer
		if v.qemuPid, err = pidOf("guest=" + v.ct.id); err == nil {
			v.qemuStart, err = processStart(v.qemuPid)
		}
		if err != nil {
			return nil, err
		}
	}
	for len(markers) > 0 {
		v.marks, err = logMarks(v.ct.log, append(markers[:len(markers):len(markers)], benchMarkPanic))
		if p, ok := v.marks[benchMarkPanic]; ok {
			return nil, fmt.Errorf("pod %s: %w: %s", name, errBenchGuestPanic, p.text)
		}
		if err == nil && len(v.marks) == len(markers)+1 {
			break
		}
		select {
		case <-ctx.Done():
			data, _ := os.ReadFile(v.ct.log)
			return nil, fmt.Errorf("pod %s: log never showed %v: %w; its last line: %s", name, markers, ctx.Err(), lastLine(string(data)))
		case <-time.After(50 * time.Millisecond):
		}
	}
	return v, nil
}

// withAnnotations is a container config edit that sets its annotations.
func withAnnotations(ann map[string]string) func(*runtimeapi.ContainerConfig) {
	return func(cfg *runtimeapi.ContainerConfig) { cfg.Annotations = ann }
}

// teardown stops and removes the pod as the kubelet does, StopContainer
// with the timeout given (0 forces), and times each call and the time
// from QEMU's exit (polled every 5 ms) to RemovePodSandbox's return.
func (v *benchVM) teardown(ctx context.Context, t *testing.T, timeout int64) (s teardownSample, err error) {
	exited := make(chan time.Time, 1)
	watch, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		for watch.Err() == nil {
			if st, err := procStat(v.qemuPid); err != nil || st[0] == "Z" {
				exited <- time.Now()
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	rt, at := v.p.c.runtime, []time.Time{time.Now()}
	if _, err = rt.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: v.ct.id, Timeout: timeout}); err == nil {
		at = append(at, time.Now())
		_, err = rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: v.p.id})
	}
	if err == nil {
		at = append(at, time.Now())
		_, err = rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: v.p.id})
	}
	if err != nil {
		return s, fmt.Errorf("pod %s: %w", v.p.name, err)
	}
	at = append(at, time.Now())
	v.p.removed = true
	v.p.cgroup.remove(t)
	s = teardownSample{StopContainer: millis(at[1].Sub(at[0])), StopPodSandbox: millis(at[2].Sub(at[1])), RemovePodSandbox: millis(at[3].Sub(at[2]))}
	select {
	case gone := <-exited:
		s.AfterQEMUExit = millis(at[3].Sub(gone))
		return s, nil
	case <-time.After(5 * time.Second):
		return s, fmt.Errorf("QEMU %d still runs after RemovePodSandbox", v.qemuPid)
	}
}

// memory measures the running VM pod: QEMU's resident memory and the part
// of it that is guest RAM, and the shim's and pause process's.
func (v *benchVM) memory(ctx context.Context, t *testing.T) (m podMemory, err error) {
	if err := v.pollStats(ctx); err != nil {
		return m, err
	}
	q, err := processMemory(v.qemuPid, qemuMemMiB(v.qemuPid))
	shim, err2 := pidOf("containerd-shim-vm-v2 -namespace " + criNamespace + " -id " + v.p.id + " ")
	pause, err3 := pidOf("vmshim-pause " + v.p.netnsPath(ctx, t))
	var err4, err5, err6 error
	m.GuestKiB = q.guestKiB
	m.Shim, err4 = smapsRollup(shim)
	m.Pause, err5 = smapsRollup(pause)
	m.QEMU, err6 = smapsRollup(v.qemuPid)
	return m, errors.Join(err, err2, err3, err4, err5, err6)
}

// pollStats asks for the pod's and its container's stats a few times, as
// a kubelet does every few seconds, so that a shim's memory is measured
// as it is on a node, with what serving them maps.
func (v *benchVM) pollStats(ctx context.Context) error {
	rt := v.p.c.runtime
	for range 3 {
		if _, err := rt.ContainerStats(ctx, &runtimeapi.ContainerStatsRequest{ContainerId: v.ct.id}); err != nil {
			return fmt.Errorf("pod %s: ContainerStats: %w", v.p.name, err)
		}
		if _, err := rt.PodSandboxStats(ctx, &runtimeapi.PodSandboxStatsRequest{PodSandboxId: v.p.id}); err != nil {
			return fmt.Errorf("pod %s: PodSandboxStats: %w", v.p.name, err)
		}
	}
	return nil
}

// coldPods is how many pods the cold-image run starts at once.
const coldPods = 10

// benchCold is benchDensity with n pods of an image that is not unpacked:
// the image is removed and imported again without unpacking it, so every
// pod's CreateContainer waits for the one unpack, as on a node that has
// just pulled it.
func benchCold(ctx context.Context, t *testing.T, c *cri, n int) *densityPoint {
	archive := filepath.Join(env.guestDir, "kernel-wait.tar")
	for _, args := range [][]string{
		{"images", "rm", "--sync", imageKernelWait},
		{"images", "import", "--no-unpack", archive},
	} {
		if out, err := c.d.ctrIn(ctx, criNamespace, args...); err != nil {
			t.Errorf("cold image: ctr %v: %v: %s", args, err, out)
			return nil
		}
	}
	pt := benchDensity(ctx, t, c, "cold", n)
	return &pt
}

// benchDensity starts n small VM pods at once, named prefix-n-i, waits
// until all have booted, measures the host memory they take and removes
// them.
func benchDensity(ctx context.Context, t *testing.T, c *cri, prefix string, n int) densityPoint {
	pt := densityPoint{Pods: n}
	before := memAvailableKiB(t)
	ann := map[string]string{"vmshim.io/memory": "128Mi"} // tiny VMs
	vms, errs := make([]*benchVM, n), make([]error, n)
	var wg sync.WaitGroup
	// Under TCG n boots share the host's cores: allow each some time.
	bootCtx, cancel := context.WithTimeout(ctx, bootTimeout+time.Duration(n)*15*time.Second)
	defer cancel()
	t0 := time.Now()
	for i := range n {
		wg.Go(func() {
			vms[i], errs[i] = bootBenchVM(bootCtx, t, c, fmt.Sprintf("%s-%d-%d", prefix, n, i), runtimeHandler, imageKernelWait, withAnnotations(ann), markerBooted)
		})
	}
	wg.Wait()
	var last time.Time
	for i, v := range vms {
		switch {
		case errors.Is(errs[i], errBenchGuestPanic), errors.Is(errs[i], context.DeadlineExceeded): // results, not failures to run
			pt.Failed, pt.NoBoot = pt.Failed+1, pt.NoBoot+1
			t.Logf("density %d: %v", n, errs[i])
		case errs[i] != nil:
			pt.Failed++
			t.Errorf("density %d: %v", n, errs[i])
		case v.marks[markerBooted].at.After(last):
			last = v.marks[markerBooted].at
		}
	}
	vms = slices.DeleteFunc(vms, func(v *benchVM) bool { return v == nil })
	pt.AllReadyS = max(last.Sub(t0).Seconds(), 0)
	time.Sleep(5 * time.Second) // let the guests settle after BOOTED
	pt.MemAvailablePerPodMiB = float64(before-memAvailableKiB(t)) / 1024 / float64(max(n-pt.Failed, 1))
	var total, overhead, measured int
	for _, v := range vms {
		if m, err := v.memory(ctx, t); err != nil {
			t.Errorf("density %d: pod memory: %v", n, err)
		} else {
			total, overhead, measured = total+m.QEMU.PSSKiB+m.Shim.PSSKiB+m.Pause.PSSKiB, overhead+m.overheadKiB(), measured+1
		}
	}
	pt.ProcessesPerPodMiB = float64(total) / 1024 / float64(max(measured, 1))
	pt.OverheadPerPodMiB = float64(overhead) / 1024 / float64(max(measured, 1))
	t1 := time.Now()
	for _, v := range vms {
		wg.Go(func() {
			if _, err := v.teardown(ctx, t, 0); err != nil {
				t.Errorf("density %d: teardown: %v", n, err)
			}
		})
	}
	wg.Wait()
	pt.TeardownS = time.Since(t1).Seconds()
	return pt
}

// bareArgv derives, from the argv of a QEMU the shim started, an argv
// that boots the same guest with no passed fd, QMP monitor, NIC, jail or
// -S: the console goes to stdout; the files it names (in its jail, or in
// fd sets) are copied to dir, and its sockets placed there.
func bareArgv(pid int, dir string) ([]string, error) {
	argv, err := procCmdline(pid)
	if err != nil {
		return nil, err
	}
	fileOfSet, err := fdSetFiles(pid, argv)
	if err != nil {
		return nil, err
	}
	out := []string{argv[0]}
	for i := 1; i < len(argv); i++ {
		flag, val := argv[i], ""
		if flag != "-nodefaults" && flag != "-no-user-config" && flag != "-S" {
			i++
			val = argv[i]
		}
		id := optValue(val, "id")
		switch {
		case flag == "-S" || flag == "-mon" || flag == "-netdev" || flag == "-add-fd",
			flag == "-device" && optValue(val, "netdev") != "",
			flag == "-chardev" && id == qemu.QMPChardev:
			continue
		case flag == "-chardev" && id == qemu.ConsoleChardev:
			val = "stdio,id=" + id + ",signal=off"
		case flag == "-chardev" && optValue(val, "fd") != "":
			val = "socket,id=" + id + ",path=" + filepath.Join(dir, id+".sock") + ",server=on,wait=off"
		}
		for _, p := range hostPath.FindAllString(val, -1) {
			src := p
			if f, ok := fileOfSet[p]; ok {
				src = f
			} else if _, err := os.Stat(fmt.Sprintf("/proc/%d/root%s", pid, p)); err == nil {
				src = fmt.Sprintf("/proc/%d/root%s", pid, p) // in QEMU's jail
			}
			dst := filepath.Join(dir, strings.ReplaceAll(strings.TrimPrefix(p, "/"), "/", "-"))
			if st, err := os.Stat(src); err == nil && st.Mode().IsRegular() {
				data, err := os.ReadFile(src)
				if err == nil {
					err = os.WriteFile(dst, data, 0o600)
				}
				if err != nil {
					return nil, err
				}
			}
			val = strings.ReplaceAll(val, p, dst) // a socket QEMU makes
		}
		if out = append(out, flag); val != "" {
			out = append(out, val)
		}
	}
	return out, nil
}

// fdSetFiles maps the fd set QEMU's argv files ("/dev/fdset/N") to the
// host path of its file. QEMU keeps a duplicate of each -add-fd fd and
// closes the one it inherited, whose number may then be reused; the
// drive opens the set again. The file is the one regular file QEMU holds,
// however many times. The bench's kernel guest has one
// fd set (the seed); more than one cannot be told apart this way.
func fdSetFiles(pid int, argv []string) (map[string]string, error) {
	var sets []string
	for i := 1; i+1 < len(argv); i++ {
		if argv[i] == "-add-fd" {
			sets = append(sets, qemu.FDSetPath(atoiOr(optValue(argv[i+1], "set"))))
		}
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return nil, err
	}
	var files []string
	for _, fd := range fds {
		target, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if err != nil || !filepath.IsAbs(target) {
			continue // a socket, pipe or anonymous inode
		}
		if st, err := os.Stat(target); err == nil && st.Mode().IsRegular() && !slices.Contains(files, target) {
			files = append(files, target)
		}
	}
	if len(sets) > 1 || len(files) != len(sets) {
		return nil, fmt.Errorf("qemu %d holds regular files %q for fd sets %q", pid, files, sets)
	}
	out := map[string]string{}
	for i, set := range sets {
		out[set] = files[i]
	}
	return out, nil
}

// atoiOr is the number s holds, or -1.
func atoiOr(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		return -1
	}
	return n
}

// hostPath matches the absolute paths in a QEMU argument.
var hostPath = regexp.MustCompile(`/[^,"=]+`)

// optValue returns the value of key in a QEMU option list "a=1,b=2".
func optValue(opts, key string) string {
	for _, o := range strings.Split(opts, ",") {
		if k, v, ok := strings.Cut(o, "="); ok && k == key {
			return v
		}
	}
	return ""
}

// bareBoot runs QEMU with argv until the guest prints its uptime after
// VMSHIM-GUEST-BOOTED and times its first console line and BOOTED from
// the exec. QEMU runs in a cgroup next to the pods', so that it competes
// for the CPU as their QEMUs do (with one weight for all their parent's).
func bareBoot(ctx context.Context, argv []string) (*bareSample, error) {
	ctx, cancel := context.WithTimeout(ctx, bootTimeout)
	defer cancel()
	cg := filepath.Join(cgroupRoot, "cpu", podCgroupBase, "bench-bare")
	if err := os.MkdirAll(cg, 0o755); err != nil {
		return nil, err
	}
	defer os.Remove(cg) // after QEMU is reaped
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	t0 := time.Now()
	if err == nil {
		err = cmd.Start()
	}
	if err != nil {
		return nil, err
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	if err := os.WriteFile(filepath.Join(cg, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0); err != nil {
		return nil, err
	}
	s := &bareSample{}
	for sc := bufio.NewScanner(stdout); sc.Scan(); {
		at := millis(time.Since(t0))
		if s.FirstConsole == 0 {
			s.FirstConsole = at
		}
		if line := sc.Text(); strings.Contains(line, markerBooted) {
			s.Ready = at
		} else if strings.Contains(line, benchMarkUptime) {
			s.GuestUptime = guestUptime(line)
			return s, nil
		}
	}
	_ = cmd.Wait() // the console ended: QEMU exited, and its stderr is complete
	return nil, fmt.Errorf("console ended before %s\nstderr: %s", benchMarkUptime, stderr.String())
}

// benchRuncShim runs a busybox pod with runc, through a daemon of its own
// (its pause image must run), and measures the containerd-shim-runc-v2
// serving it. Without runc or that shim it says so instead.
func benchRuncShim(ctx context.Context, t *testing.T) (*rollup, string) {
	dir := os.Getenv(envContainerd)
	for _, bin := range []string{"runc", filepath.Join(dir, "containerd-shim-runc-v2")} {
		if _, err := exec.LookPath(bin); err != nil {
			return nil, bin + " is not installed"
		}
	}
	fail := func(what string, err error) (*rollup, string) {
		t.Errorf("runc pod: %s: %v", what, err)
		return nil, what + " failed"
	}
	d, err := startDaemon(dir, env.binDir, daemonOptions{cni: bridgeCNI})
	if err != nil {
		return fail("its daemon", err)
	}
	defer d.stop()
	archive := filepath.Join(d.dir, "busybox.tar")
	if err := writeBusyboxArchive(archive, pauseImage); err != nil {
		return fail("the busybox image", err)
	}
	if out, err := d.ctrIn(ctx, criNamespace, "images", "import", archive); err != nil {
		return fail("the busybox image", fmt.Errorf("%w: %s", err, out))
	}
	v, err := bootBenchVM(ctx, t, newCRI(t, d), "bench-runc", "", pauseImage, nil)
	if err != nil {
		return fail("its start", fmt.Errorf("%w\ncontainerd log:\n%s", err, d.logTail()))
	}
	defer v.p.remove(t) // before the daemon stops
	time.Sleep(2 * time.Second)
	var m rollup
	if err := v.pollStats(ctx); err != nil {
		return fail("its stats", err)
	}
	pid, err := pidOf("containerd-shim-runc-v2 -namespace " + criNamespace + " -id " + v.p.id + " ")
	if err == nil {
		m, err = smapsRollup(pid)
	}
	if err != nil {
		return fail("its shim", err)
	}
	return &m, ""
}

// writeBusyboxArchive writes an image whose /vm (the image's command) is a
// busybox script that sleeps: a pause image runc can run, and a container
// image.
func writeBusyboxArchive(dst, ref string) error {
	busybox, err := os.ReadFile("/bin/busybox")
	if err != nil {
		return err
	}
	return writeLinkArchive(dst, ref, map[string]layerEntry{
		"bin/busybox": layerProgram(busybox),
		"vm":          layerProgram([]byte("#!/bin/busybox sh\nexec /bin/busybox sleep 2147483647\n")),
	})
}
