package integration

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	runtimeoptions "github.com/containerd/containerd/api/types/runtimeoptions/v1"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/insomniacslk/dhcp/dhcpv4"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// secUser is the unprivileged user TestSecurityRunAs runs QEMU as.
const secUser = "vmshim-qemu-test"

// Sandbox options of QEMU's -sandbox, as the shim passes them.
const (
	secSandbox      = "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"
	secSandboxRunAs = "on,obsolete=deny,elevateprivileges=allow,spawn=deny,resourcecontrol=deny"
)

// TestSecuritySockets checks that nobody but root reaches a VM's control
// sockets: the runtime dir is root's alone, its QMP and agent sockets are
// root's and not writable by others, a process with another user's file
// system ids cannot connect, and the console is an unnamed socketpair.
func TestSecuritySockets(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	v := startVM(ctx, t, imageKernelWait)
	v.console.waitFor(ctx, t, markerBooted)
	pid, argv := secQEMU(t, v.id)

	sum := sha256.Sum256([]byte(testNamespace + "/" + v.id))
	dir := filepath.Join("/run/vmshim", hex.EncodeToString(sum[:8]))
	if fi, err := os.Stat(dir); err != nil {
		t.Fatalf("runtime dir: %v", err)
	} else if st := fi.Sys().(*syscall.Stat_t); !fi.IsDir() || fi.Mode().Perm() != 0o700 || st.Uid != 0 || st.Gid != 0 {
		t.Errorf("runtime dir %s: mode %v owner %d:%d, want a directory 0700 root:root", dir, fi.Mode(), st.Uid, st.Gid)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	sockets := map[string]bool{}
	for _, e := range entries {
		fi, err := os.Lstat(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		t.Logf("%s: %v %d:%d", e.Name(), fi.Mode(), st.Uid, st.Gid)
		if st.Uid != 0 || fi.Mode().Perm()&0o022 != 0 {
			t.Errorf("%s: mode %v owner %d, want root's and not writable by group or others", e.Name(), fi.Mode(), st.Uid)
		}
		sockets[e.Name()] = fi.Mode()&os.ModeSocket != 0
	}
	for _, name := range []string{"qmp.sock", "agent.sock"} {
		if !sockets[name] {
			t.Errorf("runtime dir has no socket %s: %v", name, sockets)
		}
	}

	uid, gid := secIDs(t, "nobody")
	// A socket anyone may use proves that connecting as nobody works.
	open := secOpenSocket(t)
	if err := secAsUser(uid, gid, func() error { return secConnect(open) }); err != nil {
		t.Fatalf("connect to an open socket as nobody: %v", err)
	}
	for _, name := range []string{"qmp.sock", "agent.sock"} {
		err := secAsUser(uid, gid, func() error { return secConnect(filepath.Join(dir, name)) })
		if !errors.Is(err, unix.EACCES) {
			t.Errorf("connect to %s as nobody: %v, want permission denied", name, err)
		}
	}

	// The console: an fd QEMU inherited, a socket bound to no path.
	console := ""
	for i, a := range argv {
		if strings.Contains(a, "path=") && !strings.Contains(a, "path="+dir+"/") {
			t.Errorf("argv names a path outside the runtime dir: %q", a)
		}
		if i > 0 && argv[i-1] == "-chardev" && strings.HasPrefix(a, "socket,id=console,") {
			console = a
		}
		if i > 0 && argv[i-1] == "-serial" && a != "chardev:console" {
			t.Errorf("-serial %q, want chardev:console", a)
		}
	}
	fd, err := strconv.Atoi(strings.TrimPrefix(console, "socket,id=console,fd="))
	if err != nil {
		t.Fatalf("console chardev %q is not socket,id=console,fd=N", console)
	}
	if secSocketNamed(t, pid, fd) {
		t.Errorf("console socket (fd %d) or its peer has an address; want a socketpair with none", fd)
	}
	v.remove(t)
	assertNothingLeft(ctx, t, v.id)
}

// TestSecuritySandbox checks that QEMU runs under its seccomp sandbox with
// the default config.
func TestSecuritySandbox(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	v := startVM(ctx, t, imageKernelWait)
	v.console.waitFor(ctx, t, markerBooted)
	pid, argv := secQEMU(t, v.id)
	if !secHasPair(argv, "-sandbox", secSandbox) {
		t.Errorf("argv lacks -sandbox %s: %q", secSandbox, argv)
	}
	st := secStatus(t, pid)
	for k, want := range map[string]string{"Seccomp": "2", "NoNewPrivs": "1"} {
		if st[k] != want {
			t.Errorf("/proc/%d/status %s: %q, want %q", pid, k, st[k], want)
		}
	}
	v.remove(t)
	assertNothingLeft(ctx, t, v.id)
}

// TestSecurityRunAs checks config qemu_user: QEMU opens its files, sockets
// and fds as root, then runs as that user with no capability, still under
// its sandbox, and the VM works: it boots from a kernel or a disk (overlay
// and backing file), powers down on ACPI, and serves exec through its agent.
func TestSecurityRunAs(t *testing.T) {
	secEnsureUser(t)
	uid, gid := secIDs(t, secUser)
	cfgPath := filepath.Join(t.TempDir(), "shim.toml")
	if err := os.WriteFile(cfgPath, []byte(fmt.Sprintf("qemu_user = %q\n", secUser)), 0o644); err != nil {
		t.Fatal(err)
	}
	opts := &runtimeoptions.Options{ConfigPath: cfgPath}
	for name, ref := range map[string]string{"kernel": imageKernelWait, "disk": imageDiskWait} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
			defer cancel()
			v, err := createVM(ctx, t, uniqueID(t), ref, opts)
			if err != nil {
				t.Fatalf("create: %v\ncontainerd log:\n%s", err, env.daemon.logTail())
			}
			v.start(ctx, t)
			v.console.waitFor(ctx, t, markerBooted)
			pid := secCheckRunAs(t, v.id, uid, gid)
			if name == "disk" {
				secCheckDiskFiles(t, pid, uid, gid)
			}
			if err := v.task.Kill(ctx, syscall.SIGTERM); err != nil {
				t.Fatalf("kill SIGTERM: %v", err)
			}
			if code := v.waitExit(ctx, t); code != 0 || !strings.Contains(v.console.String(), markerACPI) {
				t.Errorf("exit %d after SIGTERM, want 0 after %s\nconsole:\n%s", code, markerACPI, v.console.String())
			}
			v.remove(t)
			assertNothingLeft(ctx, t, v.id)
		})
	}
	t.Run("agent", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*bootTimeout)
		defer cancel()
		v, err := createVM(ctx, t, uniqueID(t), imageKernelAgent, opts)
		if err != nil {
			t.Fatalf("create: %v", err)
		}
		v.start(ctx, t)
		v.console.waitFor(ctx, t, markerAgent)
		v.console.waitFor(ctx, t, markerBooted)
		secCheckRunAs(t, v.id, uid, gid)
		// Each exec connects to the agent socket anew.
		for i := range 3 {
			if out := secExec(ctx, t, v, fmt.Sprintf("e%d", i), "echo", "run-as-"+strconv.Itoa(i)); out != fmt.Sprintf("run-as-%d\n", i) {
				t.Errorf("exec %d: %q", i, out)
			}
		}
		v.remove(t)
		assertNothingLeft(ctx, t, v.id)
	})
	t.Run("unknown user", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
		defer cancel()
		bad := filepath.Join(t.TempDir(), "shim.toml")
		if err := os.WriteFile(bad, []byte("qemu_user = \"vmshim-no-such-user\"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		id := uniqueID(t)
		v, err := createVM(ctx, t, id, imageKernelWait, &runtimeoptions.Options{ConfigPath: bad})
		if err == nil || !strings.Contains(err.Error(), `qemu_user: user "vmshim-no-such-user" does not exist`) {
			t.Errorf("create with an unknown qemu_user: %v, want an error naming qemu_user", err)
		}
		v.remove(t)
		assertNothingLeft(ctx, t, id)
	})
}

// secCheckRunAs checks that VM id's QEMU runs as uid:gid, with no
// capability, under the sandbox that allows -runas, and returns its pid.
func secCheckRunAs(t *testing.T, id string, uid, gid int) int {
	t.Helper()
	pid, argv := secQEMU(t, id)
	if !secHasPair(argv, "-runas", secUser) || !secHasPair(argv, "-sandbox", secSandboxRunAs) {
		t.Errorf("argv lacks -runas %s or -sandbox %s: %q", secUser, secSandboxRunAs, argv)
	}
	st := secStatus(t, pid)
	// Real, effective, saved and file system ids.
	ids := func(n int) string { return strings.TrimSpace(strings.Repeat(strconv.Itoa(n)+" ", 4)) }
	for k, want := range map[string]string{
		"Uid": ids(uid), "Gid": ids(gid), "CapEff": "0000000000000000", "CapPrm": "0000000000000000",
		"Seccomp": "2", "NoNewPrivs": "1",
	} {
		if got := strings.Join(strings.Fields(st[k]), " "); got != want {
			t.Errorf("/proc/%d/status %s: %q, want %q", pid, k, st[k], want)
		}
	}
	return pid
}

// secExec runs a command in the VM through containerd's task API and
// returns its stdout.
func secExec(ctx context.Context, t *testing.T, v *vm, execID string, args ...string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	proc, err := v.task.Exec(ctx, execID, &specs.Process{Args: args, Cwd: "/"}, cio.NewCreator(cio.WithStreams(nil, &stdout, &stderr)))
	if err != nil {
		t.Fatalf("exec %s: %v", execID, err)
	}
	defer proc.Delete(ctx)
	statusC, err := proc.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := proc.Start(ctx); err != nil {
		t.Fatalf("exec %s start: %v", execID, err)
	}
	st := <-statusC
	proc.IO().Wait()
	if code, _, err := st.Result(); err != nil || code != 0 {
		t.Errorf("exec %s: exit %d, %v, stderr %q", execID, code, err, stderr.String())
	}
	return stdout.String()
}

// secCheckDiskFiles checks that QEMU holds the root overlay and its
// backing file open, and that its user could not have opened the overlay
// itself: QEMU opened them before it dropped root.
func secCheckDiskFiles(t *testing.T, pid, uid, gid int) {
	t.Helper()
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	var overlay, backing string
	for _, fd := range fds {
		target, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		switch {
		case strings.HasSuffix(target, "/.vmshim/root.qcow2"):
			overlay = target
		case strings.Contains(target, "/disk/"):
			backing = target
		}
	}
	if overlay == "" || backing == "" {
		t.Fatalf("qemu holds overlay %q and backing file %q open, want both", overlay, backing)
	}
	err = secAsUser(uid, gid, func() error {
		f, err := os.OpenFile(overlay, os.O_RDWR, 0)
		if err == nil {
			f.Close()
		}
		return err
	})
	if !errors.Is(err, os.ErrPermission) {
		t.Errorf("open %s as %s: %v, want permission denied", overlay, secUser, err)
	}
}

// TestSecurityAnnotationInjection checks that values from annotations,
// names and the host name reach QEMU as parts of single arguments, never
// as options of their own.
func TestSecurityAnnotationInjection(t *testing.T) {
	const cmdline = "quiet -device foo x,id=y vmshim.test.word=a,b"
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	c := newCRI(t, env.daemon)
	// CNI itself refuses a pod name with a comma; the host name may have one.
	p := secRunPod(ctx, t, c, "sec-inject", "host,id=evil")
	vm := p.createVMWith(ctx, t, imageKernelWaitCRI, func(cfg *runtimeapi.ContainerConfig) {
		cfg.Metadata.Name = "vm,id=evil"
		cfg.Annotations = map[string]string{annotationKernelCmdline: cmdline}
	})
	if _, err := c.runtime.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: vm.id}); err != nil {
		t.Fatalf("StartContainer: %v", err)
	}
	line := vm.waitLog(ctx, t, markerCmdline)
	if !strings.Contains(line, cmdline) {
		t.Errorf("guest command line %q lacks %q", line, cmdline)
	}
	_, argv := secQEMU(t, vm.id)
	devices := map[string]bool{"pvpanic": true, "virtio-serial-pci": true, "virtserialport": true, "virtio-blk-pci": true,
		"virtio-net-pci": true, "scsi-hd": true, "virtio-scsi-pci": true, "nvme": true}
	appended := 0
	for i, a := range argv {
		if strings.Contains(a, "evil") {
			t.Errorf("argv element %q carries a name or host name", a)
		}
		if a == "foo" || strings.HasPrefix(a, "x,") || strings.HasPrefix(a, "id=") {
			t.Errorf("argv element %q split from the annotation", a)
		}
		if i == 0 {
			continue
		}
		switch argv[i-1] {
		case "-append":
			appended++
			if !strings.HasSuffix(a, " "+cmdline) {
				t.Errorf("-append %q does not end with the annotation %q", a, cmdline)
			}
		case "-device":
			if driver, _, _ := strings.Cut(a, ","); !devices[driver] {
				t.Errorf("unexpected -device %q", a)
			}
		}
	}
	if appended != 1 {
		t.Errorf("%d -append options, want 1: %q", appended, argv)
	}
	vm.waitLog(ctx, t, markerBooted)
	p.remove(t)
	assertNothingLeftCRI(t, vm.id)
}

// secRunPod runs a pod sandbox, as runPod does, with its own host name.
func secRunPod(ctx context.Context, t *testing.T, c *cri, name, hostname string) *pod {
	t.Helper()
	uid := uniqueID(t)
	pc := newPodCgroup(t, "pod"+uid, 0)
	cfg := &runtimeapi.PodSandboxConfig{
		Metadata:     &runtimeapi.PodSandboxMetadata{Name: name, Uid: uid, Namespace: "default"},
		Hostname:     hostname,
		LogDirectory: filepath.Join(c.logDir, name),
		Linux:        &runtimeapi.LinuxPodSandboxConfig{CgroupParent: pc.path},
	}
	resp, err := c.runtime.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: cfg, RuntimeHandler: runtimeHandler})
	if err != nil {
		pc.remove(t)
		t.Fatalf("RunPodSandbox: %v", err)
	}
	p := &pod{c: c, id: resp.PodSandboxId, name: name, config: cfg, cgroup: pc}
	t.Cleanup(func() { p.remove(t) })
	return p
}

// TestSecurityDHCPIsolation runs two VM pods on the shared bridge: no DHCP
// frame reaches the bridge's network namespace, and in each pod's netns
// every DHCP reply comes from that pod's own responder (its gateway as
// server id) and offers that pod's IP to its guest's MAC.
func TestSecurityDHCPIsolation(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*bootTimeout)
	defer cancel()
	const gateway = "10.88.0.1"
	c := newCRI(t, env.daemon)
	pods := []*pod{c.runPod(ctx, t, "sec-dhcp-a"), c.runPod(ctx, t, "sec-dhcp-b")}
	bridge := secSniff(t, "/run/netns/"+env.daemon.netns)
	sniffers := make([]*secSniffer, len(pods))
	macs := make([]string, len(pods))
	for i, p := range pods {
		ns := p.netnsPath(ctx, t)
		sniffers[i] = secSniff(t, ns)
		if err := inNetns(ns, func() error {
			ifc, err := net.InterfaceByName("eth0")
			if err == nil {
				macs[i] = ifc.HardwareAddr.String()
			}
			return err
		}); err != nil {
			t.Fatalf("pod %s eth0: %v", p.name, err)
		}
	}
	vms := []*criContainer{pods[0].startVM(ctx, t, imageKernelWaitCRI, nil), pods[1].startVM(ctx, t, imageKernelWaitCRI, nil)}
	ips := make([]string, len(pods))
	for i, vm := range vms {
		ips[i] = pods[i].ip(ctx, t)
		lease := leaseFields(vm.waitLog(ctx, t, "VMSHIM-LEASE"))
		if lease["ip"] != ips[i] || lease["router"] != gateway {
			t.Errorf("pod %s (%s): lease %v, want its own IP via %s", pods[i].name, ips[i], lease, gateway)
		}
		vm.waitLog(ctx, t, "VMSHIM-HTTP-READY")
	}
	if ips[0] == ips[1] {
		t.Fatalf("both pods have IP %s", ips[0])
	}
	for _, f := range bridge.stop() {
		t.Errorf("DHCP frame in the bridge's network namespace, on ifindex %d: %s", f.ifindex, f.msg.Summary())
	}
	// The guests' gateway pings cross the bridge: the capture was live.
	if bridge.frames == 0 {
		t.Errorf("the bridge's network namespace sniffer saw no frame at all")
	}
	for i, s := range sniffers {
		acks := 0
		for _, f := range s.stop() {
			m := f.msg
			if m.OpCode != dhcpv4.OpcodeBootReply {
				if m.ClientHWAddr.String() != macs[i] {
					t.Errorf("pod %s: request from %s, not its guest %s", pods[i].name, m.ClientHWAddr, macs[i])
				}
				continue
			}
			if m.YourIPAddr.String() != ips[i] || m.ClientHWAddr.String() != macs[i] || m.ServerIdentifier().String() != gateway {
				t.Errorf("pod %s (%s, %s): reply offers %s to %s from server %s", pods[i].name, ips[i], macs[i], m.YourIPAddr, m.ClientHWAddr, m.ServerIdentifier())
			}
			if m.MessageType() == dhcpv4.MessageTypeAck {
				acks++
			}
		}
		if acks == 0 {
			t.Errorf("pod %s: no DHCPACK seen in its network namespace", pods[i].name)
		}
	}
	for _, p := range pods {
		p.remove(t)
	}
	assertNothingLeftCRI(t, vms[0].id, vms[1].id)
}
