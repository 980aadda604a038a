package integration

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	runtimeoptions "github.com/containerd/containerd/api/types/runtimeoptions/v1"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/vmshim/vmshim/config"
)

// badInput is one case of TestBadInputFailsCleanly: a task that must fail
// when it is created (or started) with one line containing want.
type badInput struct {
	name       string
	want       string                // what the error must say, naming the problem
	image      string                // image ref; "" = imageKernelWait
	layer      map[string]layerEntry // a hand-made image, imported for the case, instead of image
	config     string                // body of a shim config file passed as ConfigPath
	configPath string                // ConfigPath as given (a path that is not a usable file)
	ann        map[string]string     // spec annotations
	opts       []oci.SpecOpts        // more spec options
	stdout     string                // the task's stdout URI instead of a fifo
}

// TestBadInputFailsCleanly creates tasks from bad annotations, config
// files, OCI specs and images: each fails at create (or start) with one
// line naming the problem, boots no VM and leaves nothing behind.
func TestBadInputFailsCleanly(t *testing.T) {
	var cases []badInput
	cases = append(cases, badAnnotations(t)...)
	cases = append(cases, badConfigs()...)
	cases = append(cases, badSpecs()...)
	cases = append(cases, badImages(t)...)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { runBadInput(t, tc) })
	}
	t.Run("cri", testBadInputCRI)
}

// oneAnn is a map of one annotation.
func oneAnn(key, value string) map[string]string { return map[string]string{key: value} }

// badAnnotations are vmshim.io/* annotations that break a rule each.
func badAnnotations(t *testing.T) []badInput {
	key := sshPublicKey(t, "bad-input")
	const mime = "Content-Type: multipart/mixed; boundary=X\nMIME-Version: 1.0\n\n--X\n\n#!/bin/sh\n--X--\n"
	return []badInput{
		{name: "vcpus-zero", ann: oneAnn(config.AnnotationVCPUs, "0"), want: "annotation vmshim.io/vcpus: 0 is not in 1..16 (max_vcpus)"},
		{name: "vcpus-negative", ann: oneAnn(config.AnnotationVCPUs, "-1"), want: `annotation vmshim.io/vcpus: "-1" is not a whole number`},
		{name: "vcpus-word", ann: oneAnn(config.AnnotationVCPUs, "abc"), want: `annotation vmshim.io/vcpus: "abc" is not a whole number`},
		{name: "vcpus-above-max", ann: oneAnn(config.AnnotationVCPUs, "17"), want: "annotation vmshim.io/vcpus: 17 is not in 1..16 (max_vcpus)"},
		{name: "memory-below-min", ann: oneAnn(config.AnnotationMemory, "10Mi"), want: `annotation vmshim.io/memory: "10Mi" is not in 64Mi..16Gi (max_memory)`},
		{name: "memory-word", ann: oneAnn(config.AnnotationMemory, "lots"), want: `annotation vmshim.io/memory: "lots" is not a quantity (e.g. 512Mi)`},
		{name: "memory-negative", ann: oneAnn(config.AnnotationMemory, "-1Gi"), want: `annotation vmshim.io/memory: "-1Gi" is negative`},
		{name: "memory-above-max", ann: oneAnn(config.AnnotationMemory, "32Gi"), want: `annotation vmshim.io/memory: "32Gi" is not in 64Mi..16Gi (max_memory)`},
		{name: "memory-above-limit", ann: oneAnn(config.AnnotationMemory, "256Mi"), opts: []oci.SpecOpts{oci.WithMemoryLimit(128 << 20)},
			want: "annotation vmshim.io/memory: 268435456 bytes is more than the container's memory limit (134217728 bytes)"},
		{name: "disk-driver-floppy", ann: oneAnn(config.AnnotationDiskDriver, "floppy"), want: `annotation vmshim.io/disk-driver: "floppy" is not one of virtio-blk, virtio-scsi, nvme, sata, ide`},
		{name: "root-disk-size-zero", ann: oneAnn(config.AnnotationRootDiskSize, "0"), want: `annotation vmshim.io/root-disk-size: "0" must be greater than zero`},
		{name: "root-disk-size-above-max", ann: oneAnn(config.AnnotationRootDiskSize, "1Ti"), want: `annotation vmshim.io/root-disk-size: "1Ti" is more than 256Gi (max_disk_size)`},
		{name: "machine-unknown", ann: oneAnn(config.AnnotationMachine, "pc"), want: `annotation vmshim.io/machine: "pc" is not one of q35, microvm`},
		{name: "microvm-disk-image", image: imageDiskWait, ann: oneAnn(config.AnnotationMachine, "microvm"),
			want: "annotation vmshim.io/machine: microvm boots a kernel directly, and the image boots a disk"},
		{name: "microvm-screen", ann: map[string]string{config.AnnotationMachine: "microvm", config.AnnotationGraphics: "vnc"},
			want: "annotation vmshim.io/machine: microvm has no display, which annotation vmshim.io/graphics asks for"},
		{name: "root-disk-size-below-image", image: imageDiskWait, ann: oneAnn(config.AnnotationRootDiskSize, "1Mi"),
			want: "annotation vmshim.io/root-disk-size: 1048576 bytes is smaller than the image's disk /disk/"},
		{name: "user-data-bad-yaml", ann: oneAnn(config.AnnotationUserData, "#cloud-config\nruncmd: [unclosed\n"),
			want: "annotation vmshim.io/user-data: cloud-config is not valid YAML: line "},
		{name: "user-data-not-mapping", ann: oneAnn(config.AnnotationUserData, "#cloud-config\n- a\n- b\n"),
			want: "annotation vmshim.io/user-data: cloud-config must be a YAML mapping, not a list"},
		{name: "user-data-keys-not-list", ann: oneAnn(config.AnnotationUserData, "#cloud-config\nssh_authorized_keys: "+key+"\n"),
			want: "annotation vmshim.io/user-data: cloud-config key ssh_authorized_keys must be a list, not a string"},
		{name: "user-data-too-big", ann: oneAnn(config.AnnotationUserData, "#!/bin/sh\n"+strings.Repeat("#", config.MaxUserData)),
			want: "annotation vmshim.io/user-data: 65546 bytes, more than 65536"},
		{name: "user-data-unknown-kind", ann: oneAnn(config.AnnotationUserData, "hostname: vm\n"),
			want: "annotation vmshim.io/user-data: user-data must start with #cloud-config or #!"},
		{name: "user-data-mime-with-keys", ann: map[string]string{config.AnnotationUserData: mime, config.AnnotationSSHAuthorizedKeys: key},
			want: "annotation vmshim.io/user-data: MIME multipart user-data cannot be combined with vmshim.io/ssh-authorized-keys"},
		{name: "network-config-bad-yaml", ann: oneAnn(config.AnnotationNetworkConfig, "version: 2\nethernets: {eth0: [\n"),
			want: "annotation vmshim.io/network-config: not valid YAML: line "},
		{name: "network-config-version-3", ann: oneAnn(config.AnnotationNetworkConfig, "version: 3\n"),
			want: "annotation vmshim.io/network-config: version must be 1 or 2"},
		{name: "network-config-no-version", ann: oneAnn(config.AnnotationNetworkConfig, "ethernets: {}\n"),
			want: "annotation vmshim.io/network-config: has no version key (1 or 2)"},
		{name: "ssh-keys-garbage", ann: oneAnn(config.AnnotationSSHAuthorizedKeys, key+"\nnot a key\n"),
			want: `annotation vmshim.io/ssh-authorized-keys: line 2 is not an ssh public key ("type base64 [comment]")`},
		{name: "kernel-cmdline-newline", ann: oneAnn(config.AnnotationKernelCmdline, "quiet\ninit=/bin/sh"),
			want: "annotation vmshim.io/kernel-cmdline: contains a newline or NUL"},
		{name: "kernel-cmdline-too-long", ann: oneAnn(config.AnnotationKernelCmdline, strings.Repeat("x", 4097)),
			want: "annotation vmshim.io/kernel-cmdline: 4097 bytes, more than 4096"},
		{name: "unknown-annotation", ann: map[string]string{"vmshim.io/cpus": "2", "vmshim.io/vcpus": "1"},
			want: "unknown annotation vmshim.io/cpus"},
		{name: "cpu-topology-word", ann: oneAnn(config.AnnotationCPUTopology, "sockets=1,cores=x,threads=1"),
			want: `annotation vmshim.io/cpu-topology: "sockets=1,cores=x,threads=1": cores: "x" is not a whole number`},
		{name: "cpu-topology-above-max", ann: oneAnn(config.AnnotationCPUTopology, "sockets=4,cores=4,threads=2"),
			want: "annotation vmshim.io/cpu-topology: sockets=4,cores=4,threads=2 holds 32 vcpus, want 1..16"},
		{name: "max-memory-word", ann: oneAnn(config.AnnotationMaxMemory, "lots"), want: `annotation vmshim.io/max-memory: "lots" is not a quantity (e.g. 512Mi)`},
		{name: "max-memory-below-guest-ram", ann: oneAnn(config.AnnotationMaxMemory, "128Mi"), opts: []oci.SpecOpts{oci.WithMemoryLimit(256 << 20)},
			want: "annotation vmshim.io/max-memory: 128 MiB is less than the 256 MiB of guest RAM at boot"},
		{name: "hugepages-not-guest-ram", ann: oneAnn(config.AnnotationMemory, "256Mi"), opts: []oci.SpecOpts{withHugepages("2MB", 128<<20)},
			want: "hugepages-2Mi limit 128 MiB does not match guest RAM 256 MiB (annotation vmshim.io/memory)"},
		{name: "cpuset-word", opts: []oci.SpecOpts{oci.WithCPUs("0-x")}, want: "spec linux.resources.cpu.cpus: "},
	}
}

// withHugepages gives the spec a hugepages limit.
func withHugepages(size string, limit uint64) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *specs.Spec) error {
		if s.Linux.Resources == nil {
			s.Linux.Resources = &specs.LinuxResources{}
		}
		s.Linux.Resources.HugepageLimits = []specs.LinuxHugepageLimit{{Pagesize: size, Limit: limit}}
		return nil
	}
}

// badConfigs are shim config files that break a rule each.
func badConfigs() []badInput {
	const missing = "/nonexistent/vmshim/config.toml"
	return []badInput{
		{name: "config-unknown-key", config: "accel = \"tcg\"\nmax_cpus = 4\n", want: `unknown key "max_cpus"`},
		{name: "config-accel", config: `accel = "fast"`, want: `accel: "fast" is not one of auto, kvm, tcg`},
		{name: "config-qemu-binary-empty", config: `qemu_binary = ""`, want: "qemu_binary: must not be empty"},
		{name: "config-qemu-binary-relative", config: `qemu_binary = "bin/qemu"`, want: `qemu_binary: "bin/qemu" must be a command name or an absolute path`},
		{name: "config-qemu-binary-missing", config: `qemu_binary = "/nonexistent/qemu-system-x86_64"`,
			want: `config qemu_binary: "/nonexistent/qemu-system-x86_64" not found`},
		{name: "config-default-memory", config: `default_memory = "x"`, want: `default_memory: "x" is not a quantity (e.g. 512Mi)`},
		{name: "config-max-memory", config: `max_memory = "32Mi"`, want: `max_memory: "32Mi" is less than 64Mi`},
		{name: "config-max-vcpus", config: "max_vcpus = 0", want: "max_vcpus: 0 is not in 1..288"},
		{name: "config-default-max-memory", config: `default_max_memory = "32Gi"`, want: `default_max_memory: "32Gi" is not in 64Mi..16Gi (max_memory)`},
		{name: "config-max-vcpus-type", config: `max_vcpus = "four"`, want: "max_vcpus"},
		{name: "config-disk-driver", config: `disk_driver = "floppy"`, want: `disk_driver: "floppy" is not one of virtio-blk, virtio-scsi, nvme, sata, ide`},
		{name: "config-boot-timeout", config: `boot_timeout = "soon"`, want: `boot_timeout: "soon" is not a duration (e.g. 60s)`},
		{name: "config-cni-network", config: `cni_network = "my net"`, want: `cni_network: "my net" is not a CNI network name`},
		{name: "config-cni-conf-dir", config: `cni_conf_dir = "etc/cni/net.d"`, want: `cni_conf_dir: "etc/cni/net.d" must be an absolute path`},
		{name: "config-syntax", config: "accel = \"tcg\nmax_vcpus = 4\n", want: "line 1"},
		{name: "config-missing", configPath: missing, want: "config " + missing + ": file does not exist"},
		{name: "config-directory", configPath: "/etc", want: "config /etc: read /etc: is a directory"},
	}
}

// withCreateRuntimeHook gives the spec one createRuntime hook.
func withCreateRuntimeHook(h specs.Hook) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *specs.Spec) error {
		s.Hooks = &specs.Hooks{CreateRuntime: []specs.Hook{h}}
		return nil
	}
}

// badSpecs are OCI specs and task IO the shim refuses.
func badSpecs() []badInput {
	zero := 0
	return []badInput{
		{name: "hook-relative-path", opts: []oci.SpecOpts{withCreateRuntimeHook(specs.Hook{Path: "hooks/net.sh"})},
			want: `createRuntime hook #0: path "hooks/net.sh" is not absolute`},
		{name: "hook-timeout-zero", opts: []oci.SpecOpts{withCreateRuntimeHook(specs.Hook{Path: "/bin/true", Timeout: &zero})},
			want: "createRuntime hook #0 (/bin/true): timeout 0 is not a positive number of seconds"},
		{name: "hook-fails", opts: []oci.SpecOpts{withCreateRuntimeHook(specs.Hook{Path: "/bin/sh", Args: []string{"sh", "-c", "echo no network for you >&2; exit 2"}})},
			want: "createRuntime hook #0 (/bin/sh): exit status 2: no network for you"},
		{name: "memory-limit-below-min", opts: []oci.SpecOpts{oci.WithMemoryLimit(32 << 20)},
			want: "spec linux.resources.memory.limit: 33554432 bytes is less than 64Mi"},
		{name: "cpu-quota-above-max", opts: []oci.SpecOpts{oci.WithCPUCFS(3200000, 100000)},
			want: "spec linux.resources.cpu: quota 3200000 / period 100000 gives 32 vcpus, more than 16 (max_vcpus)"},
		{name: "stdout-tcp", stdout: "tcp://x", want: `stdout "tcp://x": scheme "tcp" is not one of fifo, file, binary`},
		{name: "stdout-logger-relative", stdout: "binary:vmshim-logger", want: `"binary:vmshim-logger"`},
		{name: "stdout-logger-missing", stdout: "binary:///nonexistent/vmshim-logger",
			want: "start logging binary /nonexistent/vmshim-logger: fork/exec /nonexistent/vmshim-logger: no such file or directory"},
	}
}

// badImages are VM images with no single usable disk or kernel.
func badImages(t *testing.T) []badInput {
	kernel := layerFile([]byte("not really a kernel\n"))
	vmdk := filepath.Join(t.TempDir(), "disk.vmdk")
	qemuImg(t, filepath.Dir(vmdk), "create", "-q", "-f", "vmdk", vmdk, "64M")
	vmdkData, err := os.ReadFile(vmdk)
	if err != nil {
		t.Fatal(err)
	}
	return []badInput{
		{name: "image-two-disks", layer: map[string]layerEntry{"disk/a.qcow2": layerFile(makeQCOW2(t, "64M")), "disk/b.qcow2": layerFile(makeQCOW2(t, "64M"))},
			want: "more than one disk file in image: /disk/a.qcow2, /disk/b.qcow2"},
		{name: "image-two-kernels", layer: map[string]layerEntry{"boot/vmlinuz-6.1": kernel, "boot/vmlinuz-6.12": kernel},
			want: "more than one kernel in image: /boot/vmlinuz-6.1, /boot/vmlinuz-6.12"},
		{name: "image-two-initrds", layer: map[string]layerEntry{"boot/vmlinux": kernel, "boot/initrd.img": kernel, "boot/initramfs.img": kernel},
			want: "more than one initrd in image: /boot/initramfs.img, /boot/initrd.img"},
		{name: "image-empty-kernel", layer: map[string]layerEntry{"boot/vmlinux": layerFile(nil)}, want: "kernel /boot/vmlinux: empty file"},
		{name: "image-empty-disk", layer: map[string]layerEntry{"disk/disk.qcow2": layerFile(nil)}, want: "disk /disk/disk.qcow2: empty file"},
		{name: "image-disk-directory", layer: map[string]layerEntry{"disk/disk.qcow2/README": layerFile([]byte("x\n"))},
			want: "disk /disk/disk.qcow2: not a regular file (directory)"},
		{name: "image-vmdk", layer: map[string]layerEntry{"disk/disk.vmdk": layerFile(vmdkData)},
			want: "disk /disk/disk.vmdk: unsupported disk format vmdk (convert it to qcow2 or raw)"},
		{name: "image-zero-size", layer: map[string]layerEntry{"disk/disk.qcow2": layerFile(makeQCOW2(t, "0"))},
			want: "disk /disk/disk.qcow2: image is empty (virtual size 0)"},
	}
}

// runBadInput creates the case's task, expects it to fail at create or
// start with one line containing tc.want, and checks nothing is left.
func runBadInput(t *testing.T, tc badInput) {
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	ref := tc.image
	if ref == "" {
		ref = imageKernelWait
	}
	if tc.layer != nil {
		ref = "localhost/vmshim-test/badinput:" + tc.name
		archive := filepath.Join(t.TempDir(), "image.tar")
		if err := writeLinkArchive(archive, ref, tc.layer); err != nil {
			t.Fatal(err)
		}
		if out, err := env.daemon.ctr(ctx, "images", "import", archive); err != nil {
			t.Fatalf("import: %v: %s", err, out)
		}
		defer env.daemon.ctr(context.Background(), "images", "rm", ref)
	}
	var runtimeOpts any
	switch {
	case tc.configPath != "":
		runtimeOpts = &runtimeoptions.Options{ConfigPath: tc.configPath}
	case tc.config != "":
		p := filepath.Join(t.TempDir(), "vmshim.toml")
		if err := os.WriteFile(p, []byte(tc.config), 0o644); err != nil {
			t.Fatal(err)
		}
		runtimeOpts = &runtimeoptions.Options{ConfigPath: p}
	}
	opts := tc.opts
	if tc.ann != nil {
		opts = append([]oci.SpecOpts{oci.WithAnnotations(tc.ann)}, opts...)
	}
	id := uniqueID(t)
	var v *vm
	var err error
	if tc.stdout != "" {
		v, err = createVMWithIO(ctx, t, id, ref, tc.stdout, opts...)
	} else {
		v, err = createVM(ctx, t, id, ref, runtimeOpts, opts...)
	}
	if err == nil {
		t.Logf("create succeeded; starting")
		err = v.task.Start(ctx)
	}
	switch {
	case err == nil:
		t.Errorf("task %s started; want an error naming %q", id, tc.want)
	case strings.Contains(err.Error(), "\n"):
		t.Errorf("error is not one line:\n%v", err)
	case !strings.Contains(err.Error(), tc.want):
		t.Errorf("error %q does not say %q", err, tc.want)
	}
	t.Logf("error: %v", err)
	v.remove(t)
	assertNothingLeft(ctx, t, id)
}

// createVMWithIO is createVM with the task's stdout sent to a URI.
func createVMWithIO(ctx context.Context, t *testing.T, id, ref, stdout string, opts ...oci.SpecOpts) (*vm, error) {
	t.Helper()
	u, err := url.Parse(stdout)
	if err != nil {
		t.Fatal(err)
	}
	return env.createVM(ctx, t, id, ref, nil, func(*vm) cio.Creator { return cio.LogURI(u) }, opts...)
}

// testBadInputCRI runs the pod-level cases through the CRI: a bad
// vmshim.io annotation on the pod, which containerd passes to each of its
// containers, and a memory annotation above the container's CRI limit.
func testBadInputCRI(t *testing.T) {
	c := newCRI(t, env.daemon)
	cases := []struct {
		name           string
		podAnn, ctrAnn map[string]string
		memLimit       int64 // the container's CRI memory limit; 0 = none
		want           string
	}{
		{name: "pod-annotation", podAnn: oneAnn(config.AnnotationVCPUs, "many"),
			want: `annotation vmshim.io/vcpus: "many" is not a whole number`},
		{name: "memory-above-cri-limit", ctrAnn: oneAnn(config.AnnotationMemory, "1Gi"), memLimit: 256 << 20,
			want: "annotation vmshim.io/memory: 1073741824 bytes is more than the container's memory limit (268435456 bytes)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
			defer cancel()
			p := runPodAnnotated(ctx, t, c, tc.name, tc.podAnn)
			cfg := &runtimeapi.ContainerConfig{
				Metadata:    &runtimeapi.ContainerMetadata{Name: "vm"},
				Image:       &runtimeapi.ImageSpec{Image: imageKernelWaitCRI},
				LogPath:     "vm.log",
				Annotations: tc.ctrAnn,
			}
			if tc.memLimit > 0 {
				cfg.Linux = &runtimeapi.LinuxContainerConfig{Resources: &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: tc.memLimit}}
			}
			var id string
			created, err := c.runtime.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: p.id, Config: cfg, SandboxConfig: p.config})
			if err == nil {
				id = created.ContainerId
				_, err = c.runtime.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: id})
			}
			switch {
			case err == nil:
				t.Errorf("container started; want an error naming %q", tc.want)
			case strings.Contains(err.Error(), "\n"):
				t.Errorf("error is not one line:\n%v", err)
			case !strings.Contains(err.Error(), tc.want):
				t.Errorf("error %q does not say %q", err, tc.want)
			}
			t.Logf("error: %v", err)
			if id != "" {
				if _, err := c.runtime.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: id}); err != nil {
					t.Errorf("RemoveContainer: %v", err)
				}
			}
			p.remove(t)
			if id != "" {
				assertNothingLeftCRI(t, id)
				bundle := filepath.Join(env.daemon.dir, "state", "io.containerd.runtime.v2.task", criNamespace, id)
				if _, err := os.Stat(bundle); err == nil {
					t.Errorf("bundle left for %s: %s", id, bundle)
				}
				if _, err := os.Stat(vmNetns(criNamespace, id)); err == nil {
					t.Errorf("network namespace left for %s", id)
				}
			}
		})
	}
}

// runPodAnnotated is cri.runPod for a pod with annotations.
func runPodAnnotated(ctx context.Context, t *testing.T, c *cri, name string, annotations map[string]string) *pod {
	t.Helper()
	return c.runPodWith(ctx, t, name, 0, func(cfg *runtimeapi.PodSandboxConfig) { cfg.Annotations = annotations })
}
