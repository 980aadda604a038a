package guest_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Markers of the cloud guest: its final message (cloud.sh configures it)
// and the lines the test's user-data prints.
const (
	markerCloudDone  = "VMSHIM-CLOUD-INIT-DONE"
	markerRuncmd     = "VMSHIM-RUNCMD-OK "
	markerKey        = "VMSHIM-KEY-OK"
	markerKeyMissing = "VMSHIM-KEY-MISSING"
	marker9p         = "VMSHIM-9P-OK "
	marker9pRO       = "VMSHIM-9P-READONLY"
	marker9pRW       = "VMSHIM-9P-WRITABLE"
	markerRootMiB    = "VMSHIM-ROOT-MIB "
	markerInitramfs  = "VMSHIM-INITRAMFS-" // ERROR: or WARNING: from cloud-initramfs.sh
)

// cloudHostname is the seed's local-hostname; cloudShare is the 9p file's
// content.
const (
	cloudHostname = "cloud-test"
	cloudShare    = "hello from the host"
)

// cloudUserData runs the checks in the guest; %[1]s is the authorized key.
// Debian's default user is "debian", so the key lands in its home.
const cloudUserData = `#cloud-config
ssh_authorized_keys:
  - %[1]s
mounts:
  - [vmshim0, /mnt/ro, 9p, "trans=virtio,version=9p2000.L,nofail,ro", "0", "0"]
runcmd:
  - echo VMSHIM-RUNCMD-OK $(hostname)
  - if grep -qxF '%[1]s' /home/debian/.ssh/authorized_keys; then echo VMSHIM-KEY-OK; else echo VMSHIM-KEY-MISSING; fi
  - echo "VMSHIM-9P-OK $(cat /mnt/ro/hello)"
  - if touch /mnt/ro/written 2>/dev/null; then echo VMSHIM-9P-WRITABLE; else echo VMSHIM-9P-READONLY; fi
  - df -Pm / | awk 'NR == 2 { print "VMSHIM-ROOT-MIB", $2 }'
`

// cloudDir builds the cloud guest with cloud.sh (idempotent) into the
// guest output dir and returns it. debootstrap needs root.
func cloudDir(t *testing.T) string {
	t.Helper()
	if os.Getenv("VMSHIM_GUEST_TEST") != "1" {
		t.Skip("set VMSHIM_GUEST_TEST=1 to build the cloud guest and boot it under QEMU (a few minutes)")
	}
	if os.Geteuid() != 0 {
		t.Skip("building the cloud guest runs debootstrap, which needs root")
	}
	for _, tool := range []string{"qemu-system-x86_64", "qemu-img", "mkfs.fat", "mcopy"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed (integration/setup/deps.sh)", tool)
		}
	}
	return buildGuest(t, "cloud.sh", 20*time.Minute)
}

// sshPublicKey returns a fresh ed25519 public key in authorized_keys form.
func sshPublicKey(t *testing.T, comment string) string {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	var blob []byte
	for _, field := range [][]byte{[]byte("ssh-ed25519"), pub} {
		blob = binary.BigEndian.AppendUint32(blob, uint32(len(field)))
		blob = append(blob, field...)
	}
	return "ssh-ed25519 " + base64.StdEncoding.EncodeToString(blob) + " " + comment
}

// noCloudSeed writes a NoCloud seed into dir: a FAT image labelled CIDATA
// holding meta-data and user-data, and returns its path.
func noCloudSeed(t *testing.T, ctx context.Context, dir, metaData, userData string) string {
	t.Helper()
	files := map[string]string{"meta-data": metaData, "user-data": userData}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	seed := filepath.Join(dir, "seed.img")
	for _, args := range [][]string{
		{"mkfs.fat", "-C", "-n", "CIDATA", seed, "1024"},
		{"mcopy", "-i", seed, filepath.Join(dir, "meta-data"), filepath.Join(dir, "user-data"), "::"},
	} {
		cmd := exec.CommandContext(ctx, args[0], args[1:]...)
		cmd.Env = append(os.Environ(), "MTOOLS_SKIP_CHECK=1")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	return seed
}

// markerIn returns line from its first "VMSHIM-" on, so a marker that
// follows other output on its console line (the login prompt has no
// newline) is still found.
func markerIn(line string) (string, bool) {
	i := strings.Index(line, "VMSHIM-")
	if i < 0 {
		return "", false
	}
	return line[i:], true
}

// cloudMarkers waits for cloud-init's final message and returns every
// marker printed until then, by prefix: the whole marker of its first
// occurrence. It fails the test if QEMU exits or timeout passes first.
func cloudMarkers(v *vm, timeout time.Duration, prefixes ...string) map[string]string {
	v.t.Helper()
	got := map[string]string{}
	deadline := time.After(timeout)
	for {
		select {
		case line, ok := <-v.lines:
			if !ok {
				v.t.Fatalf("console closed before %s (have %q)", markerCloudDone, got)
			}
			m, ok := markerIn(line)
			if !ok {
				continue
			}
			for _, p := range append(prefixes, markerCloudDone) {
				if _, seen := got[p]; !seen && strings.HasPrefix(m, p) {
					got[p] = m
				}
			}
			if _, done := got[markerCloudDone]; done {
				return got
			}
		case <-deadline:
			v.t.Fatalf("no %s after %v (have %q)", markerCloudDone, timeout, got)
		}
	}
}

func TestCloudGuest(t *testing.T) {
	dir := cloudDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	tmp := t.TempDir()

	// The VM writes to an overlay, 1 GiB larger than the image, which
	// cloud-init's growpart and resizefs give to the root filesystem.
	overlay := filepath.Join(tmp, "root.qcow2")
	if out, err := exec.CommandContext(ctx, "qemu-img", "create", "-q", "-f", "qcow2",
		"-b", filepath.Join(dir, "disk-cloud.qcow2"), "-F", "qcow2", overlay, "3G").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img create: %v: %s", err, out)
	}
	share := filepath.Join(tmp, "share")
	if err := os.Mkdir(share, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(share, "hello"), []byte(cloudShare+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	key := sshPublicKey(t, "vmshim-test")
	seed := noCloudSeed(t, ctx, tmp,
		"instance-id: i-vmshim-cloud-test\nlocal-hostname: "+cloudHostname+"\n",
		fmt.Sprintf(cloudUserData, key))

	v := startVM(t, ctx,
		"-m", "1024", "-smp", "2",
		"-drive", "file="+overlay+",format=qcow2,if=virtio",
		"-drive", "file="+seed+",format=raw,if=virtio,readonly=on",
		"-fsdev", "local,id=fs0,path="+share+",security_model=none,readonly=on",
		"-device", "virtio-9p-pci,fsdev=fs0,mount_tag=vmshim0",
	)
	got := cloudMarkers(v, 6*time.Minute,
		markerRuncmd, markerKey, markerKeyMissing, marker9p, marker9pRO, marker9pRW, markerRootMiB, markerInitramfs)
	t.Logf("%s after %.1fs: %s", markerCloudDone, time.Since(v.start).Seconds(), got[markerCloudDone])

	if want := markerRuncmd + cloudHostname; got[markerRuncmd] != want {
		t.Errorf("runcmd printed %q, want %q", got[markerRuncmd], want)
	}
	if _, ok := got[markerKey]; !ok {
		t.Errorf("the authorized key is not in /home/debian/.ssh/authorized_keys (%s: %q)", markerKeyMissing, got[markerKeyMissing])
	}
	if want := marker9p + cloudShare; got[marker9p] != want {
		t.Errorf("9p share: got %q, want %q", got[marker9p], want)
	}
	if _, ok := got[marker9pRO]; !ok {
		t.Errorf("9p share is not read-only (%q)", got[marker9pRW])
	}
	if mib, err := strconv.Atoi(strings.TrimPrefix(got[markerRootMiB], markerRootMiB)); err != nil || mib < 2560 {
		t.Errorf("root filesystem not grown to the 3 GiB overlay: %q", got[markerRootMiB])
	}
	if m, ok := got[markerInitramfs]; ok {
		t.Errorf("initramfs: %s", m)
	}

	v.qmpCommand(ctx, "system_powerdown")
	v.waitExit(2 * time.Minute)
}
