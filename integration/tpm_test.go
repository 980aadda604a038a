package integration

import (
	"context"
	"encoding/binary"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

const (
	annotationTPM = "vmshim.io/tpm"
	// tpmStateName is the TPM's state file on a root-disk volume.
	tpmStateName = "vmshim-tpm2.state"
)

// TestTPM boots a disk with vmshim.io/tpm 2.0: the guest's kernel finds a
// TPM 2.0. swtpm runs as the VM's id, with no capabilities, no_new_privs
// and a seccomp filter, in the VM's cgroup and network namespace and in a
// mount namespace of its own, and its argv names no host path. When QEMU
// is killed swtpm ends with it, and after the delete the VM's id is given
// back; when the shim is killed, swtpm goes with the rest. A microvm,
// which has no TPM, is refused in one line, and so is an ELF kernel
// booted with an initrd, which QEMU would load over the TPM's ACPI
// tables.
func TestTPM(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*bootTimeout)
	defer cancel()
	c := newCRI(t, env.daemon)
	p, vm, err := vmPodOn(ctx, t, c, runtimeHandler, "tpm", imageDiskWait, map[string]string{annotationTPM: "2.0"})
	if err != nil {
		t.Fatal(err)
	}
	if line := vm.waitLog(ctx, t, "VMSHIM-TPM "); !strings.Contains(line, "VMSHIM-TPM version=2 pcr7=") {
		t.Errorf("guest: %q, want a TPM 2.0", line)
	}
	vm.waitLog(ctx, t, markerBooted)

	qemuPid, _ := secQEMU(t, vm.id)
	uid := strings.Fields(secStatus(t, qemuPid)["Uid"])[0]
	pids := swtpmsAs(t, uid)
	if len(pids) != 1 {
		t.Fatalf("swtpm processes running as the VM's id %s: %v, want one", uid, pids)
	}
	pid := pids[0]
	st := secStatus(t, pid)
	if want := strings.Repeat(uid+"\t", 3) + uid; st["Uid"] != want || st["Gid"] != want {
		t.Errorf("swtpm: Uid %q Gid %q, want %s for all", st["Uid"], st["Gid"], uid)
	}
	for k, want := range map[string]string{
		"CapEff": "0000000000000000", "CapPrm": "0000000000000000", "CapBnd": "0000000000000000",
		"CapAmb": "0000000000000000", "NoNewPrivs": "1", "Seccomp": "2", "Groups": "",
	} {
		if st[k] != want {
			t.Errorf("swtpm: /proc/%d/status %s: %q, want %q", pid, k, st[k], want)
		}
	}
	link := func(pid int, what string) string {
		s, err := os.Readlink(fmt.Sprintf("/proc/%d/%s", pid, what))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	if m := link(pid, "ns/mnt"); m == link(os.Getpid(), "ns/mnt") || m == link(qemuPid, "ns/mnt") {
		t.Errorf("swtpm's mount namespace %s is the host's or QEMU's", m)
	}
	if n := link(pid, "ns/net"); n != link(qemuPid, "ns/net") {
		t.Errorf("swtpm's network namespace %s, QEMU's %s", n, link(qemuPid, "ns/net"))
	}
	cgroups := func(pid int) string {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if cg := cgroups(pid); cg != cgroups(qemuPid) {
		t.Errorf("swtpm's cgroups:\n%s\nQEMU's:\n%s", cg, cgroups(qemuPid))
	}
	argv, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range strings.Split(strings.TrimSuffix(string(argv), "\x00"), "\x00")[1:] {
		if strings.Contains(a, "/") && !strings.Contains(a, "file:///vm/"+tpmStateName) {
			t.Errorf("swtpm's argv names a host path: %q", a)
		}
	}
	// QEMU killed: swtpm ends with it, before anyone deletes anything.
	if err := syscall.Kill(qemuPid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return len(swtpmsAs(t, uid)) == 0, nil
	}); err != nil {
		t.Errorf("swtpm still runs 10 s after QEMU was killed: %v", swtpmsAs(t, uid))
	}
	if st := vm.waitExited(ctx, t); st.ExitCode != 137 {
		t.Errorf("VM whose QEMU was killed: exit %d, want 137", st.ExitCode)
	}
	p.remove(t)
	assertNoIDClaims(t, criNamespace+"/"+vm.id)
	assertNothingLeftCRI(t, vm.id)

	p, vm, err = vmPodOn(ctx, t, c, runtimeHandler, "tpm-microvm", imageKernelWait, map[string]string{annotationTPM: "2.0", "vmshim.io/machine": "microvm"})
	if err == nil || !strings.Contains(err.Error(), "microvm has no TPM, which annotation vmshim.io/tpm asks for") || strings.Contains(err.Error(), "\n") {
		t.Errorf("a microvm with a TPM: %v, want one line refusing it", err)
	}
	p.remove(t)
	if vm != nil {
		assertNothingLeftCRI(t, vm.id)
	}

	// The shim killed: the delete action containerd runs ends QEMU, and
	// swtpm with it.
	p, vm, err = vmPodOn(ctx, t, c, runtimeHandler, "tpm-shim-killed", imageDiskWait, map[string]string{annotationTPM: "2.0"})
	if err != nil {
		t.Fatal(err)
	}
	vm.waitLog(ctx, t, "VMSHIM-TPM ")
	qemuPid, _ = secQEMU(t, vm.id)
	uid = strings.Fields(secStatus(t, qemuPid)["Uid"])[0]
	if n := len(swtpmsAs(t, uid)); n != 1 {
		t.Fatalf("%d swtpm processes run as the VM's id %s, want one", n, uid)
	}
	killPodShim(t, p)
	vm.waitExited(ctx, t)
	waitGone(ctx, t, "swtpm of "+vm.id, func() bool { return len(swtpmsAs(t, uid)) == 0 })
	p.remove(t)
	assertNoIDClaims(t, criNamespace+"/"+vm.id)
	assertNothingLeftCRI(t, vm.id)

	p, vm, err = vmPodOn(ctx, t, c, runtimeHandler, "tpm-pvh", imageKernelWait, map[string]string{annotationTPM: "2.0"})
	if err == nil || !strings.Contains(err.Error(), "annotation vmshim.io/tpm: the image's kernel is an ELF vmlinux booted with an initrd") || strings.Contains(err.Error(), "\n") {
		t.Errorf("an ELF kernel and initrd with a TPM: %v, want one line refusing it", err)
	}
	p.remove(t)
	if vm != nil {
		assertNoIDClaims(t, criNamespace+"/"+vm.id)
		assertNothingLeftCRI(t, vm.id)
	}
}

// swtpmsAs lists the live swtpm processes that run as the VM's id.
func swtpmsAs(t *testing.T, uid string) []int {
	t.Helper()
	var pids []int
	for _, pid := range secIDProcesses(t, uid) {
		comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if err == nil && strings.TrimSpace(string(comm)) == "swtpm" {
			pids = append(pids, pid)
		}
	}
	return pids
}

// TestTPMStateKept runs tpm2-tools in the Debian cloud guest, its root
// disk on a filesystem volume: random numbers and PCRs are read, and a
// value written into an NV index by the first pod's guest is read back
// by the next pod's, from the state kept on the volume beside the disk.
func TestTPMStateKept(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*cloudBootTimeout)
	defer cancel()
	vol := filepath.Join(env.daemon.dir, "volumes", "tpm")
	if err := os.MkdirAll(vol, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(vol) })
	cc := newCRI(t, env.daemon)
	// tpm2-tools talks to the kernel's resource manager, with no daemon.
	const tools = "export TPM2TOOLS_TCTI=device:/dev/tpmrm0; "
	const index = "0x1500016"
	secret := fmt.Sprintf("vmshim-%d", time.Now().UnixNano())
	boot := func(name, script string) (*pod, *criContainer) {
		p := cc.runPod(ctx, t, name)
		vm := p.createVMWith(ctx, t, imageDebianCloud, func(cfg *runtimeapi.ContainerConfig) {
			cfg.Annotations = map[string]string{
				annotationTPM:            "2.0",
				annotationRootDiskVolume: "/data",
				"vmshim.io/user-data":    "#cloud-config\nruncmd:\n  - [sh, -c, '" + tools + script + "']\n",
			}
			cfg.Mounts = []*runtimeapi.Mount{{ContainerPath: "/data", HostPath: vol}}
		})
		if _, err := p.c.runtime.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: vm.id}); err != nil {
			t.Fatalf("StartContainer: %v", err)
		}
		return p, vm
	}
	p, vm := boot("tpm-write",
		`echo VMSHIM-TPM-RANDOM $(tpm2_getrandom --hex 16); `+
			`tpm2_pcrread sha256:0,7 | tr -s " \n" " " | sed "s/^/VMSHIM-TPM-PCRS /"; echo; `+
			`tpm2_nvdefine `+index+` -C o -s 32 -a "ownerread|ownerwrite" && `+
			`printf %s `+secret+` | tpm2_nvwrite `+index+` -C o -i - && echo VMSHIM-TPM-NV-WRITTEN || echo VMSHIM-TPM-NV-FAILED`)
	if line := vm.waitLog(ctx, t, "VMSHIM-TPM-RANDOM"); len(strings.Fields(line)) < 2 || len(strings.Fields(line)[len(strings.Fields(line))-1]) != 32 {
		t.Errorf("tpm2_getrandom: %q, want 16 bytes in hex", line)
	}
	if line := vm.waitLog(ctx, t, "VMSHIM-TPM-PCRS"); !strings.Contains(line, "sha256:") || !strings.Contains(line, "7 : 0x") {
		t.Errorf("tpm2_pcrread: %q", line)
	}
	if line := vm.waitLog(ctx, t, "VMSHIM-TPM-NV-"); !strings.Contains(line, "VMSHIM-TPM-NV-WRITTEN") {
		t.Fatalf("tpm2_nvwrite: %q", line)
	}
	fi, err := os.Stat(filepath.Join(vol, tpmStateName))
	if err != nil || fi.Size() == 0 {
		t.Fatalf("the TPM's state on the volume: %v, %v", fi, err)
	}
	t.Logf("the TPM's state on the volume: %d bytes", fi.Size())
	p.remove(t)
	assertNothingLeftCRI(t, vm.id)

	p, vm = boot("tpm-read", `echo VMSHIM-TPM-NV-READ $(tpm2_nvread `+index+` -C o -s `+strconv.Itoa(len(secret))+`)`)
	if line := vm.waitLog(ctx, t, "VMSHIM-TPM-NV-READ"); !strings.HasSuffix(strings.TrimSpace(line), "VMSHIM-TPM-NV-READ "+secret) {
		t.Errorf("the next pod's guest read %q, want %q", line, secret)
	}
	p.remove(t)
	assertNothingLeftCRI(t, vm.id)
}

// TestTPMMeasuredBoot boots the same Secure Boot disk (shim, Debian's
// signed GRUB and kernel) with a TPM under uefi and under uefi-secure,
// side by side: OVMF measures the Secure Boot state and its keys into
// PCR 7, which the guest reads from sysfs, and the two differ.
func TestTPMMeasuredBoot(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*uefiBootTimeout)
	defer cancel()
	c := newCRI(t, env.daemon)
	pcr7 := map[string]string{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, fw := range []string{"uefi", "uefi-secure"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, vm, err := vmPodOn(ctx, t, c, runtimeHandler, "tpm-"+fw, imageDiskUEFISecure, map[string]string{annotationFirmware: fw, annotationTPM: "2.0"})
			defer p.remove(t)
			if err != nil {
				t.Errorf("%s: %v", fw, err)
				return
			}
			line := vm.waitLog(ctx, t, "VMSHIM-TPM ")
			_, v, _ := strings.Cut(line, "pcr7=")
			v = strings.TrimSpace(v)
			t.Logf("%s: %s", fw, line)
			mu.Lock()
			pcr7[fw] = v
			mu.Unlock()
		}()
	}
	wg.Wait()
	for fw, v := range pcr7 {
		if len(v) != 64 || strings.Trim(v, "0") == "" || strings.Trim(strings.ToLower(v), "f") == "" {
			t.Errorf("%s: PCR 7 %q, want a measurement", fw, v)
		}
	}
	if pcr7["uefi"] == pcr7["uefi-secure"] {
		t.Errorf("PCR 7 is %s under uefi and under uefi-secure", pcr7["uefi"])
	}
}

// TestTPMBadState: a TPM state file on the root-disk volume that is a
// symlink, a fifo, or not swtpm's fails the create in one line naming
// it, is left as it is, and nothing of the VM is left.
func TestTPMBadState(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	cc := newCRI(t, env.daemon)
	garbage := []byte(strings.Repeat("not a TPM state\n", 64))
	for _, tc := range []struct {
		name  string
		plant func(p string) error
		want  string
	}{
		{"symlink", func(p string) error { return os.Symlink("/etc/shadow", p) }, "not a regular file (symlink)"},
		{"fifo", func(p string) error { return syscall.Mkfifo(p, 0o666) }, "not a regular file (fifo)"},
		{"garbage", func(p string) error { return os.WriteFile(p, garbage, 0o644) }, "not a TPM state of swtpm's: magic"},
		// swtpm's header, and a permanent-state blob libtpms refuses:
		// QEMU's first command to swtpm fails, and QEMU with it.
		{"blob", func(p string) error { return os.WriteFile(p, brokenTPMState(), 0o644) }, "tpm-emulator: TPM result for CMD_INIT"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vol := t.TempDir()
			state := filepath.Join(vol, tpmStateName)
			if err := tc.plant(state); err != nil {
				t.Fatal(err)
			}
			before, _ := os.Lstat(state)
			p := cc.runPod(ctx, t, "tpm-bad-"+tc.name)
			cfg := &runtimeapi.ContainerConfig{
				Metadata: &runtimeapi.ContainerMetadata{Name: "vm"}, Image: &runtimeapi.ImageSpec{Image: imageDiskWait}, LogPath: "vm.log",
				Annotations: map[string]string{annotationTPM: "2.0", annotationRootDiskVolume: "/data"},
				Mounts:      []*runtimeapi.Mount{{ContainerPath: "/data", HostPath: vol}},
			}
			created, err := cc.runtime.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: p.id, Config: cfg, SandboxConfig: p.config})
			if err == nil {
				_, err = cc.runtime.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: created.ContainerId})
			}
			want := "root disk volume /data: "
			if tc.name == "blob" {
				want = "its TPM's state in root disk volume /data: "
			}
			if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), tpmStateName) ||
				!strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("error %v, want one line naming %s: %s", err, tpmStateName, tc.want)
			} else {
				t.Logf("refused: %v", err)
			}
			after, err := os.Lstat(state)
			if err != nil || after.Mode().Type() != before.Mode().Type() || after.Size() != before.Size() || !after.ModTime().Equal(before.ModTime()) {
				t.Errorf("the planted %s changed: %v, %v", tc.name, after, err)
			}
			if tc.name == "garbage" {
				if b, _ := os.ReadFile(state); string(b) != string(garbage) {
					t.Error("the garbage was written over")
				}
			}
			if tc.name == "blob" {
				if b, _ := os.ReadFile(state); string(b) != string(brokenTPMState()) {
					t.Error("swtpm wrote over the state it could not load")
				}
			}
			p.remove(t)
			if created != nil {
				assertNoIDClaims(t, criNamespace+"/"+created.ContainerId)
				assertNothingLeftCRI(t, created.ContainerId)
			}
		})
	}
}

// brokenTPMState is a state file in swtpm's linear format (a 192-byte
// header: magic, version 1, header size, 15 slots of offset, length and
// section length) whose one blob, the TPM's permanent state, is noise.
func brokenTPMState() []byte {
	const hdr, blob, section = 192, 1315, 2048
	b := make([]byte, hdr+section)
	binary.LittleEndian.PutUint64(b, 0x737774706d6c696e)
	b[8] = 1
	binary.LittleEndian.PutUint16(b[10:], hdr)
	binary.LittleEndian.PutUint32(b[12:], hdr)
	binary.LittleEndian.PutUint32(b[16:], blob)
	binary.LittleEndian.PutUint32(b[20:], section)
	for i := range blob {
		b[hdr+i] = byte(i*7 + 3)
	}
	return b
}

// TestTPMSuspend suspends a VM with a TPM onto its root-disk volume and
// resumes it in the next pod: QEMU carries the TPM's state, volatile
// state included, in the VM's, so the resumed guest reads from its TPM
// the PCR 7 it read before (a TPM that came up anew would answer no
// command before the firmware's TPM2_Startup). A VM without a TPM does
// not resume that state.
func TestTPMSuspend(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*bootTimeout)
	defer cancel()
	vol := t.TempDir()
	c := newCRI(t, env.daemon)
	config := func(ann map[string]string) func(cfg *runtimeapi.ContainerConfig) {
		return func(cfg *runtimeapi.ContainerConfig) {
			cfg.Annotations = map[string]string{annotationRootDiskVolume: "/data"}
			maps.Copy(cfg.Annotations, ann)
			cfg.Mounts = []*runtimeapi.Mount{{ContainerPath: "/data", HostPath: vol}}
		}
	}
	start := func(name string, ann map[string]string) (*pod, *criContainer, error) {
		p := c.runPod(ctx, t, name)
		vm := p.createVMWith(ctx, t, imageDiskAgent, config(ann))
		_, err := c.runtime.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: vm.id})
		return p, vm, err
	}
	pcr7 := func(vm *criContainer) string {
		return strings.TrimSpace(vm.mustExec(ctx, t, "cat", "/sys/class/tpm/tpm0/pcr-sha256/7"))
	}
	suspendOnce := func(name string) string {
		p, vm, err := start(name, map[string]string{annotationTPM: "2.0", "vmshim.io/on-stop": "suspend"})
		if err != nil {
			t.Fatalf("StartContainer: %v", err)
		}
		vm.waitLog(ctx, t, markerAgent)
		before := pcr7(vm)
		if len(before) != 64 {
			t.Fatalf("PCR 7 before the suspend: %q", before)
		}
		vm.stop(ctx, t, 60)
		if st := vm.waitExited(ctx, t); st.ExitCode != 0 {
			t.Fatalf("suspended VM: exit %d (%s), want 0", st.ExitCode, st.Message)
		}
		p.remove(t)
		assertNothingLeftCRI(t, vm.id)
		return before
	}

	before := suspendOnce("tpm-suspend")
	p, vm, err := start("tpm-resume", map[string]string{annotationTPM: "2.0"})
	if err != nil {
		t.Fatalf("StartContainer of the resuming VM: %v", err)
	}
	vm.waitLog(ctx, t, "vmshim: resumed the state saved on volume /data")
	if after := pcr7(vm); after != before {
		t.Errorf("PCR 7 after the resume: %q, before the suspend: %q", after, before)
	}
	p.remove(t)
	assertNothingLeftCRI(t, vm.id)

	suspendOnce("tpm-suspend-2")
	p, vm, err = start("tpm-resume-without", map[string]string{annotationTPM: "none"})
	if err == nil || !strings.Contains(err.Error(), "this one has no TPM, not a TPM") || strings.Contains(err.Error(), "\n") {
		t.Errorf("resuming a state with a TPM in a VM without one: %v, want one line refusing it", err)
	}
	p.remove(t)
	assertNothingLeftCRI(t, vm.id)
}
