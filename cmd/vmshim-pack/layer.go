package main

import (
	"archive/tar"
	"compress/gzip"
	"context"
	_ "crypto/sha256" // registers sha256 for go-digest
	"fmt"
	"io"
	"os"
	"path"
	"time"

	"github.com/opencontainers/go-digest"
)

// layerFile is one file of the image layer.
type layerFile struct {
	src string // path on the host
	dst string // path in the image, relative, e.g. "disk/disk.qcow2"
}

// layerResult describes a written layer blob.
type layerResult struct {
	digest digest.Digest // of the gzip blob
	size   int64         // of the gzip blob
	diffID digest.Digest // of the uncompressed tar
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

// writeLayer streams files into a gzip'd tar at out and returns its digests.
// Parent directories come first; directories are 0755 and files 0444, all
// owned by root, with modification time mtime. Neither the files nor the
// layer are ever held in memory: both digests are computed while writing.
func writeLayer(ctx context.Context, out io.Writer, files []layerFile, mtime time.Time, level int) (layerResult, error) {
	blobDigester := digest.Canonical.Digester()
	blob := &countingWriter{w: io.MultiWriter(out, blobDigester.Hash())}
	gz, err := gzip.NewWriterLevel(blob, level)
	if err != nil {
		return layerResult{}, fmt.Errorf("gzip level %d: %w", level, err)
	}
	diffDigester := digest.Canonical.Digester()
	tw := tar.NewWriter(io.MultiWriter(gz, diffDigester.Hash()))

	seen := map[string]bool{}
	buf := make([]byte, copyBufferSize)
	for _, f := range files {
		if err := writeParents(tw, f.dst, mtime, seen); err != nil {
			return layerResult{}, err
		}
		if err := writeFile(ctx, tw, f, mtime, buf); err != nil {
			return layerResult{}, err
		}
	}
	if err := tw.Close(); err != nil {
		return layerResult{}, fmt.Errorf("finish layer tar: %w", err)
	}
	if err := gz.Close(); err != nil {
		return layerResult{}, fmt.Errorf("finish layer gzip: %w", err)
	}
	return layerResult{
		digest: blobDigester.Digest(),
		size:   blob.n,
		diffID: diffDigester.Digest(),
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

// writeFile streams one host file into the tar as a read-only regular file.
func writeFile(ctx context.Context, tw *tar.Writer, f layerFile, mtime time.Time, buf []byte) error {
	src, err := os.Open(f.src)
	if err != nil {
		return fmt.Errorf("open %s: %w", f.src, err)
	}
	defer src.Close()
	st, err := src.Stat()
	if err != nil {
		return fmt.Errorf("stat %s: %w", f.src, err)
	}
	hdr := &tar.Header{
		Typeflag: tar.TypeReg,
		Name:     f.dst,
		Mode:     0o444,
		Size:     st.Size(),
		Uname:    "root",
		Gname:    "root",
		ModTime:  mtime,
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("write layer header %s: %w", f.dst, err)
	}
	n, err := io.CopyBuffer(tw, ctxReader{ctx: ctx, r: src}, buf)
	if err != nil {
		return fmt.Errorf("copy %s into layer: %w", f.src, err)
	}
	if n != st.Size() {
		return fmt.Errorf("copy %s into layer: file changed size while packing (%d of %d bytes)", f.src, n, st.Size())
	}
	return nil
}
