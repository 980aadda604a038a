package integration

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// daemon is a private containerd in a network namespace of its own, so
// nothing the tests do reaches the host's network.
type daemon struct {
	dir           string // root of everything the daemon writes
	netns         string // name under /run/netns
	address       string
	ctrBin        string
	containerdBin string
	shimDir       string
	config        string
	logPath       string
	cri           bool // it serves the CRI
	ipcns         bool // containerd runs in an IPC namespace of its own

	cmd    *exec.Cmd     // the running containerd, nil when stopped
	waited chan struct{} // closed when cmd has been reaped
}

const daemonConfig = `version = 3
root = %q
state = %q
[grpc]
  address = %q
[ttrpc]
  address = %q
[debug]
  level = "debug"
`

// criConfig enables the CRI with the runtime handler "vm", as
// docs/kubernetes.md tells users to, plus what a test daemon needs: its
// own CNI and netns directories and a local pause image. Root here lacks
// CAP_SYS_RESOURCE, hence restrict_oom_score_adj.
const criConfig = `[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = %q
[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = %q
    max_conf_num = 1
  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.vm]
    runtime_type = "io.containerd.vm.v2"
    pod_annotations = ["vmshim.io/*"]
    container_annotations = ["vmshim.io/*", "io.kubernetes.pod.terminationGracePeriod"]
  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.vm-nojail]
    runtime_type = "io.containerd.vm.v2"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.vm-nojail.options]
      ConfigPath = %q
  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.vm-tight]
    runtime_type = "io.containerd.vm.v2"
    container_annotations = ["vmshim.io/*", "io.kubernetes.pod.terminationGracePeriod"]
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.vm-tight.options]
      ConfigPath = %q
  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.vm-smallcache]
    runtime_type = "io.containerd.vm.v2"
    container_annotations = ["vmshim.io/*", "io.kubernetes.pod.terminationGracePeriod"]
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.vm-smallcache.options]
      ConfigPath = %q
  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.vm-unpaced]
    runtime_type = "io.containerd.vm.v2"
    pod_annotations = ["vmshim.io/*"]
    container_annotations = ["vmshim.io/*", "io.kubernetes.pod.terminationGracePeriod"]
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.vm-unpaced.options]
      ConfigPath = %q
`

// testCacheMax is the disk cache cap of test daemons.
const testCacheMax = "256Mi"

// shimConfig is the part of every shim config of the daemon that keeps
// its shims' files in its directory: the cache of disks fetched by URL.
func (d *daemon) shimConfig() string {
	return fmt.Sprintf("cache_dir = %q\ncache_max_size = %q\n", filepath.Join(d.dir, "disks"), testCacheMax)
}

// smallCacheHandler is a runtime handler whose disk cache (a directory of
// its own) holds little more than one test disk, so that a second one
// makes the cache evict.
const (
	smallCacheHandler = "vm-smallcache"
	smallCacheMax     = "12Mi"
)

// smallCacheDir is the disk cache of smallCacheHandler.
func (d *daemon) smallCacheDir() string { return filepath.Join(d.dir, "disks-small") }

// noJailHandler is a runtime handler whose shim config turns the jail off,
// for the benchmark's comparison only.
const noJailHandler = "vm-nojail"

// unpacedHandler is a runtime handler like "vm" whose shim config turns
// boot pacing off (boot_slots = -1), for the benchmark's comparison only.
const unpacedHandler = "vm-unpaced"

// tightHandler is a runtime handler whose shim config leaves QEMU no
// memory beyond guest RAM (tightConfig), so that a guest filling its RAM
// gets QEMU OOM-killed.
const (
	tightHandler = "vm-tight"
	tightConfig  = "memory_overhead = \"0\"\n"
)

// noCRIConfig disables the CRI for daemons that only serve ctr.
const noCRIConfig = `disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime", "io.containerd.cri.v1.images"]
`

// pauseImage is the sandbox image of test daemons; the shim runs no
// process for it, so its content does not matter.
const pauseImage = "localhost/vmshim-test/pause:1"

// daemonOptions choose what a test daemon serves.
type daemonOptions struct {
	// cni is the CNI network config list (JSON) the CRI uses; empty
	// disables the CRI.
	cni string
	// snapshotterTmpfs, above zero, puts the overlayfs snapshotter's root
	// (image layers and containers' writable layers) on a tmpfs of that
	// many bytes.
	snapshotterTmpfs int64
	// registryHosts has the CRI resolve registries through the hosts.toml
	// files under the daemon's registryDir (one directory per registry
	// host), which the test writes before it pulls.
	registryHosts bool
	// ipcns starts containerd in an IPC namespace of its own, which pods
	// with host IPC share and the test can join (ipcNS); a restart
	// makes a new one.
	ipcns bool
	// nri serves containerd's NRI (Node Resource Interface) on a socket
	// in the daemon's directory (nriSocket) that NRI plugins connect to.
	nri bool
}

// nriConfig enables NRI on a socket of the daemon's own.
const nriConfig = `[plugins."io.containerd.nri.v1.nri"]
  disable = false
  socket_path = %q
`

// nriSocket is the NRI socket of a daemon started with nri.
func (d *daemon) nriSocket() string { return filepath.Join(d.dir, "nri.sock") }

// registryConfig points the CRI's image service at the hosts.toml files
// of registryDir.
const registryConfig = `[plugins."io.containerd.cri.v1.images".registry]
  config_path = %q
`

// registryDir is the CRI's registry config_path of a daemon started with
// registryHosts.
func (d *daemon) registryDir() string { return filepath.Join(d.dir, "certs.d") }

// ipcNS is the IPC namespace containerd runs in.
func (d *daemon) ipcNS() string { return fmt.Sprintf("/proc/%d/ns/ipc", d.cmd.Process.Pid) }

// startDaemon starts containerd with the shim directory on its PATH.
func startDaemon(containerdDir, shimDir string, opts daemonOptions) (_ *daemon, retErr error) {
	dir, err := os.MkdirTemp("", "vmshim-it-")
	if err != nil {
		return nil, err
	}
	d := &daemon{
		dir:     dir,
		netns:   filepath.Base(dir), // unique, like the directory
		address: filepath.Join(dir, "containerd.sock"),
		ctrBin:  filepath.Join(containerdDir, "ctr"),
		logPath: filepath.Join(dir, "containerd.log"),
	}
	defer func() {
		if retErr != nil {
			d.stop()
		}
	}()
	cfg := filepath.Join(dir, "config.toml")
	body := fmt.Sprintf(daemonConfig, filepath.Join(dir, "root"), filepath.Join(dir, "state"), d.address, d.address+".ttrpc")
	if opts.cni == "" {
		body = noCRIConfig + body
	} else {
		cniDir := filepath.Join(dir, "cni")
		if err := os.MkdirAll(cniDir, 0o755); err != nil {
			return nil, err
		}
		conf := strings.ReplaceAll(opts.cni, "@DIR@", dir)
		if err := os.WriteFile(filepath.Join(cniDir, "10-vmshim-test.conflist"), []byte(conf), 0o644); err != nil {
			return nil, err
		}
		noJail, tight := filepath.Join(dir, "nojail.toml"), filepath.Join(dir, "tight.toml")
		if err := os.WriteFile(noJail, []byte(d.shimConfig()+"jail = false\n"), 0o644); err != nil {
			return nil, err
		}
		if err := os.WriteFile(tight, []byte(d.shimConfig()+tightConfig), 0o644); err != nil {
			return nil, err
		}
		small := filepath.Join(dir, "smallcache.toml")
		smallConfig := fmt.Sprintf("cache_dir = %q\ncache_max_size = %q\n", d.smallCacheDir(), smallCacheMax)
		if err := os.WriteFile(small, []byte(smallConfig), 0o644); err != nil {
			return nil, err
		}
		unpaced := filepath.Join(dir, "unpaced.toml")
		if err := os.WriteFile(unpaced, []byte(d.shimConfig()+"boot_slots = -1\n"), 0o644); err != nil {
			return nil, err
		}
		body += fmt.Sprintf(criConfig, pauseImage, cniDir, noJail, tight, small, unpaced)
		if opts.registryHosts {
			if err := os.MkdirAll(d.registryDir(), 0o755); err != nil {
				return nil, err
			}
			body += fmt.Sprintf(registryConfig, d.registryDir())
		}
		if opts.nri {
			body += fmt.Sprintf(nriConfig, d.nriSocket())
		}
		d.cri = true
	}
	if err := os.WriteFile(cfg, []byte(body), 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "shim.toml"), []byte(d.shimConfig()), 0o644); err != nil {
		return nil, err
	}
	if out, err := exec.Command("ip", "netns", "add", d.netns).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("ip netns add: %v: %s", err, out)
	}
	_ = exec.Command("ip", "-n", d.netns, "link", "set", "lo", "up").Run()
	d.config, d.containerdBin, d.shimDir, d.ipcns = cfg, filepath.Join(containerdDir, "containerd"), shimDir, opts.ipcns
	if opts.snapshotterTmpfs > 0 {
		// stop unmounts it with everything else under dir.
		sn := filepath.Join(dir, "root", "io.containerd.snapshotter.v1.overlayfs")
		if err := os.MkdirAll(sn, 0o700); err != nil {
			return nil, err
		}
		if err := syscall.Mount("tmpfs", sn, "tmpfs", 0, fmt.Sprintf("size=%d,mode=0700", opts.snapshotterTmpfs)); err != nil {
			return nil, fmt.Errorf("mount tmpfs on %s: %w", sn, err)
		}
	}
	if err := d.start(); err != nil {
		return nil, err
	}
	return d, nil
}

// start runs the containerd process and waits until it answers.
func (d *daemon) start() error {
	logf, err := os.OpenFile(d.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	// nsenter, not `ip netns exec`, which remounts /sys and hides cgroups.
	d.cmd = exec.Command("nsenter", "--net=/run/netns/"+d.netns, "--", d.containerdBin, "--config", d.config)
	// The shims it starts read shim.toml unless a handler names another.
	d.cmd.Env = append(os.Environ(), "PATH="+d.shimDir+":"+os.Getenv("PATH"), "VMSHIM_CONFIG="+filepath.Join(d.dir, "shim.toml"))
	d.cmd.Stdout, d.cmd.Stderr = logf, logf
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if d.ipcns {
		d.cmd.SysProcAttr.Cloneflags = syscall.CLONE_NEWIPC
	}
	if err := d.cmd.Start(); err != nil {
		return fmt.Errorf("start containerd: %w", err)
	}
	d.waited = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { _ = cmd.Wait(); close(done) }(d.cmd, d.waited)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		if _, err := d.ctr(ctx, "version"); err == nil && d.criReady(ctx) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("containerd did not come up; log %s", d.logPath)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// criReady reports whether the daemon's CRI, if it serves one, answers:
// after a restart it says "server is not initialized yet" for a while
// after containerd's own API is up.
func (d *daemon) criReady(ctx context.Context) bool {
	if !d.cri {
		return true
	}
	conn, err := grpc.NewClient("unix://"+d.address, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return false
	}
	defer conn.Close()
	_, err = runtimeapi.NewRuntimeServiceClient(conn).Status(ctx, &runtimeapi.StatusRequest{})
	return err == nil
}

// stopProcess ends the containerd process only; shims and their VMs go
// on running, as they do when a node restarts containerd.
func (d *daemon) stopProcess() {
	if d.cmd == nil || d.cmd.Process == nil {
		return
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.waited:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-d.cmd.Process.Pid, syscall.SIGKILL)
		<-d.waited
	}
	d.cmd = nil
}

// restart stops and starts containerd with the same state.
func (d *daemon) restart() error {
	d.stopProcess()
	return d.start()
}

// ctr runs the ctr binary against the daemon in the test namespace.
func (d *daemon) ctr(ctx context.Context, args ...string) (string, error) {
	return d.ctrIn(ctx, testNamespace, args...)
}

// ctrIn runs the ctr binary in containerd namespace ns.
func (d *daemon) ctrIn(ctx context.Context, ns string, args ...string) (string, error) {
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, d.ctrBin, append([]string{"-a", d.address, "-n", ns}, args...)...)
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// stop ends containerd and removes its namespace and files.
func (d *daemon) stop() {
	d.stopProcess()
	// Shims outlive containerd by design; a test that failed half-way may
	// leave some (and their VMs) behind. They all name the daemon's dir.
	for _, p := range processesMentioning(d.dir) {
		pid, _, _ := strings.Cut(p, ":")
		if n, err := strconv.Atoi(pid); err == nil {
			_ = syscall.Kill(n, syscall.SIGKILL)
		}
	}
	if os.Getenv("VMSHIM_KEEP") == "" {
		_ = exec.Command("ip", "netns", "delete", d.netns).Run()
		unmountUnder(d.dir)
		_ = os.RemoveAll(d.dir)
	}
}

// unmountUnder unmounts whatever is still mounted below dir.
func unmountUnder(dir string) {
	for _, m := range mountsUnder(dir) {
		_ = syscall.Unmount(m, syscall.MNT_DETACH)
	}
}

// mountsUnder lists mount points at or below dir, deepest first.
func mountsUnder(dir string) []string {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			out = append([]string{f[4]}, out...)
		}
	}
	return out
}

// logTail returns the end of containerd's log, for failure messages.
func (d *daemon) logTail() string {
	data, _ := os.ReadFile(d.logPath)
	if len(data) > 4000 {
		data = data[len(data)-4000:]
	}
	return string(data)
}
