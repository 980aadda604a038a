package integration

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// imageDebianCloud is Debian bookworm with cloud-init, built with
// debootstrap by integration/guest/cloud.sh.
const imageDebianCloud = "localhost/vmshim-test/debian:cloud"

// cloudBootTimeout bounds a Debian boot with systemd and cloud-init under
// TCG (about a minute on these machines).
const cloudBootTimeout = 8 * time.Minute

// sshPublicKey returns a fresh ed25519 public key in authorized_keys form.
func sshPublicKey(t *testing.T, comment string) string {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	var wire []byte
	for _, field := range [][]byte{[]byte("ssh-ed25519"), pub} {
		wire = binary.BigEndian.AppendUint32(wire, uint32(len(field)))
		wire = append(wire, field...)
	}
	return "ssh-ed25519 " + base64.StdEncoding.EncodeToString(wire) + " " + comment
}

// TestCRICloudInit boots a Debian cloud image as a CRI pod: cloud-init
// finds the shim's NoCloud seed, names the guest after the pod, runs the
// pod's user-data, installs its ssh key, sees the container's environment,
// and mounts the container's volumes (a read-only configMap-style one and
// a writable emptyDir-style one) at their paths.
func TestCRICloudInit(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), cloudBootTimeout)
	defer cancel()
	configDir, scratchDir := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(configDir, "greeting"), []byte("hello-from-a-configmap\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	key := sshPublicKey(t, "vmshim-test-key")
	userData := `#cloud-config
runcmd:
  - [sh, -c, 'echo VMSHIM-RUNCMD-OK $(hostname)']
  - [sh, -c, '. /etc/profile.d/vmshim-env.sh; echo VMSHIM-ENV $VMSHIM_TEST_VAR']
  - [sh, -c, 'grep -q vmshim-test-key /home/debian/.ssh/authorized_keys && echo VMSHIM-KEY-OK || echo VMSHIM-KEY-MISSING']
  - [sh, -c, 'echo VMSHIM-RO $(cat /data/config/greeting)']
  - [sh, -c, 'if touch /data/config/new 2>/dev/null; then echo VMSHIM-RO-WRITABLE; else echo VMSHIM-RO-REFUSED; fi']
  - [sh, -c, 'echo written-in-guest > /data/scratch/out && echo VMSHIM-RW-OK']
  - [sh, -c, 'chmod 4755 /data/scratch/out; mknod /data/scratch/null c 1 3; echo VMSHIM-SPECIAL-TRIED']
`
	// As the kubelet makes them: an emptyDir is 0777, a configMap's
	// directory and files are world-readable.
	if err := os.Chmod(scratchDir, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(configDir, 0o755); err != nil {
		t.Fatal(err)
	}
	c := newCRI(t, env.daemon)
	p := c.runPod(ctx, t, "cloudvm")
	vm := p.createVMWith(ctx, t, imageDebianCloud, func(cfg *runtimeapi.ContainerConfig) {
		cfg.Annotations = map[string]string{
			"vmshim.io/user-data":           userData,
			"vmshim.io/ssh-authorized-keys": key,
		}
		cfg.Envs = []*runtimeapi.KeyValue{{Key: "VMSHIM_TEST_VAR", Value: []byte("from-the-pod")}}
		cfg.Mounts = []*runtimeapi.Mount{
			{ContainerPath: "/data/config", HostPath: configDir, Readonly: true},
			{ContainerPath: "/data/scratch", HostPath: scratchDir},
		}
	})
	if _, err := c.runtime.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: vm.id}); err != nil {
		t.Fatalf("StartContainer: %v", err)
	}
	start := time.Now()
	vm.waitLog(ctx, t, "VMSHIM-RW-OK")
	t.Logf("cloud-init ran the pod's user-data %v after start", time.Since(start).Round(time.Second))
	for marker, want := range map[string]string{
		"VMSHIM-RUNCMD-OK": "VMSHIM-RUNCMD-OK cloudvm",
		"VMSHIM-ENV":       "VMSHIM-ENV from-the-pod",
		"VMSHIM-KEY-":      "VMSHIM-KEY-OK",
		"VMSHIM-RO ":       "VMSHIM-RO hello-from-a-configmap",
		"VMSHIM-RO-":       "VMSHIM-RO-REFUSED",
	} {
		if line := vm.waitLog(ctx, t, marker); !strings.Contains(line, want) {
			t.Errorf("console: %q, want %q", line, want)
		}
	}
	if b, err := os.ReadFile(filepath.Join(scratchDir, "out")); err != nil || string(b) != "written-in-guest\n" {
		t.Errorf("file the guest wrote to the emptyDir-style volume: %q, %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(configDir, "new")); err == nil {
		t.Errorf("the guest wrote to the read-only volume")
	}
	// Guest root writes as QEMU's uid: what it makes is not root's, so a
	// setuid bit raises nobody to root, and it can make no device node.
	vm.waitLog(ctx, t, "VMSHIM-SPECIAL-TRIED")
	if fi, err := os.Stat(filepath.Join(scratchDir, "out")); err != nil || fi.Sys().(*syscall.Stat_t).Uid == 0 {
		t.Errorf("the guest's file on the host: %v, %v; want it owned by the VM's id, not root", fi, err)
	}
	if _, err := os.Lstat(filepath.Join(scratchDir, "null")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("guest root made a device node on the host volume: %v", err)
	}
	p.remove(t)
	assertNothingLeftCRI(t, vm.id)
}
