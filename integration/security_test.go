package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/insomniacslk/dhcp/dhcpv4"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/vmshim/vmshim/thread"
)

// secSandbox is QEMU's -sandbox, as the shim passes it.
const secSandbox = "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"

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

	dir := shimRuntimeDir(testNamespace, v.id)
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
	if err := thread.Run(func() error { return secConnect(open) }, secAsUser(uid, gid)); err != nil {
		t.Fatalf("connect to an open socket as nobody: %v", err)
	}
	for _, name := range []string{"qmp.sock", "agent.sock"} {
		err := thread.Run(func() error { return secConnect(filepath.Join(dir, name)) }, secAsUser(uid, gid))
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

// TestSecurityJail checks the default config on two VMs, one booting a
// kernel (with an agent) and one a disk: each QEMU runs as an id of its
// own, non-zero and the same number as uid and gid, with no capability
// left (effective, permitted, bounding, ambient), no_new_privs, seccomp,
// in a mount namespace that is not the host's and whose root shows only
// the jail; its argv names no file of the image or the bundle. Both VMs
// work: exec reaches the agent, SIGTERM powers them down, and their ids
// are given back once they are gone.
func TestSecurityJail(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*bootTimeout)
	defer cancel()
	vms := []*vm{startVM(ctx, t, imageKernelAgent), startVM(ctx, t, imageDiskWait)}
	hostMnt, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]string{} // uid → VM
	for _, v := range vms {
		v.console.waitFor(ctx, t, markerBooted)
		pid, argv := secQEMU(t, v.id)
		st := secStatus(t, pid)
		uids, gids := strings.Fields(st["Uid"]), strings.Fields(st["Gid"])
		if len(uids) != 4 || len(gids) != 4 || uids[0] == "0" || strings.Join(uids, " ") != strings.Join(gids, " ") ||
			strings.Count(st["Uid"], uids[0]) != 4 {
			t.Errorf("%s: Uid %q Gid %q, want one non-zero id, the same for all of them", v.id, st["Uid"], st["Gid"])
		}
		if other, ok := ids[uids[0]]; ok {
			t.Errorf("%s and %s both run as uid %s", other, v.id, uids[0])
		}
		ids[uids[0]] = v.id
		for k, want := range map[string]string{
			"CapEff": "0000000000000000", "CapPrm": "0000000000000000", "CapBnd": "0000000000000000",
			"CapAmb": "0000000000000000", "CapInh": "0000000000000000", "NoNewPrivs": "1", "Seccomp": "2",
		} {
			if st[k] != want {
				t.Errorf("%s: /proc/%d/status %s: %q, want %q", v.id, pid, k, st[k], want)
			}
		}
		if !secHasPair(argv, "-sandbox", secSandbox) {
			t.Errorf("%s: argv lacks -sandbox %s: %q", v.id, secSandbox, argv)
		}
		if mnt, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid)); err != nil || mnt == hostMnt {
			t.Errorf("%s: qemu's mount namespace %s (%v) is the host's %s", v.id, mnt, err, hostMnt)
		}
		secCheckJailRoot(t, v.id, pid)
		secCheckOverlay(t, v.id, pid, uids[0], v == vms[1])
		for _, a := range argv {
			if strings.Contains(a, "/rootfs") || strings.Contains(a, ".vmshim") || strings.Contains(a, env.daemon.dir) {
				t.Errorf("%s: argv names a file of the image or bundle: %q", v.id, a)
			}
		}
		if _, err := os.Stat(filepath.Join(secIDsDir, uids[0])); err != nil {
			t.Errorf("%s: no claim on id %s: %v", v.id, uids[0], err)
		}
	}
	// Each exec connects to the agent socket anew.
	for i := range 3 {
		if out := secExec(ctx, t, vms[0], fmt.Sprintf("e%d", i), "echo", "jailed-"+strconv.Itoa(i)); out != fmt.Sprintf("jailed-%d\n", i) {
			t.Errorf("exec %d: %q", i, out)
		}
	}
	for _, v := range vms {
		if err := v.task.Kill(ctx, syscall.SIGTERM); err != nil {
			t.Fatalf("kill SIGTERM: %v", err)
		}
		if code := v.waitExit(ctx, t); code != 0 || !strings.Contains(v.console.String(), markerACPI) {
			t.Errorf("%s: exit %d after SIGTERM, want 0 after %s\nconsole:\n%s", v.id, code, markerACPI, v.console.String())
		}
		v.remove(t)
		assertNothingLeft(ctx, t, v.id)
	}
	for id, vmID := range ids {
		if _, err := os.Stat(filepath.Join(secIDsDir, id)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s gone, its claim on id %s is not: %v", vmID, id, err)
		}
	}
}

// secCheckOverlay checks the root overlay QEMU holds open, if want: it is
// the VM's alone (its id's, 0600), in a directory only root may enter.
func secCheckOverlay(t *testing.T, id string, pid int, uid string, want bool) {
	t.Helper()
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	overlay := ""
	for _, fd := range fds {
		if target, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); strings.HasSuffix(target, "/.vmshim/root.qcow2") {
			overlay = target
		}
	}
	if (overlay != "") != want {
		t.Fatalf("%s: qemu holds overlay %q open, want one: %v", id, overlay, want)
	}
	if overlay == "" {
		return
	}
	for p, wantMode := range map[string]os.FileMode{overlay: 0o600, filepath.Dir(overlay): os.ModeDir | 0o700} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		owner, wantOwner := strconv.Itoa(int(fi.Sys().(*syscall.Stat_t).Uid)), uid
		if fi.IsDir() {
			wantOwner = "0"
		}
		if fi.Mode() != wantMode || owner != wantOwner {
			t.Errorf("%s: %s: mode %v owner %s, want %v owner %s", id, p, fi.Mode(), owner, wantMode, wantOwner)
		}
	}
}

// secIDsDir holds the node-wide claims on jail ids.
const secIDsDir = "/run/vmshim/ids"

// secCheckJailRoot checks what QEMU's root shows: only the jail's
// entries, /usr read-only, no host file outside /usr, a /proc with QEMU
// alone in it.
func secCheckJailRoot(t *testing.T, id string, pid int) {
	t.Helper()
	root := fmt.Sprintf("/proc/%d/root", pid)
	entries, err := os.ReadDir(root)
	if err != nil {
		t.Fatalf("%s: %v", root, err)
	}
	allowed := map[string]bool{"usr": true, "bin": true, "sbin": true, "lib": true, "lib32": true, "lib64": true,
		"libx32": true, "dev": true, "proc": true, "vm": true}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
		if !allowed[e.Name()] {
			t.Errorf("%s: qemu's root shows /%s", id, e.Name())
		}
	}
	t.Logf("%s: qemu's root: %v", id, names)
	for _, p := range []string{"etc/passwd", "etc/shadow", "run", "var", "root", "home", "tmp", "sys"} {
		if _, err := os.Lstat(filepath.Join(root, p)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: qemu sees /%s (%v)", id, p, err)
		}
	}
	devs, _ := os.ReadDir(filepath.Join(root, "dev"))
	for _, d := range devs {
		switch d.Name() {
		case "null", "zero", "full", "random", "urandom", "kvm":
		default:
			t.Errorf("%s: qemu's /dev has %s", id, d.Name())
		}
	}
	// What /proc shows depends on who looks: list it as QEMU's uid, with
	// no capability, as QEMU would.
	uid := strings.Fields(secStatus(t, pid)["Uid"])[0]
	// The lister prints its own pid first: it sees itself too.
	out, err := exec.Command("setpriv", "--reuid", uid, "--regid", uid, "--clear-groups", "--",
		"sh", "-c", `echo $$; exec ls -A "$0"`, filepath.Join(root, "proc")).CombinedOutput()
	if err != nil {
		t.Errorf("%s: list qemu's /proc as uid %s: %v: %s", id, uid, err, out)
	}
	var others []string
	for i, e := range strings.Fields(string(out)) {
		if i > 0 && e != strconv.Itoa(pid) && e != strings.Fields(string(out))[0] && e != "self" && e != "thread-self" {
			others = append(others, e)
		}
	}
	if len(others) != 0 || !strings.Contains(" "+string(out)+" ", "\n"+strconv.Itoa(pid)+"\n") {
		t.Errorf("%s: qemu's /proc shows %q, want qemu (%d) and nothing else", id, out, pid)
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(filepath.Join(root, "usr"), &fs); err != nil || fs.Flags&unix.ST_RDONLY == 0 || fs.Flags&unix.ST_NOSUID == 0 {
		t.Errorf("%s: qemu's /usr is not read-only and nosuid: flags %#x, %v", id, fs.Flags, err)
	}
	if err := unix.Statfs(root, &fs); err != nil || fs.Flags&unix.ST_RDONLY == 0 {
		t.Errorf("%s: qemu's root is writable: flags %#x, %v", id, fs.Flags, err)
	}
}

// secExec runs a command in the VM through containerd's task API and
// returns its stdout.
func secExec(ctx context.Context, t *testing.T, v *vm, execID string, args ...string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	proc, statusC := execProcess(ctx, t, v, execID, &specs.Process{Args: args, Cwd: "/"}, cio.NewCreator(cio.WithStreams(nil, &stdout, &stderr)))
	defer proc.Delete(ctx)
	st := <-statusC
	proc.IO().Wait()
	if code, _, err := st.Result(); err != nil || code != 0 {
		t.Errorf("exec %s: exit %d, %v, stderr %q", execID, code, err, stderr.String())
	}
	return stdout.String()
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
		"virtio-net-pci": true, "scsi-hd": true, "virtio-scsi-pci": true, "nvme": true, "virtio-balloon-pci": true}
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
