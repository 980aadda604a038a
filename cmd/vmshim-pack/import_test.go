package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/platforms"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

func TestImportUnreachable(t *testing.T) {
	disk := writeTemp(t, "disk.qcow2", qcow2Header(3, 0, 1<<20, 0))
	outDir := t.TempDir()
	sock := filepath.Join(outDir, "none.sock")
	opts := packOptions{Disk: disk, Ref: "localhost/a:b", Output: filepath.Join(outDir, "out.tar"), GzipLevel: 1,
		Import: &importOptions{Address: sock, Namespace: "default"}}
	err := pack(context.Background(), opts)
	if err == nil || !strings.HasPrefix(err.Error(), "connect to containerd at "+sock+": ") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("err = %v, want one line starting with connect to containerd at %s", err, sock)
	}
	assertOnly(t, outDir) // nothing packed for nothing
}

// containerdConfig keeps a test containerd's files under one directory.
const containerdConfig = `version = 3
root = %[1]q
state = %[2]q
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime", "io.containerd.cri.v1.images", "io.containerd.nri.v1.nri"]
[grpc]
  address = %[3]q
[ttrpc]
  address = "%[3]s.ttrpc"
[plugins.'io.containerd.internal.v1.opt']
  path = %[4]q
`

// startContainerd runs the containerd of $VMSHIM_CONTAINERD in a network
// namespace of its own, with root, state and socket under a temporary
// directory, and returns its address. It is stopped, and its files
// removed, when the test ends.
func startContainerd(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("VMSHIM_CONTAINERD")
	if bin == "" {
		t.Skip("VMSHIM_CONTAINERD (a directory with a containerd 2.x binary) is not set")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root to run containerd")
	}
	bin = filepath.Join(bin, "containerd")
	dir := t.TempDir()
	addr := filepath.Join(dir, "containerd.sock")
	cfg := filepath.Join(dir, "config.toml")
	body := fmt.Sprintf(containerdConfig, filepath.Join(dir, "root"), filepath.Join(dir, "state"), addr, filepath.Join(dir, "opt"))
	if err := os.WriteFile(cfg, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(dir, "containerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	// unshare execs containerd, so the pid is containerd's; the anonymous
	// network namespace goes with it.
	cmd := exec.Command("unshare", "--net", "--", bin, "--config", cfg)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(waited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-waited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-waited
		}
		unmountUnder(t, dir)
		if t.Failed() {
			if log, err := os.ReadFile(logf.Name()); err == nil {
				t.Logf("containerd log:\n%s", log)
			}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		imp, err := dialContainerd(ctx, importOptions{Address: addr, Namespace: "default"})
		if err == nil {
			imp.close()
			return addr
		}
		select {
		case <-waited:
			t.Fatalf("containerd exited: %v", err)
		case <-ctx.Done():
			t.Fatalf("containerd did not come up: %v", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// unmountUnder unmounts whatever a dead containerd left mounted under dir,
// deepest first.
func unmountUnder(t *testing.T, dir string) {
	f, err := os.Open("/proc/self/mounts")
	if err != nil {
		t.Error(err)
		return
	}
	defer f.Close()
	var mounts []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		if fields := strings.Fields(s.Text()); len(fields) > 1 && strings.HasPrefix(fields[1], dir+"/") {
			mounts = append(mounts, fields[1])
		}
	}
	slices.Sort(mounts)
	for _, m := range slices.Backward(mounts) {
		if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", m, err)
		}
	}
}

func TestImportIntoContainerd(t *testing.T) {
	addr := startContainerd(t)
	qemuImg, err := exec.LookPath("qemu-img")
	if err != nil {
		t.Skip("no qemu-img")
	}
	disk := filepath.Join(t.TempDir(), "disk.qcow2")
	if out, err := exec.Command(qemuImg, "create", "-f", "qcow2", disk, "64M").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img create: %v: %s", err, out)
	}
	kernel := writeTemp(t, "vmlinux", elfHeader(2, 62))
	initrd := writeTemp(t, "initrd.img", []byte("070701 initrd"))

	tests := []struct {
		name        string
		opts        packOptions
		snapshotter string
		path        string
		labels      map[string]string
	}{
		{"qcow2 disk streamed, default snapshotter",
			packOptions{Disk: disk, Ref: "localhost/vmshim-pack/disk:1", Labels: map[string]string{"org.example.k": "v"}},
			"", "/disk/disk.qcow2",
			map[string]string{labelKind: "disk", labelDiskFormat: "qcow2", labelDiskSize: "67108864", "org.example.k": "v"}},
		{"kernel archive and import, zstd, native snapshotter",
			packOptions{Kernel: kernel, Initrd: initrd, Ref: "localhost/vmshim-pack/kernel:1", Compression: compressionZstd,
				Output: filepath.Join(t.TempDir(), "kernel.tar")},
			"native", "/boot/vmlinux",
			map[string]string{labelKind: "kernel", labelKernelKind: "vmlinux", labelInitrdPath: "/boot/initrd.img"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ns := "vmshim-pack-test"
			t.Setenv("TMPDIR", t.TempDir()) // where the layer goes without -o
			tt.opts.Import = &importOptions{Address: addr, Namespace: ns, Snapshotter: tt.snapshotter}
			tt.opts.Created, tt.opts.GzipLevel, tt.opts.ZstdLevel = time.Unix(1e9, 0), 1, 3
			if err := pack(context.Background(), tt.opts); err != nil {
				t.Fatal(err)
			}
			assertOnly(t, os.Getenv("TMPDIR"))
			checkImported(t, addr, ns, tt.opts.Ref, tt.snapshotter, tt.path, tt.labels)
		})
	}
}

// checkImported checks that image ref exists in namespace ns with labels
// and the boot file path as its command, and is unpacked for snapshotter.
func checkImported(t *testing.T, addr, ns, ref, snapshotter, path string, labels map[string]string) {
	t.Helper()
	c, err := client.New(addr, client.WithDefaultNamespace(ns))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := namespaces.WithNamespace(context.Background(), ns)
	img, err := c.ImageService().Get(ctx, ref)
	if err != nil {
		t.Fatalf("image %s in namespace %s: %v", ref, ns, err)
	}
	image := client.NewImageWithPlatform(c, img, platforms.Only(imagePlatform()))
	spec, err := image.Spec(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range labels {
		if spec.Config.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, spec.Config.Labels[k], v)
		}
	}
	if spec.Config.Labels[ocispec.AnnotationCreated] != "2001-09-09T01:46:40Z" {
		t.Errorf("created label %q", spec.Config.Labels[ocispec.AnnotationCreated])
	}
	if len(spec.Config.Cmd) != 1 || spec.Config.Cmd[0] != path {
		t.Errorf("cmd %v, want [%s]", spec.Config.Cmd, path)
	}
	unpacked, err := image.IsUnpacked(ctx, snapshotter)
	if err != nil || !unpacked {
		t.Errorf("unpacked for %q: %v, %v", snapshotter, unpacked, err)
	}
}
