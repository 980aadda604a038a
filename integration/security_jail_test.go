package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestSecurityJailMounts repeats two attacks on a VM pod through the CRI.
//
// A QEMU exploit reads /proc/self/mountinfo for the names of other pods'
// volumes: QEMU's lists only the jail's own mounts (its root, /usr,
// /proc, what is bound under /vm: here the pod's volume); a mount the
// host made before the VM started, named like another pod's volume, is
// not in it.
//
// A workload that runs as nobody in the host's PID namespace kills VM
// sandboxes: each pod's pause process runs as a jail id of its own, not
// nobody, not root and not QEMU's, different in two pods, with no
// groups; the id is given back when the pod is removed.
func TestSecurityJailMounts(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*bootTimeout)
	defer cancel()
	other := filepath.Join(t.TempDir(), "other-pod-volume")
	if err := os.Mkdir(other, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("vmshim-other-pod-volume", other, "tmpfs", 0, "size=64k"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(other, unix.MNT_DETACH) })
	volume := t.TempDir()
	if err := os.Chmod(volume, 0o755); err != nil {
		t.Fatal(err)
	}

	c := newCRI(t, env.daemon)
	pods := []*pod{c.runPod(ctx, t, "jail-mounts-a"), c.runPod(ctx, t, "jail-mounts-b")}
	vm := pods[0].createVMWith(ctx, t, imageKernelAgent, func(cfg *runtimeapi.ContainerConfig) {
		cfg.Mounts = []*runtimeapi.Mount{{ContainerPath: "/data", HostPath: volume, Readonly: true}}
	})
	if _, err := c.runtime.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: vm.id}); err != nil {
		t.Fatalf("StartContainer: %v", err)
	}
	vm.waitLog(ctx, t, markerBooted)

	qemuPid, _ := secQEMU(t, vm.id)
	mountinfo, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", qemuPid))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("qemu's mountinfo:\n%s", mountinfo)
	points := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(string(mountinfo)), "\n") {
		f := strings.Fields(l)
		sep := slices.Index(f, "-")
		if len(f) < 10 || sep < 6 {
			t.Fatalf("mountinfo line %q", l)
		}
		point := f[4]
		points[point] = f[sep+1] + " " + f[sep+2] + " " + f[3]
		switch {
		case point == "/", point == "/usr", point == "/proc", strings.HasPrefix(point, "/vm/"):
		case slices.Contains([]string{"/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"}, point):
		default:
			t.Errorf("qemu sees a mount at %s: %q", point, l)
		}
		if tags := strings.Join(f[6:sep], " "); tags != "" {
			t.Errorf("qemu's mount at %s propagates to or from the host (%s): %q", point, tags, l)
		}
		if strings.Contains(l, "other-pod-volume") {
			t.Errorf("qemu's mountinfo names the host's other mount: %q", l)
		}
	}
	if got := points["/"]; got != "tmpfs vmshim-jail /" {
		t.Errorf("qemu's root is %q, want the jail's tmpfs", got)
	}
	if got := points["/vm/share/0"]; !strings.HasSuffix(got, " "+volume) {
		t.Errorf("qemu's /vm/share/0 is %q, want the pod's volume %s", got, volume)
	}
	qemuUID := strings.Fields(secStatus(t, qemuPid)["Uid"])[0]

	uids := map[string]string{qemuUID: "qemu"}
	for _, p := range pods {
		pid, err := pidOf("vmshim-pause " + p.netnsPath(ctx, t))
		if err != nil {
			t.Fatal(err)
		}
		st := secStatus(t, pid)
		uid := strings.Fields(st["Uid"])[0]
		all := strings.Join([]string{uid, uid, uid, uid}, " ")
		if strings.Join(strings.Fields(st["Uid"]), " ") != all || strings.Join(strings.Fields(st["Gid"]), " ") != all ||
			st["Groups"] != "" || st["NoNewPrivs"] != "1" {
			t.Errorf("pod %s: pause process Uid %q Gid %q Groups %q NoNewPrivs %q, want one id for all, no groups, no_new_privs",
				p.name, st["Uid"], st["Gid"], st["Groups"], st["NoNewPrivs"])
		}
		if uid == "0" || uid == "65534" {
			t.Errorf("pod %s: pause process runs as uid %s", p.name, uid)
		}
		if who, ok := uids[uid]; ok {
			t.Errorf("pod %s: pause process runs as uid %s, as %s does", p.name, uid, who)
		}
		uids[uid] = "the pause process of " + p.name
		claim := filepath.Join(secIDsDir, uid)
		if owner, err := os.ReadFile(claim); err != nil || string(owner) != criNamespace+"/"+p.id {
			t.Errorf("pod %s: claim %s holds %q (%v), want %s/%s", p.name, claim, owner, err, criNamespace, p.id)
		}
		// The attack itself: nobody, in the host's PID namespace, signals it.
		if out, err := exec.Command("setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", "--",
			"kill", "-TERM", strconv.Itoa(pid)).CombinedOutput(); err == nil {
			t.Errorf("pod %s: nobody sent SIGTERM to the pause process: %s", p.name, out)
		}
		if err := unix.Kill(pid, 0); err != nil {
			t.Errorf("pod %s: pause process %d: %v", p.name, pid, err)
		}
		t.Logf("pod %s: pause process %d runs as %s", p.name, pid, uid)
	}
	for _, p := range pods {
		p.remove(t)
	}
	for uid, who := range uids {
		if _, err := os.Stat(filepath.Join(secIDsDir, uid)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the pods are gone, the claim on id %s (%s) is not: %v", uid, who, err)
		}
	}
	assertNothingLeftCRI(t, vm.id, pods[0].id, pods[1].id)
}

// assertNoIDClaims checks that none of owners (namespace/id) holds a jail
// id any more: QEMU's and the pause process's are given back.
func assertNoIDClaims(t *testing.T, owners ...string) {
	t.Helper()
	entries, err := os.ReadDir(secIDsDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(secIDsDir, e.Name()))
		if err == nil && slices.Contains(owners, string(data)) {
			t.Errorf("%s still holds id %s", data, e.Name())
		}
	}
}
