package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/log"
	"github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/vmshim/vmshim/config"
	"github.com/vmshim/vmshim/image"
)

// Labels set on the image config; they describe what the image boots.
const (
	labelPrefix     = "io.vmshim."                  // owned by the packer
	labelKind       = "io.vmshim.image.kind"        // "disk", "kernel" or "pointer"
	labelDiskFormat = "io.vmshim.disk.format"       // "qcow2" or "raw"
	labelDiskPath   = "io.vmshim.disk.path"         // absolute path of the disk in the rootfs
	labelDiskSize   = "io.vmshim.disk.virtual-size" // guest-visible disk size in bytes
	labelKernelPath = "io.vmshim.kernel.path"       // absolute path of the kernel in the rootfs
	labelKernelKind = "io.vmshim.kernel.format"     // "vmlinuz" (bzImage) or "vmlinux" (ELF)
	labelInitrdPath = "io.vmshim.initrd.path"       // absolute path of the initrd in the rootfs
	labelDiskURL    = "io.vmshim.disk.url"          // URL of a pointer image's disk
	labelDiskSHA256 = "io.vmshim.disk.sha256"       // sha256 of a pointer image's disk
)

// imagePlatform is the platform of every packed image: the shim boots
// x86-64 guests.
func imagePlatform() ocispec.Platform {
	return ocispec.Platform{Architecture: "amd64", OS: "linux"}
}

// imagePlan is what goes into the image: the layer's files and the labels.
type imagePlan struct {
	files  []layerFile
	labels map[string]string
	cmd    []string
	name   string // what progress calls the input, e.g. "disk.qcow2"
	size   int64  // bytes of input to read
	temp   string // a file made for the image, removed after packing
}

// removeTemp removes the plan's temporary file, if any.
func (p imagePlan) removeTemp() {
	if p.temp != "" {
		os.Remove(p.temp)
	}
}

// makePlan checks the input files of opts and says where they go in the
// image, converting a raw disk to qcow2 in dir first when asked. The plan's
// temporary file must be removed even when makePlan fails.
func makePlan(ctx context.Context, opts packOptions, dir string) (imagePlan, error) {
	var plan imagePlan
	var err error
	switch {
	case opts.URL != "":
		plan, err = planPointer(opts.URL, opts.SHA256)
	case opts.Disk != "":
		plan, err = planDisk(ctx, opts, dir)
	default:
		plan, err = planKernel(opts.Kernel, opts.Initrd)
	}
	if err != nil {
		return plan, err
	}
	for _, f := range plan.files {
		size, err := f.size()
		if err != nil {
			return plan, err
		}
		plan.size += size
	}
	created := opts.Created.UTC().Truncate(time.Second)
	plan.labels[ocispec.AnnotationCreated] = created.Format(time.RFC3339)
	if opts.Description != "" {
		plan.labels[ocispec.AnnotationDescription] = opts.Description
	}
	if opts.Firmware != "" {
		plan.labels[config.LabelFirmware] = opts.Firmware
	}
	for k, v := range opts.Labels {
		plan.labels[k] = v
	}
	return plan, nil
}

// planDisk checks the disk and places it under /disk/ (the KubeVirt
// containerDisk layout). A raw disk becomes a qcow2 in dir first when
// opts.Qcow2 is set.
func planDisk(ctx context.Context, opts packOptions, dir string) (imagePlan, error) {
	path := opts.Disk
	info, err := inspectDiskFile(path)
	if err != nil {
		return imagePlan{}, err
	}
	plan := imagePlan{name: filepath.Base(path)}
	src := path
	switch {
	case info.format == formatRaw && opts.Qcow2:
		if plan.temp, err = convertToQcow2(ctx, opts.QemuImg, path, dir); err != nil {
			return plan, err
		}
		src = plan.temp
		if info, err = inspectDiskFile(src); err != nil {
			return plan, fmt.Errorf("converted disk %s: %w", path, err)
		}
	case info.format == formatRaw:
		log.G(ctx).WithField("disk", path).Warn("raw disks unpack fully allocated; qcow2 images are smaller (see --qcow2)")
	}
	dst := "disk/disk.img"
	if info.format == formatQcow2 {
		dst = "disk/disk.qcow2"
	}
	plan.files = []layerFile{{src: src, dst: dst}}
	plan.labels = map[string]string{
		labelKind:       "disk",
		labelDiskFormat: info.format,
		labelDiskPath:   "/" + dst,
		labelDiskSize:   strconv.FormatInt(info.virtualSize, 10),
	}
	plan.cmd = []string{"/" + dst}
	return plan, nil
}

// inspectDiskFile opens the disk at path and inspects its header.
func inspectDiskFile(path string) (diskInfo, error) {
	f, err := os.Open(path)
	if err != nil {
		return diskInfo{}, fmt.Errorf("open disk %s: %w", path, err)
	}
	defer f.Close()
	return inspectDisk(path, f)
}

// convertToQcow2 converts the raw disk at path to a qcow2 file in dir with
// qemuImg (default "qemu-img") and returns the new file's path. The input
// format is given, never probed.
func convertToQcow2(ctx context.Context, qemuImg, path, dir string) (string, error) {
	if qemuImg == "" {
		qemuImg = "qemu-img"
	}
	tmp, err := os.CreateTemp(dir, ".vmshim-pack-qcow2-*")
	if err != nil {
		return "", fmt.Errorf("create temporary qcow2 in %s: %w", dir, err)
	}
	name := tmp.Name()
	tmp.Close()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, qemuImg, "convert", "-f", "raw", "-O", "qcow2", path, name)
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		msg := strings.Join(strings.Fields(stderr.String()), " ")
		if msg != "" {
			return name, fmt.Errorf("convert disk %s to qcow2 with %s: %w: %s", path, qemuImg, err, msg)
		}
		return name, fmt.Errorf("convert disk %s to qcow2 with %s: %w", path, qemuImg, err)
	}
	return name, nil
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
		cmd:  []string{"/" + dst},
		name: filepath.Base(kernel),
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
	plan.name += " + " + filepath.Base(initrd)
	return plan, nil
}

// planPointer makes a pointer image: /disk/disk.url and /disk/disk.sha256,
// one line each, checked as the shim checks them, and no disk.
func planPointer(urlText, sumText string) (imagePlan, error) {
	diskURL, sum, err := image.ParsePointer([]byte(urlText), []byte(sumText))
	if err != nil {
		return imagePlan{}, fmt.Errorf("--url, --sha256: %w", err)
	}
	urlDst := strings.TrimPrefix(image.PointerURLFile, "/")
	sumDst := strings.TrimPrefix(image.PointerSHA256File, "/")
	return imagePlan{
		files: []layerFile{
			{dst: urlDst, data: []byte(diskURL + "\n")},
			{dst: sumDst, data: []byte(sum + "\n")},
		},
		labels: map[string]string{
			labelKind:       "pointer",
			labelDiskURL:    diskURL,
			labelDiskSHA256: sum,
		},
		cmd:  []string{image.PointerURLFile},
		name: filepath.Base(urlDst),
	}, nil
}

// imageBlobs builds the image config and the manifest for one layer.
// The config's Cmd names the boot file: the shim ignores it, but CRI
// refuses to create a container from an image without a command.
func imageBlobs(plan imagePlan, layer layerResult, created time.Time) (config, manifest jsonBlob, err error) {
	img := ocispec.Image{
		Created:  &created,
		Platform: imagePlatform(),
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
			MediaType: layer.mediaType,
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
