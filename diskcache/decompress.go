package diskcache

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"math"

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

// unpackLimit returns the most bytes a download of compressed bytes may
// decompress to, and the error for more: the smaller of MaxDisk and
// MaxRatio times compressed (when either is set).
func (c *Cache) unpackLimit(name string, compressed int64) (int64, error) {
	limit, over := int64(math.MaxInt64-1), error(nil)
	if c.MaxDisk > 0 {
		limit, over = c.MaxDisk, tooLarge(name, "decompressed disk", c.MaxDisk, "max_disk_size")
	}
	if c.MaxRatio > 0 && compressed <= (math.MaxInt64-1)/c.MaxRatio {
		if r := c.MaxRatio * max(compressed, 1); r < limit {
			limit = r
			over = errorf(errdefs.ErrFailedPrecondition, nil,
				"disk-url %s: decompressed disk is larger than %d bytes, %d times the %d-byte download (config max_decompression_ratio)",
				name, r, c.MaxRatio, compressed)
		}
	}
	if over == nil {
		over = tooLarge(name, "decompressed disk", limit, "max_disk_size")
	}
	return limit, over
}

// checkXZ scans the xz file in r before it is decompressed: it must be well
// formed, with no dictionary over maxDecoderWindow and at most limit bytes
// once decompressed (else over). It returns the decompressed size.
func checkXZ(r io.Reader, name string, limit int64, over error) (int64, error) {
	size, err := scanXZ(bufio.NewReaderSize(r, 1<<16), maxDecoderWindow, limit)
	switch {
	case errors.Is(err, errXZDict):
		return 0, errorf(errdefs.ErrFailedPrecondition, err, "disk-url %s: xz dictionary over %s", name, humanBytes(maxDecoderWindow))
	case err != nil:
		return 0, errorf(errdefs.ErrFailedPrecondition, err, "disk-url %s: bad xz file", name)
	case size > limit:
		return 0, over
	}
	return size, nil
}
