package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	_ "crypto/sha256" // registers sha256 for go-digest
	"fmt"
	"io"
	"os"
	"path"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// layerFile is one file of the image layer.
type layerFile struct {
	src  string // path on the host, or "" for data
	data []byte // the file's content, when src is ""
	dst  string // path in the image, relative, e.g. "disk/disk.qcow2"
}

// size is the file's size in bytes.
func (f layerFile) size() (int64, error) {
	if f.src == "" {
		return int64(len(f.data)), nil
	}
	st, err := os.Stat(f.src)
	if err != nil {
		return 0, fmt.Errorf("stat %s: %w", f.src, err)
	}
	return st.Size(), nil
}

// Layer compressions.
const (
	compressionGzip = "gzip"
	compressionZstd = "zstd"
)

// layerOptions say how the layer is written.
type layerOptions struct {
	mtime       time.Time // of every entry
	compression string    // compressionGzip or compressionZstd
	level       int       // gzip 1–9, or zstd 1–22
	progress    *progress // counts the input bytes read; may be nil
}

// layerResult describes a written layer blob.
type layerResult struct {
	mediaType string        // of the compressed blob
	digest    digest.Digest // of the compressed blob
	size      int64         // of the compressed blob
	diffID    digest.Digest // of the uncompressed tar
}

// newCompressor returns the compressing writer of opts over w and the
// layer's media type.
func newCompressor(w io.Writer, opts layerOptions) (io.WriteCloser, string, error) {
	switch opts.compression {
	case compressionGzip, "":
		gz, err := gzip.NewWriterLevel(w, opts.level)
		if err != nil {
			return nil, "", fmt.Errorf("gzip level %d: %w", opts.level, err)
		}
		return gz, ocispec.MediaTypeImageLayerGzip, nil
	case compressionZstd:
		zw, err := zstd.NewWriter(w, zstd.WithEncoderLevel(zstd.EncoderLevelFromZstd(opts.level)))
		if err != nil {
			return nil, "", fmt.Errorf("zstd level %d: %w", opts.level, err)
		}
		return zw, ocispec.MediaTypeImageLayerZstd, nil
	}
	return nil, "", fmt.Errorf("unknown layer compression %q", opts.compression)
}

// copyBufferSize is the chunk size used to stream files into the layer.
const copyBufferSize = 1 << 20

// ctxReader fails reads once its context is done, so a long copy can be
// cancelled between chunks.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// countingWriter counts the bytes written through it.
type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// writeLayer streams files into a compressed tar at out and returns its
// digests. Parent directories come first; directories are 0755 and files
// 0444, all owned by root, with modification time opts.mtime. Neither the
// files nor the layer are ever held in memory: both digests are computed
// while writing.
func writeLayer(ctx context.Context, out io.Writer, files []layerFile, opts layerOptions) (layerResult, error) {
	blobDigester := digest.Canonical.Digester()
	blob := &countingWriter{w: io.MultiWriter(out, blobDigester.Hash())}
	zw, mediaType, err := newCompressor(blob, opts)
	if err != nil {
		return layerResult{}, err
	}
	closed := false
	defer func() {
		if !closed {
			zw.Close() // ends the zstd encoder's goroutines after a failure
		}
	}()
	diffDigester := digest.Canonical.Digester()
	tw := tar.NewWriter(io.MultiWriter(zw, diffDigester.Hash()))
	mtime := opts.mtime

	seen := map[string]bool{}
	buf := make([]byte, copyBufferSize)
	for _, f := range files {
		if err := writeParents(tw, f.dst, mtime, seen); err != nil {
			return layerResult{}, err
		}
		if err := writeFile(ctx, tw, f, mtime, buf, opts.progress); err != nil {
			return layerResult{}, err
		}
	}
	if err := tw.Close(); err != nil {
		return layerResult{}, fmt.Errorf("finish layer tar: %w", err)
	}
	closed = true
	if err := zw.Close(); err != nil {
		return layerResult{}, fmt.Errorf("finish layer %s: %w", opts.compression, err)
	}
	return layerResult{
		mediaType: mediaType,
		digest:    blobDigester.Digest(),
		size:      blob.n,
		diffID:    diffDigester.Digest(),
	}, nil
}

// writeParents adds a directory entry for every parent of name not yet
// written, outermost first.
func writeParents(tw *tar.Writer, name string, mtime time.Time, seen map[string]bool) error {
	dir := path.Dir(name)
	if dir == "." || dir == "/" || seen[dir] {
		return nil
	}
	if err := writeParents(tw, dir, mtime, seen); err != nil {
		return err
	}
	seen[dir] = true
	hdr := &tar.Header{
		Typeflag: tar.TypeDir,
		Name:     dir + "/",
		Mode:     0o755,
		Uname:    "root",
		Gname:    "root",
		ModTime:  mtime,
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("write layer directory %s: %w", dir, err)
	}
	return nil
}

// writeFile streams one host file, or the data of f, into the tar as a
// read-only regular file, counting what it reads into prog.
func writeFile(ctx context.Context, tw *tar.Writer, f layerFile, mtime time.Time, buf []byte, prog *progress) error {
	name := f.src
	var r io.Reader = bytes.NewReader(f.data)
	size := int64(len(f.data))
	if f.src != "" {
		src, err := os.Open(f.src)
		if err != nil {
			return fmt.Errorf("open %s: %w", f.src, err)
		}
		defer src.Close()
		st, err := src.Stat()
		if err != nil {
			return fmt.Errorf("stat %s: %w", f.src, err)
		}
		r, size = src, st.Size()
	} else {
		name = "/" + f.dst
	}
	hdr := &tar.Header{
		Typeflag: tar.TypeReg,
		Name:     f.dst,
		Mode:     0o444,
		Size:     size,
		Uname:    "root",
		Gname:    "root",
		ModTime:  mtime,
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("write layer header %s: %w", f.dst, err)
	}
	n, err := io.CopyBuffer(tw, ctxReader{ctx: ctx, r: progressReader{r: r, p: prog}}, buf)
	if err != nil {
		return fmt.Errorf("copy %s into layer: %w", name, err)
	}
	if n != size {
		return fmt.Errorf("copy %s into layer: file changed size while packing (%d of %d bytes)", name, n, size)
	}
	return nil
}
