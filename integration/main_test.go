// Package integration runs vmshim end to end: a real containerd 2.x
// daemon in its own network namespace, the shim binary, real QEMU and
// test guests built from Debian packages.
package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
)

// Environment the Makefile passes in.
const (
	envEnable     = "VMSHIM_INTEGRATION" // 1 to run these tests
	envBinDir     = "VMSHIM_BIN"         // directory holding containerd-shim-vm-v2
	envContainerd = "VMSHIM_CONTAINERD"  // directory holding containerd and ctr
	envGuestDir   = "VMSHIM_GUEST"       // directory the guest builder wrote
)

// testNamespace is the containerd namespace the tests use.
const testNamespace = "vmshim-test"

// suite is the daemon shared by every test of the package.
type suite struct {
	daemon   *daemon
	client   *client.Client
	guestDir string
	binDir   string
}

// env is set by TestMain for the tests; it is nil when they are skipped.
var env *suite

func TestMain(m *testing.M) {
	if os.Getenv(envEnable) != "1" {
		fmt.Fprintf(os.Stderr, "integration tests skipped: set %s=1 (make integration does)\n", envEnable)
		os.Exit(0)
	}
	code, err := run(m)
	if err != nil {
		fmt.Fprintf(os.Stderr, "integration: %v\n", err)
		os.Exit(1)
	}
	os.Exit(code)
}

func run(m *testing.M) (int, error) {
	if os.Geteuid() != 0 {
		return 0, fmt.Errorf("must run as root")
	}
	s := &suite{binDir: os.Getenv(envBinDir), guestDir: os.Getenv(envGuestDir)}
	for k, v := range map[string]string{envBinDir: s.binDir, envGuestDir: s.guestDir, envContainerd: os.Getenv(envContainerd)} {
		if v == "" {
			return 0, fmt.Errorf("%s is not set", k)
		}
	}
	d, err := startDaemon(os.Getenv(envContainerd), s.binDir, daemonOptions{cni: bridgeCNI})
	if err != nil {
		return 0, err
	}
	defer d.stop()
	// The cgroups the suite's containers ran under: the pod cgroups' base,
	// and ctr's /NAMESPACE parent (runtimes leave parents they made).
	defer removeCgroupParents(podCgroupBase, "/"+testNamespace)
	s.daemon = d
	if s.client, err = client.New(d.address, client.WithDefaultNamespace(testNamespace)); err != nil {
		return 0, fmt.Errorf("connect to containerd: %w", err)
	}
	defer s.client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := importImages(ctx, d, s.guestDir); err != nil {
		return 0, err
	}
	env = s
	return m.Run(), nil
}

// pauseArchive writes the archive of the CRI's pause image in the
// daemon's directory and returns its path.
func pauseArchive(d *daemon) (string, error) {
	pause := filepath.Join(d.dir, "pause.tar")
	return pause, writeArchive(pause, pauseImage, map[string][]byte{"pause": []byte("vmshim runs no process for pod sandboxes\n")})
}

// criDaemon starts a daemon of the test's own with opts, stopped when
// the test ends, and imports the pause image and the named test guests
// (archives in the guest directory) into the CRI's namespace.
func criDaemon(ctx context.Context, t *testing.T, opts daemonOptions, guests ...string) *daemon {
	t.Helper()
	d, err := startDaemon(os.Getenv(envContainerd), env.binDir, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.stop)
	pause, err := pauseArchive(d)
	if err != nil {
		t.Fatal(err)
	}
	archives := []string{pause}
	for _, g := range guests {
		archives = append(archives, filepath.Join(env.guestDir, g))
	}
	if err := importArchives(ctx, d, criNamespace, archives...); err != nil {
		t.Fatal(err)
	}
	return d
}

// importImages imports the test guests and the pause image into the
// namespaces of ctr (the tests') and of the CRI (k8s.io).
func importImages(ctx context.Context, d *daemon, guestDir string) error {
	pause, err := pauseArchive(d)
	if err != nil {
		return err
	}
	archives := []string{pause}
	for _, a := range []string{"disk-wait.tar", "disk-poweroff.tar", "kernel-wait.tar", "kernel-poweroff.tar", "kernel-agent.tar", "disk-agent.tar", "disk-cloud.tar",
		"disk-uefi.tar", "disk-uefi-secure.tar", "disk-uefi-unsigned.tar"} {
		archives = append(archives, filepath.Join(guestDir, a))
	}
	for _, ns := range []string{testNamespace, criNamespace} {
		if err := importArchives(ctx, d, ns, archives...); err != nil {
			return err
		}
	}
	return nil
}
