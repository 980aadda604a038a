package diskcache

import (
	"bufio"
	"bytes"
	"errors"
	"io"

	"github.com/containerd/errdefs"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"github.com/ulikunitz/xz"
)

// Compressed formats, by magic bytes.
const (
	formatGzip = "gzip"
	formatXZ   = "xz"
	formatZstd = "zstd"
)

// maxDecoderWindow bounds the memory of a decoder: the largest xz
// dictionary and zstd window accepted (xz -9 uses 64 MiB, zstd --long 128).
const maxDecoderWindow = 128 << 20

// magics maps the first bytes of a file to its compressed format.
var magics = []struct {
	magic  []byte
	format string
}{
	{[]byte{0x1f, 0x8b}, formatGzip},
	{[]byte{0xfd, '7', 'z', 'X', 'Z', 0x00}, formatXZ},
	{[]byte{0x28, 0xb5, 0x2f, 0xfd}, formatZstd},
}

// sniff returns the compressed format f starts with, or "" for any other
// (or a short) file.
func sniff(f io.ReaderAt) (string, error) {
	var head [6]byte
	n, err := f.ReadAt(head[:], 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return "", err
	}
	for _, m := range magics {
		if bytes.HasPrefix(head[:n], m.magic) {
			return m.format, nil
		}
	}
	return "", nil
}

// newDecoder returns a decoder of format reading r, its memory bounded by
// maxDecoderWindow (xz: after checkXZ).
func newDecoder(format string, r io.Reader) (io.ReadCloser, error) {
	switch format {
	case formatGzip:
		return gzip.NewReader(r)
	case formatXZ:
		dec, err := xz.NewReader(r)
		if err != nil {
			return nil, err
		}
		return io.NopCloser(dec), nil
	case formatZstd:
		dec, err := zstd.NewReader(r,
			zstd.WithDecoderConcurrency(1),
			zstd.WithDecoderLowmem(true),
			zstd.WithDecoderMaxWindow(maxDecoderWindow),
			zstd.WithDecoderMaxMemory(maxDecoderWindow))
		if err != nil {
			return nil, err
		}
		return dec.IOReadCloser(), nil
	}
	return nil, errors.New("unknown format " + format)
}

// checkXZ scans the xz file in r before it is decompressed: it must be well
// formed, with no dictionary over maxDecoderWindow and (when limit > 0) at
// most limit bytes once decompressed. It returns the decompressed size.
func checkXZ(r io.Reader, name string, limit int64) (int64, error) {
	size, err := scanXZ(bufio.NewReaderSize(r, 1<<16), maxDecoderWindow, limit)
	switch {
	case errors.Is(err, errXZDict):
		return 0, errorf(errdefs.ErrFailedPrecondition, err, "disk-url %s: xz dictionary over %s", name, humanBytes(maxDecoderWindow))
	case err != nil:
		return 0, errorf(errdefs.ErrFailedPrecondition, err, "disk-url %s: bad xz file", name)
	case limit > 0 && size > limit:
		return 0, tooLarge(name, "decompressed disk", limit)
	}
	return size, nil
}
