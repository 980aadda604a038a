package integration

import (
	"context"
	"fmt"
	"image"
	"image/png"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

const (
	imageDiskUEFI         = "localhost/vmshim-test/disk:uefi"
	imageDiskUEFISecure   = "localhost/vmshim-test/disk:uefi-secure"
	imageDiskUEFIUnsigned = "localhost/vmshim-test/disk:uefi-unsigned"

	annotationFirmware = "vmshim.io/firmware"
	annotationGraphics = "vmshim.io/graphics"
	annotationNICModel = "vmshim.io/nic-model"
	annotationDiskDrv  = "vmshim.io/disk-driver"

	// uefiBootTimeout bounds an OVMF boot under TCG, slower than SeaBIOS.
	uefiBootTimeout = 3 * time.Minute
	// noBootWait is how long a VM that must not boot is watched.
	noBootWait = 45 * time.Second
)

// TestFirmwareUEFI boots a disk that has an EFI system partition with GRUB
// and no BIOS boot code: it boots with vmshim.io/firmware uefi, its guest
// seeing no Secure Boot, and with the image label io.vmshim.firmware uefi,
// and does not boot with bios.
func TestFirmwareUEFI(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*uefiBootTimeout+noBootWait+time.Minute)
	defer cancel()
	c := newCRI(t, env.daemon)
	p, vm, err := vmPodOn(ctx, t, c, runtimeHandler, "uefi", imageDiskUEFI, map[string]string{annotationFirmware: "uefi"})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	vm.waitLog(ctx, t, "VMSHIM-EFI secureboot=0")
	vm.waitLog(ctx, t, markerBooted)
	t.Logf("booted with OVMF in %v", time.Since(start).Round(time.Second))
	p.remove(t)
	assertNothingLeftCRI(t, vm.id)

	// The same disk packed with vmshim-pack --firmware uefi, which sets
	// the image label io.vmshim.firmware: it boots with no annotation,
	// and the annotation wins over the label.
	const labelled = "localhost/vmshim-test/disk:uefi-labelled"
	packImage(ctx, t, labelled, "--disk", filepath.Join(env.guestDir, "disk-uefi.qcow2"), "--firmware", "uefi")
	p, vm, err = vmPodOn(ctx, t, c, runtimeHandler, "uefi-label", labelled, nil)
	if err != nil {
		t.Fatal(err)
	}
	vm.waitLog(ctx, t, "VMSHIM-EFI secureboot=0")
	p.remove(t)
	assertNothingLeftCRI(t, vm.id)

	p, vm, err = vmPodOn(ctx, t, c, runtimeHandler, "uefi-on-bios", labelled, map[string]string{annotationFirmware: "bios"})
	if err != nil {
		t.Fatal(err)
	}
	assertNoBoot(ctx, t, vm)
	p.remove(t)
	assertNothingLeftCRI(t, vm.id)
}

// TestFirmwareSecureBoot boots Debian's signed boot chain (shim, GRUB,
// kernel) with vmshim.io/firmware uefi-secure: the guest sees Secure Boot
// on. The same disk with an unsigned GRUB is refused by the firmware, and
// the console says why.
func TestFirmwareSecureBoot(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), uefiBootTimeout+noBootWait+time.Minute)
	defer cancel()
	c := newCRI(t, env.daemon)
	p, vm, err := vmPodOn(ctx, t, c, runtimeHandler, "secureboot", imageDiskUEFISecure, map[string]string{annotationFirmware: "uefi-secure"})
	if err != nil {
		t.Fatal(err)
	}
	vm.waitLog(ctx, t, "VMSHIM-EFI secureboot=1")
	vm.waitLog(ctx, t, markerBooted)
	p.remove(t)
	assertNothingLeftCRI(t, vm.id)

	// shim draws its refusal as a message box, with cursor moves and no
	// newline, and waits for a key: the line-based CRI log does not have
	// it yet, the console's byte stream through attach does.
	p = c.runPod(ctx, t, "secureboot-unsigned")
	vm = p.createVMWith(ctx, t, imageDiskUEFIUnsigned, func(cfg *runtimeapi.ContainerConfig) {
		cfg.Annotations = map[string]string{annotationFirmware: "uefi-secure"}
		cfg.Stdin, cfg.Tty = true, true
	})
	if _, err := c.runtime.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: vm.id}); err != nil {
		t.Fatalf("StartContainer: %v", err)
	}
	console := vm.attachOutput(ctx, t)
	console.waitFor(ctx, t, "Security Violation")
	if i := strings.Index(console.String(), "Verification failed"); i >= 0 {
		t.Logf("console: %q", console.String()[i:min(len(console.String()), i+60)])
	}
	assertNoBoot(ctx, t, vm)
	p.remove(t)
	assertNothingLeftCRI(t, vm.id)
}

// attachOutput streams vm's console (a container made with Stdin and Tty)
// through CRI attach, as kubectl attach does, until the test ends.
func (c *criContainer) attachOutput(ctx context.Context, t *testing.T) *consoleOut {
	t.Helper()
	resp, err := c.p.c.runtime.Attach(ctx, &runtimeapi.AttachRequest{ContainerId: c.id, Stdout: true, Tty: true})
	if err != nil {
		t.Fatalf("Attach: %v", err)
	}
	u, err := url.Parse(resp.Url)
	if err != nil {
		t.Fatal(err)
	}
	out := newConsoleOut()
	streamCtx, stop := context.WithCancel(ctx)
	streamed := make(chan struct{})
	go func() {
		defer close(streamed)
		_ = inNetns("/run/netns/"+env.daemon.netns, func() error {
			exec, err := remotecommand.NewSPDYExecutor(&rest.Config{}, "POST", u)
			if err != nil {
				return err
			}
			return exec.StreamWithContext(streamCtx, remotecommand.StreamOptions{Stdout: out, Tty: true})
		})
	}()
	t.Cleanup(func() {
		stop()
		<-streamed
	})
	return out
}

// assertNoBoot watches vm's log for noBootWait: its guest must not boot.
func assertNoBoot(ctx context.Context, t *testing.T, vm *criContainer) {
	t.Helper()
	deadline := time.Now().Add(noBootWait)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if _, booted := findLogLine(vm.log, markerBooted); booted {
			t.Fatalf("the guest booted")
		}
		time.Sleep(time.Second)
	}
}

// TestGuestWithoutVirtio boots the disk guest on a SATA disk with an e1000
// NIC, as a guest without virtio drivers would need: its disk is sda, its
// seed a CD-ROM on the same controller, and it gets the pod IP by DHCP.
func TestGuestWithoutVirtio(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*bootTimeout)
	defer cancel()
	c := newCRI(t, env.daemon)
	p, vm, err := vmPodOn(ctx, t, c, runtimeHandler, "sata-e1000", imageDiskWait, map[string]string{annotationDiskDrv: "sata", annotationNICModel: "e1000"})
	if err != nil {
		t.Fatal(err)
	}
	disks := vm.waitLog(ctx, t, markerDisks)
	if !strings.Contains(disks, " sda:") {
		t.Errorf("guest disks %q: want the root disk as sda", disks)
	}
	lease := leaseFields(vm.waitLog(ctx, t, "VMSHIM-LEASE"))
	if ip := p.ip(ctx, t); lease["ip"] != ip {
		t.Errorf("lease %v, want the pod IP %s", lease, ip)
	}
	p.remove(t)
	assertNothingLeftCRI(t, vm.id)
}

// TestGraphicsVNC gives a VM a display and takes a screenshot of it with a
// real VNC client (gtk-vnc's gvnccapture) through CRI port-forward to
// port 5900: the picture shows the guest's text console, not a blank
// screen.
func TestGraphicsVNC(t *testing.T) {
	capture, err := exec.LookPath("gvnccapture")
	if err != nil {
		t.Fatalf("gvnccapture (Debian's gvncviewer) is not installed: make setup installs it")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*bootTimeout)
	defer cancel()
	c := newCRI(t, env.daemon)
	p, vm, err := vmPodOn(ctx, t, c, runtimeHandler, "vnc", imageDiskWait, map[string]string{annotationGraphics: "vnc"})
	if err != nil {
		t.Fatal(err)
	}
	vm.waitLog(ctx, t, markerBooted)
	const display = 1 // gvnccapture's 127.0.0.1:1 is port 5901
	p.forwardLocally(ctx, t, 5900+display, 5900)
	shot := filepath.Join(t.TempDir(), "vnc.png")
	cmd := exec.CommandContext(ctx, "nsenter", "--net=/run/netns/"+env.daemon.netns, "--", capture, "127.0.0.1:"+strconv.Itoa(display), shot)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("gvnccapture: %v: %s", err, out)
	}
	f, err := os.Open(shot)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	colours := distinctColours(img)
	t.Logf("screenshot %v, %d colours", img.Bounds().Size(), colours)
	if colours < 2 {
		t.Errorf("the screenshot is blank")
	}
	if dir := os.Getenv("VMSHIM_SCREENSHOT_DIR"); dir != "" {
		b, _ := os.ReadFile(shot)
		_ = os.WriteFile(filepath.Join(dir, "vnc-console.png"), b, 0o644)
	}
	p.remove(t)
	assertNothingLeftCRI(t, vm.id)
}

// distinctColours counts the colours of img, up to 16.
func distinctColours(img image.Image) int {
	seen := map[[4]uint32]bool{}
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y += 2 {
		for x := b.Min.X; x < b.Max.X; x += 2 {
			r, g, bl, a := img.At(x, y).RGBA()
			seen[[4]uint32{r, g, bl, a}] = true
			if len(seen) >= 16 {
				return len(seen)
			}
		}
	}
	return len(seen)
}

// forwardLocally listens on 127.0.0.1:local in the pod's daemon's network
// namespace and forwards each connection, through the CRI's port-forward
// stream as kubectl port-forward does, to port of the pod, until the test
// ends.
func (p *pod) forwardLocally(ctx context.Context, t *testing.T, local, port int) {
	t.Helper()
	serveIn(t, "/run/netns/"+p.c.d.netns, "tcp4", fmt.Sprintf("127.0.0.1:%d", local), func(conn net.Conn) {
		p.forwardConn(ctx, t, conn, port)
	})
}

// forwardConn relays conn through a CRI port-forward stream to port.
func (p *pod) forwardConn(ctx context.Context, t *testing.T, conn net.Conn, port int) {
	defer conn.Close()
	sc, _, data, err := p.openForward(ctx, port)
	if err != nil {
		t.Logf("port-forward to %d: %v", port, err)
		return
	}
	defer sc.Close()
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(conn, data)
		close(done)
	}()
	_, _ = io.Copy(data, conn)
	data.Close()
	<-done
}

// TestInstallerISO boots an image that holds only an installer's ISO
// (/disk/install.iso): the VM gets an empty root disk and the ISO as a
// CD-ROM after it in the boot order, so SeaBIOS passes over the empty disk
// and boots the CD; then the same ISO fetched by URL.
func TestInstallerISO(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*bootTimeout)
	defer cancel()
	iso, err := os.ReadFile(filepath.Join(env.guestDir, "cdrom-wait.iso"))
	if err != nil {
		t.Fatal(err)
	}
	const ref = "localhost/vmshim-test/installer:wait"
	archive := filepath.Join(t.TempDir(), "installer.tar")
	if err := writeArchive(archive, ref, map[string][]byte{"disk/install.iso": iso}); err != nil {
		t.Fatal(err)
	}
	if out, err := env.daemon.ctrIn(ctx, criNamespace, "images", "import", archive); err != nil {
		t.Fatalf("import: %v: %s", err, out)
	}
	c := newCRI(t, env.daemon)
	p, vm, err := vmPodOn(ctx, t, c, runtimeHandler, "installer", ref, map[string]string{annotationRootDiskSize: "1Gi"})
	if err != nil {
		t.Fatal(err)
	}
	assertInstaller(ctx, t, vm)
	p.remove(t)
	assertNothingLeftCRI(t, vm.id)

	// The same ISO fetched by URL: the shim knows it by its ISO 9660
	// descriptor, whatever the URL's name.
	s := startDiskServer(t, map[string][]byte{"/install": iso})
	p, vm, err = vmPodOn(ctx, t, c, runtimeHandler, "installer-url", pauseImage,
		map[string]string{annotationDiskURL: s.url("/install"), annotationDiskSHA256: digestOf(iso), annotationRootDiskSize: "1Gi"})
	if err != nil {
		t.Fatal(err)
	}
	assertInstaller(ctx, t, vm)
	p.remove(t)
	assertNothingLeftCRI(t, vm.id)
}

// assertInstaller waits for vm to boot its installer's CD-ROM, next to an
// empty 1 GiB root disk.
func assertInstaller(ctx context.Context, t *testing.T, vm *criContainer) {
	t.Helper()
	disks := vm.waitLog(ctx, t, markerDisks)
	vm.waitLog(ctx, t, markerBooted)
	t.Logf("guest %s", strings.TrimSpace(disks))
	if !strings.Contains(disks, "vda:2097152 ") || !strings.Contains(disks, "sr0:") {
		t.Errorf("guest disks %q: want the empty 1 GiB root disk (vda) and the installer's CD-ROM (sr0)", disks)
	}
}
