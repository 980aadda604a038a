package integration

import (
	"archive/tar"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"testing"

	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// writeArchive writes an OCI image archive named ref whose single,
// uncompressed layer holds files (path → content). It makes images that
// vmshim-pack rightly refuses to make, for the bad-input tests.
func writeArchive(dst, ref string, files map[string][]byte) error {
	entries := make(map[string]layerEntry, len(files))
	for n, data := range files {
		entries[n] = layerFile(data)
	}
	return writeLinkArchive(dst, ref, entries)
}

// layerEntry is one file or symlink in the layer of a hand-made test image.
type layerEntry struct {
	data []byte // a regular file's content
	link string // a symlink's target; the entry is a symlink when set
	mode int64  // a regular file's mode; 0 is 0o444
}

// layerFile makes a regular file entry.
func layerFile(data []byte) layerEntry { return layerEntry{data: data} }

// layerProgram makes an executable file entry.
func layerProgram(data []byte) layerEntry { return layerEntry{data: data, mode: 0o755} }

// layerLink makes a symlink entry.
func layerLink(target string) layerEntry { return layerEntry{link: target} }

// writeLinkArchive writes an OCI image archive named ref whose single,
// uncompressed layer holds entries (path → file or symlink), with their
// parent directories.
func writeLinkArchive(dst, ref string, entries map[string]layerEntry) (retErr error) {
	// The archive/tar and JSON writers below only fail on I/O to memory;
	// collect the first error rather than checking each call.
	check := func(err error) {
		if err != nil && retErr == nil {
			retErr = err
		}
	}
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	names := make([]string, 0, len(entries))
	for n := range entries {
		names = append(names, n)
	}
	sort.Strings(names)
	dirs := map[string]bool{}
	for _, n := range names {
		var parents []string
		for d := path.Dir(n); d != "." && !dirs[d]; d = path.Dir(d) {
			dirs[d] = true
			parents = append(parents, d)
		}
		for i := len(parents) - 1; i >= 0; i-- {
			check(tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: parents[i] + "/", Mode: 0o755}))
		}
		e := entries[n]
		if e.link != "" {
			check(tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: n, Linkname: e.link, Mode: 0o777}))
			continue
		}
		check(tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: n, Mode: cmp.Or(e.mode, 0o444), Size: int64(len(e.data))}))
		_, err := tw.Write(e.data)
		check(err)
	}
	check(tw.Close())
	if retErr != nil {
		return retErr
	}
	return writeLayerArchive(dst, ref, layer.Bytes())
}

// writeLayerArchive writes an OCI image archive named ref with one
// uncompressed layer.
func writeLayerArchive(dst, ref string, layer []byte) (retErr error) {
	check := func(err error) {
		if err != nil && retErr == nil {
			retErr = err
		}
	}
	blobs := map[digest.Digest][]byte{}
	add := func(mediaType string, data []byte) ocispec.Descriptor {
		d := digest.FromBytes(data)
		blobs[d] = data
		return ocispec.Descriptor{MediaType: mediaType, Digest: d, Size: int64(len(data))}
	}
	layerDesc := add(ocispec.MediaTypeImageLayer, layer)
	cfg, err := json.Marshal(ocispec.Image{
		Platform: ocispec.Platform{Architecture: "amd64", OS: "linux"},
		Config:   ocispec.ImageConfig{Cmd: []string{"/vm"}},
		RootFS:   ocispec.RootFS{Type: "layers", DiffIDs: []digest.Digest{layerDesc.Digest}},
	})
	check(err)
	manifest, err := json.Marshal(ocispec.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageManifest,
		Config:    add(ocispec.MediaTypeImageConfig, cfg),
		Layers:    []ocispec.Descriptor{layerDesc},
	})
	check(err)
	mdesc := add(ocispec.MediaTypeImageManifest, manifest)
	mdesc.Annotations = map[string]string{"io.containerd.image.name": ref, ocispec.AnnotationRefName: "latest"}
	index, err := json.Marshal(ocispec.Index{
		Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageIndex,
		Manifests: []ocispec.Descriptor{mdesc},
	})
	check(err)

	var out bytes.Buffer
	aw := tar.NewWriter(&out)
	put := func(name string, data []byte) {
		check(aw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o444, Size: int64(len(data))}))
		_, err := aw.Write(data)
		check(err)
	}
	put(ocispec.ImageLayoutFile, []byte(`{"imageLayoutVersion":"1.0.0"}`))
	put("index.json", index)
	for d, data := range blobs {
		put("blobs/sha256/"+d.Encoded(), data)
	}
	check(aw.Close())
	if retErr != nil {
		return retErr
	}
	return os.WriteFile(dst, out.Bytes(), 0o644)
}

// packImage packs an image named ref with vmshim-pack and args, and
// imports it into the CRI's namespace.
func packImage(ctx context.Context, t *testing.T, ref string, args ...string) {
	t.Helper()
	archive := filepath.Join(t.TempDir(), "image.tar")
	pack := exec.CommandContext(ctx, filepath.Join(env.binDir, "vmshim-pack"), append(args, "--ref", ref, "-o", archive)...)
	if out, err := pack.CombinedOutput(); err != nil {
		t.Fatalf("vmshim-pack: %v: %s", err, out)
	}
	if out, err := env.daemon.ctrIn(ctx, criNamespace, "images", "import", archive); err != nil {
		t.Fatalf("import %s: %v: %s", ref, err, out)
	}
}
