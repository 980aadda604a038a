package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/distribution/reference"
	"github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/vmshim/vmshim/config"
	"github.com/vmshim/vmshim/image"
)

// annotationImgRef is the full image name on the index's manifest, read by
// ctr, nerdctl and the containerd client on import.
const annotationImgRef = "io.containerd.image.name"

// packOptions says what to pack and where.
type packOptions struct {
	Disk        string            // qcow2 or raw disk; excludes Kernel and URL
	Kernel      string            // bzImage or ELF kernel; excludes Disk and URL
	URL         string            // http(s) URL of the disk of a pointer image; excludes Disk and Kernel
	SHA256      string            // sha256 of the disk at URL, with URL
	Initrd      string            // optional initrd, only with Kernel
	Ref         string            // image reference, e.g. localhost/vm/debian:12
	Output      string            // path of the OCI archive to write; may be empty with Import
	Created     time.Time         // image creation time, also used as file mtime
	Compression string            // compressionGzip (also when empty) or compressionZstd
	GzipLevel   int               // 1 (fastest) to 9 (smallest), with gzip
	ZstdLevel   int               // 1 (fastest) to 22 (smallest), with zstd
	Qcow2       bool              // convert a raw Disk to qcow2 before packing
	QemuImg     string            // qemu-img binary for Qcow2; "qemu-img" when empty
	Labels      map[string]string // extra image config labels, none under io.vmshim.
	Description string            // org.opencontainers.image.description, when set
	Firmware    string            // io.vmshim.firmware (config.LabelFirmware), when set
	Import      *importOptions    // also import into containerd, when set
	Progress    progressOptions   // how to report the input bytes read
}

// pack writes an OCI image layout archive holding the disk, or the kernel
// and initrd, or the pointer files (the disk's URL and sha256) of opts,
// named opts.Ref, and imports it into containerd when
// opts.Import is set. The archive appears at opts.Output only when
// complete; without opts.Output it is streamed to containerd and never
// stored.
func pack(ctx context.Context, opts packOptions) (retErr error) {
	name, tag, err := checkOptions(opts)
	if err != nil {
		return err
	}
	var imp *importer
	if opts.Import != nil {
		// Before the packing, which can take minutes, so that a wrong
		// socket fails at once.
		if imp, err = dialContainerd(ctx, *opts.Import); err != nil {
			return err
		}
		defer imp.close()
	}
	dir := os.TempDir()
	if opts.Output != "" {
		dir = filepath.Dir(opts.Output)
	}
	plan, err := makePlan(ctx, opts, dir)
	defer plan.removeTemp()
	if err != nil {
		return err
	}

	layerTmp, err := os.CreateTemp(dir, ".vmshim-pack-layer-*")
	if err != nil {
		return fmt.Errorf("create temporary layer in %s: %w", dir, err)
	}
	defer func() {
		layerTmp.Close()
		os.Remove(layerTmp.Name())
	}()
	mtime := opts.Created.UTC().Truncate(time.Second)
	prog := newProgress(opts.Progress, plan.name, plan.size)
	lopts := layerOptions{mtime: mtime, compression: compressionGzip, level: opts.GzipLevel, progress: prog}
	if opts.Compression == compressionZstd {
		lopts.compression, lopts.level = compressionZstd, opts.ZstdLevel
	}
	layer, err := writeLayer(ctx, layerTmp, plan.files, lopts)
	if err != nil {
		return fmt.Errorf("write layer for %s: %w", opts.Ref, err)
	}
	prog.finish()

	config, manifest, err := imageBlobs(plan, layer, mtime)
	if err != nil {
		return err
	}
	a := archive{
		layer:     ocispec.Descriptor{MediaType: layer.mediaType, Digest: layer.digest, Size: layer.size},
		layerFile: layerTmp,
		blobs:     []jsonBlob{config, manifest},
		index:     imageIndex(manifest.desc, name, tag),
		mtime:     mtime,
	}
	if opts.Output != "" {
		if err := writeOutput(ctx, opts.Output, a); err != nil {
			return err
		}
		log.G(ctx).WithField("ref", name).WithField("manifest", manifest.desc.Digest.String()).
			Debugf("packed %s", opts.Output)
	}
	if imp == nil {
		return nil
	}
	prog.note("importing %s into containerd namespace %s", name, opts.Import.Namespace)
	if opts.Output != "" {
		f, err := os.Open(opts.Output)
		if err != nil {
			return fmt.Errorf("open archive %s for import: %w", opts.Output, err)
		}
		defer f.Close()
		return imp.importArchive(ctx, f, name)
	}
	return importStream(ctx, imp, a, name)
}

// importStream writes the archive a straight into containerd's import,
// through a pipe.
func importStream(ctx context.Context, imp *importer, a archive, name string) error {
	pr, pw := io.Pipe()
	written := make(chan struct{})
	go func() {
		defer close(written)
		pw.CloseWithError(writeArchive(ctx, pw, a))
	}()
	err := imp.importArchive(ctx, pr, name)
	// Unblocks the writer when the import stopped reading early.
	pr.CloseWithError(io.ErrClosedPipe)
	<-written
	return err
}

// imageIndex is the index.json naming manifest name (for containerd and
// nerdctl) and tag (for OCI tools).
func imageIndex(manifest ocispec.Descriptor, name, tag string) ocispec.Index {
	platform := imagePlatform()
	return ocispec.Index{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageIndex,
		Manifests: []ocispec.Descriptor{{
			MediaType: manifest.MediaType,
			Digest:    manifest.Digest,
			Size:      manifest.Size,
			Platform:  &platform,
			Annotations: map[string]string{
				annotationImgRef:          name,
				ocispec.AnnotationRefName: tag,
			},
		}},
	}
}

// writeOutput writes the archive a to a temporary file next to path and
// renames it to path once complete.
func writeOutput(ctx context.Context, path string, a archive) (retErr error) {
	out, err := os.CreateTemp(filepath.Dir(path), ".vmshim-pack-out-*")
	if err != nil {
		return fmt.Errorf("create temporary archive next to %s: %w", path, err)
	}
	defer func() {
		if retErr != nil {
			out.Close()
			os.Remove(out.Name())
		}
	}()
	if err := writeArchive(ctx, out, a); err != nil {
		return fmt.Errorf("write archive %s: %w", path, err)
	}
	if err := out.Chmod(0o644); err != nil {
		return fmt.Errorf("chmod archive %s: %w", path, err)
	}
	if err := out.Close(); err != nil {
		return fmt.Errorf("close archive %s: %w", path, err)
	}
	if err := os.Rename(out.Name(), path); err != nil {
		return fmt.Errorf("rename archive to %s: %w", path, err)
	}
	return nil
}

// checkOptions validates opts and returns the normalized image name and its
// tag.
func checkOptions(opts packOptions) (name, tag string, err error) {
	pointer := opts.URL != "" || opts.SHA256 != ""
	switch {
	case opts.SHA256 != "" && opts.URL == "":
		return "", "", fmt.Errorf("--sha256 needs --url: %w", errdefs.ErrInvalidArgument)
	case pointer && opts.Disk != "":
		return "", "", fmt.Errorf("--url and --disk are exclusive: a pointer image (--url) holds no disk, the shim downloads it: %w", errdefs.ErrInvalidArgument)
	case pointer && (opts.Kernel != "" || opts.Initrd != ""):
		return "", "", fmt.Errorf("--url and --kernel are exclusive: a pointer image (--url) holds no kernel or initrd: %w", errdefs.ErrInvalidArgument)
	case pointer && opts.Qcow2:
		return "", "", fmt.Errorf("--qcow2 converts a disk, and a pointer image (--url) holds none: %w", errdefs.ErrInvalidArgument)
	case opts.URL != "" && opts.SHA256 == "":
		return "", "", fmt.Errorf("--url needs --sha256, the digest the downloaded disk must have: %w", errdefs.ErrInvalidArgument)
	case opts.Disk == "" && opts.Kernel == "" && !pointer:
		return "", "", fmt.Errorf("one of --disk, --kernel or --url is required: %w", errdefs.ErrInvalidArgument)
	case opts.Disk != "" && opts.Kernel != "":
		return "", "", fmt.Errorf("--disk and --kernel are exclusive: %w", errdefs.ErrInvalidArgument)
	case opts.Initrd != "" && opts.Kernel == "":
		return "", "", fmt.Errorf("--initrd needs --kernel: %w", errdefs.ErrInvalidArgument)
	case opts.Qcow2 && opts.Disk == "":
		return "", "", fmt.Errorf("--qcow2 needs --disk: %w", errdefs.ErrInvalidArgument)
	case opts.Output == "" && opts.Import == nil:
		return "", "", fmt.Errorf("an output archive (-o) or --import is required: %w", errdefs.ErrInvalidArgument)
	}
	switch opts.Compression {
	case compressionGzip, "":
		if opts.GzipLevel < 1 || opts.GzipLevel > 9 {
			return "", "", fmt.Errorf("gzip level %d is not between 1 and 9: %w", opts.GzipLevel, errdefs.ErrInvalidArgument)
		}
	case compressionZstd:
		if opts.ZstdLevel < 1 || opts.ZstdLevel > 22 {
			return "", "", fmt.Errorf("zstd level %d is not between 1 and 22: %w", opts.ZstdLevel, errdefs.ErrInvalidArgument)
		}
	default:
		return "", "", fmt.Errorf("compression %q is not gzip or zstd: %w", opts.Compression, errdefs.ErrInvalidArgument)
	}
	if pointer {
		if _, _, err := image.ParsePointer([]byte(opts.URL), []byte(opts.SHA256)); err != nil {
			return "", "", fmt.Errorf("--url, --sha256: %w", err)
		}
	}
	if opts.Firmware != "" {
		if opts.Kernel != "" {
			return "", "", fmt.Errorf("--firmware is for disk images, and a kernel image (--kernel) boots without one: %w", errdefs.ErrInvalidArgument)
		}
		if err := config.CheckFirmware("--firmware", opts.Firmware); err != nil {
			return "", "", err
		}
	}
	for k := range opts.Labels {
		if k == "" {
			return "", "", fmt.Errorf("a label has an empty key: %w", errdefs.ErrInvalidArgument)
		}
		if strings.HasPrefix(k, labelPrefix) {
			return "", "", fmt.Errorf("label %s: keys starting with %s are set by vmshim-pack: %w", k, labelPrefix, errdefs.ErrInvalidArgument)
		}
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
