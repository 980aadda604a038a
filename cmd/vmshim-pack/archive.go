package main

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// blobsDir is where an OCI image layout keeps its content-addressed blobs.
const blobsDir = "blobs/" + string(digest.Canonical)

// jsonBlob is a small blob built in memory (config, manifest).
type jsonBlob struct {
	desc ocispec.Descriptor
	data []byte
}

// newJSONBlob marshals v and describes it with mediaType.
func newJSONBlob(mediaType string, v any) (jsonBlob, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return jsonBlob{}, fmt.Errorf("marshal %s: %w", mediaType, err)
	}
	return jsonBlob{
		desc: ocispec.Descriptor{MediaType: mediaType, Digest: digest.Canonical.FromBytes(data), Size: int64(len(data))},
		data: data,
	}, nil
}

// blobPath is the archive path of the blob with digest d.
func blobPath(d digest.Digest) string {
	return path.Join("blobs", d.Algorithm().String(), d.Encoded())
}

// archiveWriter writes an OCI image layout as a tar stream.
type archiveWriter struct {
	tw    *tar.Writer
	mtime time.Time
}

// dir adds a directory entry.
func (a archiveWriter) dir(name string) error {
	return a.tw.WriteHeader(&tar.Header{
		Typeflag: tar.TypeDir,
		Name:     name + "/",
		Mode:     0o755,
		ModTime:  a.mtime,
	})
}

// file adds a regular file of size bytes read from r.
func (a archiveWriter) file(ctx context.Context, name string, size int64, r io.Reader) error {
	if err := a.tw.WriteHeader(&tar.Header{
		Typeflag: tar.TypeReg,
		Name:     name,
		Mode:     0o444,
		Size:     size,
		ModTime:  a.mtime,
	}); err != nil {
		return fmt.Errorf("write archive header %s: %w", name, err)
	}
	n, err := io.CopyBuffer(a.tw, ctxReader{ctx: ctx, r: r}, make([]byte, copyBufferSize))
	if err != nil {
		return fmt.Errorf("write archive entry %s: %w", name, err)
	}
	if n != size {
		return fmt.Errorf("write archive entry %s: %d of %d bytes", name, n, size)
	}
	return nil
}

// jsonFile adds a small in-memory file.
func (a archiveWriter) jsonFile(ctx context.Context, name string, data []byte) error {
	return a.file(ctx, name, int64(len(data)), bytes.NewReader(data))
}

// archive is what an OCI image layout archive holds.
type archive struct {
	layer     ocispec.Descriptor // of the layer blob
	layerFile *os.File           // the layer blob
	blobs     []jsonBlob         // config and manifest
	index     ocispec.Index
	mtime     time.Time // of every entry
}

// writeArchive writes the OCI image layout of ar to out: oci-layout, the
// blobs (the layer first, copied from its file), then index.json.
func writeArchive(ctx context.Context, out io.Writer, ar archive) error {
	layer, layerFile, blobs, index, mtime := ar.layer, ar.layerFile, ar.blobs, ar.index, ar.mtime
	layout, err := json.Marshal(ocispec.ImageLayout{Version: ocispec.ImageLayoutVersion})
	if err != nil {
		return fmt.Errorf("marshal oci-layout: %w", err)
	}
	indexData, err := json.Marshal(index)
	if err != nil {
		return fmt.Errorf("marshal index: %w", err)
	}
	if _, err := layerFile.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("rewind layer: %w", err)
	}

	a := archiveWriter{tw: tar.NewWriter(out), mtime: mtime}
	if err := a.jsonFile(ctx, ocispec.ImageLayoutFile, layout); err != nil {
		return err
	}
	for _, d := range []string{"blobs", blobsDir} {
		if err := a.dir(d); err != nil {
			return fmt.Errorf("write archive directory %s: %w", d, err)
		}
	}
	if err := a.file(ctx, blobPath(layer.Digest), layer.Size, layerFile); err != nil {
		return err
	}
	for _, b := range blobs {
		if err := a.jsonFile(ctx, blobPath(b.desc.Digest), b.data); err != nil {
			return err
		}
	}
	if err := a.jsonFile(ctx, ocispec.ImageIndexFile, indexData); err != nil {
		return err
	}
	if err := a.tw.Close(); err != nil {
		return fmt.Errorf("finish archive: %w", err)
	}
	return nil
}
