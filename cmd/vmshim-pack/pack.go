package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/distribution/reference"
	"github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Labels set on the image config; they describe what the image boots.
const (
	labelKind        = "io.vmshim.image.kind"        // "disk" or "kernel"
	labelDiskFormat  = "io.vmshim.disk.format"       // "qcow2" or "raw"
	labelDiskPath    = "io.vmshim.disk.path"         // absolute path of the disk in the rootfs
	labelDiskSize    = "io.vmshim.disk.virtual-size" // guest-visible disk size in bytes
	labelKernelPath  = "io.vmshim.kernel.path"       // absolute path of the kernel in the rootfs
	labelKernelKind  = "io.vmshim.kernel.format"     // "vmlinuz" (bzImage) or "vmlinux" (ELF)
	labelInitrdPath  = "io.vmshim.initrd.path"       // absolute path of the initrd in the rootfs
	annotationImgRef = "io.containerd.image.name"    // full image name, read by ctr and nerdctl on import
)

// packOptions says what to pack and where.
type packOptions struct {
	Disk      string    // qcow2 or raw disk; excludes Kernel
	Kernel    string    // bzImage or ELF kernel; excludes Disk
	Initrd    string    // optional initrd, only with Kernel
	Ref       string    // image reference, e.g. localhost/vm/debian:12
	Output    string    // path of the OCI archive to write
	Created   time.Time // image creation time, also used as file mtime
	GzipLevel int       // 1 (fastest) to 9 (smallest)
}

// imagePlan is what goes into the image: the layer's files and the labels.
type imagePlan struct {
	files  []layerFile
	labels map[string]string
	cmd    []string
}

// pack writes an OCI image layout archive holding the disk, or the kernel
// and initrd, of opts, named opts.Ref. The archive appears at opts.Output
// only when complete.
func pack(ctx context.Context, opts packOptions) (retErr error) {
	name, tag, err := checkOptions(opts)
	if err != nil {
		return err
	}
	var plan imagePlan
	if opts.Disk != "" {
		plan, err = planDisk(ctx, opts.Disk)
	} else {
		plan, err = planKernel(opts.Kernel, opts.Initrd)
	}
	if err != nil {
		return err
	}

	dir := filepath.Dir(opts.Output)
	layerTmp, err := os.CreateTemp(dir, ".vmshim-pack-layer-*")
	if err != nil {
		return fmt.Errorf("create temporary layer next to %s: %w", opts.Output, err)
	}
	defer func() {
		layerTmp.Close()
		os.Remove(layerTmp.Name())
	}()
	mtime := opts.Created.UTC().Truncate(time.Second)
	layer, err := writeLayer(ctx, layerTmp, plan.files, mtime, opts.GzipLevel)
	if err != nil {
		return fmt.Errorf("write layer for %s: %w", opts.Ref, err)
	}

	config, manifest, err := imageBlobs(plan, layer, mtime)
	if err != nil {
		return err
	}
	index := ocispec.Index{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageIndex,
		Manifests: []ocispec.Descriptor{{
			MediaType: manifest.desc.MediaType,
			Digest:    manifest.desc.Digest,
			Size:      manifest.desc.Size,
			Platform:  &ocispec.Platform{Architecture: "amd64", OS: "linux"},
			Annotations: map[string]string{
				annotationImgRef:          name,
				ocispec.AnnotationRefName: tag,
			},
		}},
	}

	out, err := os.CreateTemp(dir, ".vmshim-pack-out-*")
	if err != nil {
		return fmt.Errorf("create temporary archive next to %s: %w", opts.Output, err)
	}
	defer func() {
		if retErr != nil {
			out.Close()
			os.Remove(out.Name())
		}
	}()
	layerDesc := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageLayerGzip, Digest: layer.digest, Size: layer.size}
	if err := writeArchive(ctx, out, layerDesc, layerTmp, []jsonBlob{config, manifest}, index, mtime); err != nil {
		return fmt.Errorf("write archive %s: %w", opts.Output, err)
	}
	if err := out.Chmod(0o644); err != nil {
		return fmt.Errorf("chmod archive %s: %w", opts.Output, err)
	}
	if err := out.Close(); err != nil {
		return fmt.Errorf("close archive %s: %w", opts.Output, err)
	}
	if err := os.Rename(out.Name(), opts.Output); err != nil {
		return fmt.Errorf("rename archive to %s: %w", opts.Output, err)
	}
	log.G(ctx).WithField("ref", name).WithField("manifest", manifest.desc.Digest.String()).
		Debugf("packed %s", opts.Output)
	return nil
}

// checkOptions validates opts and returns the normalized image name and its
// tag.
func checkOptions(opts packOptions) (name, tag string, err error) {
	switch {
	case opts.Disk == "" && opts.Kernel == "":
		return "", "", fmt.Errorf("one of --disk or --kernel is required: %w", errdefs.ErrInvalidArgument)
	case opts.Disk != "" && opts.Kernel != "":
		return "", "", fmt.Errorf("--disk and --kernel are exclusive: %w", errdefs.ErrInvalidArgument)
	case opts.Initrd != "" && opts.Kernel == "":
		return "", "", fmt.Errorf("--initrd needs --kernel: %w", errdefs.ErrInvalidArgument)
	case opts.Output == "":
		return "", "", fmt.Errorf("an output archive (-o) is required: %w", errdefs.ErrInvalidArgument)
	case opts.GzipLevel < 1 || opts.GzipLevel > 9:
		return "", "", fmt.Errorf("gzip level %d is not between 1 and 9: %w", opts.GzipLevel, errdefs.ErrInvalidArgument)
	}
	return normalizeRef(opts.Ref)
}

// normalizeRef turns ref into a full name and its tag the way ctr and
// nerdctl do (busybox becomes docker.io/library/busybox:latest).
func normalizeRef(ref string) (name, tag string, err error) {
	if ref == "" {
		return "", "", fmt.Errorf("an image reference (--ref) is required: %w", errdefs.ErrInvalidArgument)
	}
	named, err := reference.ParseDockerRef(ref)
	if err != nil {
		return "", "", fmt.Errorf("image reference %q: %w: %w", ref, err, errdefs.ErrInvalidArgument)
	}
	tagged, ok := named.(reference.NamedTagged)
	if !ok {
		return "", "", fmt.Errorf("image reference %q has a digest, want a tag: %w", ref, errdefs.ErrInvalidArgument)
	}
	return tagged.String(), tagged.Tag(), nil
}

// planDisk checks the disk and places it under /disk/ (the KubeVirt
// containerDisk layout).
func planDisk(ctx context.Context, path string) (imagePlan, error) {
	f, err := os.Open(path)
	if err != nil {
		return imagePlan{}, fmt.Errorf("open disk %s: %w", path, err)
	}
	defer f.Close()
	info, err := inspectDisk(path, f)
	if err != nil {
		return imagePlan{}, err
	}
	dst := "disk/disk.img"
	if info.format == formatQcow2 {
		dst = "disk/disk.qcow2"
	} else {
		log.G(ctx).WithField("disk", path).Warn("raw disks unpack fully allocated; qcow2 images are smaller")
	}
	return imagePlan{
		files: []layerFile{{src: path, dst: dst}},
		labels: map[string]string{
			labelKind:       "disk",
			labelDiskFormat: info.format,
			labelDiskPath:   "/" + dst,
			labelDiskSize:   strconv.FormatInt(info.virtualSize, 10),
		},
		cmd: []string{"/" + dst},
	}, nil
}

// planKernel checks the kernel and initrd and places them under /boot/.
// The kernel keeps the name of its kind: vmlinuz for a bzImage, vmlinux
// for an uncompressed ELF.
func planKernel(kernel, initrd string) (imagePlan, error) {
	f, err := os.Open(kernel)
	if err != nil {
		return imagePlan{}, fmt.Errorf("open kernel %s: %w", kernel, err)
	}
	defer f.Close()
	kind, err := inspectKernel(kernel, f)
	if err != nil {
		return imagePlan{}, err
	}
	dst := "boot/" + kind
	plan := imagePlan{
		files: []layerFile{{src: kernel, dst: dst}},
		labels: map[string]string{
			labelKind:       "kernel",
			labelKernelPath: "/" + dst,
			labelKernelKind: kind,
		},
		cmd: []string{"/" + dst},
	}
	if initrd == "" {
		return plan, nil
	}
	g, err := os.Open(initrd)
	if err != nil {
		return imagePlan{}, fmt.Errorf("open initrd %s: %w", initrd, err)
	}
	defer g.Close()
	if err := inspectInitrd(initrd, g); err != nil {
		return imagePlan{}, err
	}
	plan.files = append(plan.files, layerFile{src: initrd, dst: "boot/initrd.img"})
	plan.labels[labelInitrdPath] = "/boot/initrd.img"
	return plan, nil
}

// imageBlobs builds the image config and the manifest for one layer.
// The config's Cmd names the boot file: the shim ignores it, but CRI
// refuses to create a container from an image without a command.
func imageBlobs(plan imagePlan, layer layerResult, created time.Time) (config, manifest jsonBlob, err error) {
	img := ocispec.Image{
		Created:  &created,
		Platform: ocispec.Platform{Architecture: "amd64", OS: "linux"},
		Config:   ocispec.ImageConfig{Labels: plan.labels, Cmd: plan.cmd},
		RootFS:   ocispec.RootFS{Type: "layers", DiffIDs: []digest.Digest{layer.diffID}},
		History:  []ocispec.History{{Created: &created, CreatedBy: "vmshim-pack"}},
	}
	config, err = newJSONBlob(ocispec.MediaTypeImageConfig, img)
	if err != nil {
		return jsonBlob{}, jsonBlob{}, err
	}
	m := ocispec.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageManifest,
		Config:    config.desc,
		Layers: []ocispec.Descriptor{{
			MediaType: ocispec.MediaTypeImageLayerGzip,
			Digest:    layer.digest,
			Size:      layer.size,
		}},
	}
	manifest, err = newJSONBlob(ocispec.MediaTypeImageManifest, m)
	if err != nil {
		return jsonBlob{}, jsonBlob{}, err
	}
	return config, manifest, nil
}
