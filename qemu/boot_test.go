package qemu

import (
	"bytes"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmshim/vmshim/thread"
)

// bootSector returns a 1 MiB disk whose MBR code prints msg on COM1 and
// then either powers the machine off through ACPI (PM1a_CNT at SeaBIOS's
// PM base 0x600, SLP_EN with S5) or reports a panic to pvpanic.
func bootSector(msg string, panic bool) []byte {
	code := []byte{0xba, 0xf8, 0x03} // mov dx, 0x3f8
	for i := 0; i < len(msg); i++ {
		code = append(code, 0xb0, msg[i], 0xee) // mov al, c; out dx, al
	}
	if panic {
		code = append(code, 0xba, 0x05, 0x05, 0xb0, 0x01, 0xee) // mov dx, 0x505; mov al, 1; out dx, al
	} else {
		code = append(code, 0xba, 0x04, 0x06, 0xb8, 0x00, 0x20, 0xef) // mov dx, 0x604; mov ax, 0x2000; out dx, ax
	}
	code = append(code, 0xfa, 0xf4, 0xeb, 0xfd) // cli; hlt; jmp hlt
	disk := make([]byte, 1<<20)
	copy(disk, code)
	disk[510], disk[511] = 0x55, 0xaa
	return disk
}

// consolePair returns QEMU's end of a connected socketpair and ours.
func consolePair(t *testing.T) (*os.File, net.Conn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	theirs := os.NewFile(uintptr(fds[0]), "console-qemu")
	mine := os.NewFile(uintptr(fds[1]), "console")
	conn, err := net.FileConn(mine)
	mine.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { theirs.Close(); conn.Close() })
	return theirs, conn
}

// readUntilEOF reads the console until QEMU closes it or the deadline.
func readUntilEOF(conn net.Conn, d time.Duration) string {
	_ = conn.SetReadDeadline(time.Now().Add(d))
	var out bytes.Buffer
	buf := make([]byte, 4096)
	for {
		n, err := conn.Read(buf)
		out.Write(buf[:n])
		if err != nil {
			return out.String()
		}
	}
}

// TestBootDisk boots a disk through SeaBIOS on q35 under TCG with each disk
// driver: a qcow2 overlay over a raw base (the overlay names a missing
// backing file, which must be ignored), paths with commas, a read-only
// second disk, the console on a socketpair, and guest poweroff → exit 0.
func TestBootDisk(t *testing.T) {
	bin := qemuBinary(t)
	qemuImg, err := exec.LookPath("qemu-img")
	if err != nil {
		t.Skip("qemu-img not installed")
	}
	for _, driver := range []string{DriverVirtioBlk, DriverVirtioSCSI, DriverNVMe} {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			dir := filepath.Join(t.TempDir(), "a,b")
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			base := filepath.Join(dir, "base,1.raw")
			if err := os.WriteFile(base, bootSector("BOOT-OK "+driver+"\r\n", false), 0o644); err != nil {
				t.Fatal(err)
			}
			top := filepath.Join(dir, "top.qcow2")
			out, err := exec.Command(qemuImg, "create", "-q", "-f", "qcow2", "-F", "raw", "-b", "/nonexistent/decoy", "-u", top, "1M").CombinedOutput()
			if err != nil {
				t.Fatalf("qemu-img: %v: %s", err, out)
			}
			seed := filepath.Join(dir, "seed.raw")
			if err := os.WriteFile(seed, make([]byte, 1<<20), 0o644); err != nil {
				t.Fatal(err)
			}

			qemuEnd, console := consolePair(t)
			var fds FDSet
			spec := testSpec(dir)
			spec.ConsoleFD = fds.Add(qemuEnd)
			spec.Sandbox = true
			spec.Drives = []Drive{
				{ID: "root", Path: top, Format: FormatQCOW2, BackingPath: base, BackingFormat: FormatRaw, Driver: driver, BootIndex: 1},
				{ID: "seed", Path: seed, Format: FormatRaw, ReadOnly: true, Driver: driver, Serial: "seed,1"},
			}
			var stderr bytes.Buffer
			v, err := Launch(testCtx(t, 20*time.Second), LaunchConfig{Binary: bin, Spec: spec, Files: fds.Files(), Stderr: &stderr})
			if err != nil {
				t.Fatal(err)
			}
			defer v.Kill()
			fds.Close()
			got := readUntilEOF(console, 20*time.Second)
			waitDone(t, v)
			if !strings.Contains(got, "BOOT-OK "+driver) {
				t.Errorf("console = %q; stderr: %s", got, stderr.String())
			}
			if code, _ := v.ExitStatus(); code != 0 {
				t.Errorf("exit status = %d, want 0 (guest poweroff); stderr: %s", code, stderr.String())
			}
		})
	}
}

// TestGuestPanicExitsNonZero checks that a pvpanic report makes QEMU exit 1.
func TestGuestPanicExitsNonZero(t *testing.T) {
	bin := qemuBinary(t)
	dir := t.TempDir()
	disk := filepath.Join(dir, "disk.raw")
	if err := os.WriteFile(disk, bootSector("PANIC\r\n", true), 0o644); err != nil {
		t.Fatal(err)
	}
	spec := testSpec(dir)
	spec.Drives = []Drive{{ID: "root", Path: disk, Format: FormatRaw, BootIndex: 1}}
	var stderr bytes.Buffer
	v, err := Launch(testCtx(t, 20*time.Second), LaunchConfig{Binary: bin, Spec: spec, Stderr: &stderr})
	if err != nil {
		t.Fatal(err)
	}
	defer v.Kill()
	waitDone(t, v)
	if code, _ := v.ExitStatus(); code != 1 {
		t.Errorf("exit status = %d, want 1; stderr: %s", code, stderr.String())
	}
}

// TestNICWithTap starts a paused VM with a NIC on a tap created in a
// private network namespace and reads the guest MAC back over QMP.
func TestNICWithTap(t *testing.T) {
	bin := qemuBinary(t)
	if os.Geteuid() != 0 {
		t.Skip("creating a network namespace and tap needs root")
	}
	tap, err := tapInNewNetns()
	if err != nil {
		t.Skipf("no tap device: %v", err)
	}
	defer tap.Close()
	dir := t.TempDir()
	var fds FDSet
	spec := testSpec(dir)
	spec.Paused = true
	spec.Sandbox = true
	spec.NICs = []NIC{{ID: "eth0", TapFD: fds.Add(tap), MAC: "0A:58:0A:F4:00:07"}}
	ctx := testCtx(t, 20*time.Second)
	var stderr bytes.Buffer
	v, err := Launch(ctx, LaunchConfig{Binary: bin, Spec: spec, Files: fds.Files(), Stderr: &stderr})
	if err != nil {
		t.Fatalf("%v; stderr: %s", err, stderr.String())
	}
	defer func() { v.Kill(); waitDone(t, v) }()
	var filters []struct {
		Name    string `json:"name"`
		MainMAC string `json:"main-mac"`
	}
	if err := v.QMP().Execute(ctx, "query-rx-filter", map[string]string{"name": NICDeviceID("eth0")}, &filters); err != nil {
		t.Fatal(err)
	}
	if len(filters) != 1 || filters[0].MainMAC != "0a:58:0a:f4:00:07" {
		t.Errorf("rx filters = %+v", filters)
	}
}

// tapInNewNetns creates a tap device in a new network namespace and
// returns its fd, which keeps the namespace.
func tapInNewNetns() (*os.File, error) {
	var tap *os.File
	err := thread.Run(func() error {
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		ifr, err := unix.NewIfreq("tap0")
		if err == nil {
			ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
			err = unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr)
		}
		if err != nil {
			unix.Close(fd)
			return errors.Join(errors.New("TUNSETIFF"), err)
		}
		tap = os.NewFile(uintptr(fd), "tap0")
		return nil
	}, thread.NewNetns)
	return tap, err
}
