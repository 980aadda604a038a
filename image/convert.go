package image

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"
)

// QEMUImgCopyCPUTime is the CPU time qemu-img may use to copy a whole
// disk that Inspect accepted: a copy takes time in proportion to the
// disk, which the limit on a run that only reads headers would cut short.
const QEMUImgCopyCPUTime = 30 * time.Minute

// CopyToQCOW2 copies src, a srcFormat disk that Inspect accepted (name
// says which, for messages), into dst, an empty file open read-write, as
// a standalone qcow2 image (no backing file) of size bytes, which must be
// at least the source's virtual size srcSize. Like CreateOverlay, qemu-img
// only works through the files given; it never opens a path of its own.
func CopyToQCOW2(ctx context.Context, q QEMUImg, src *os.File, srcFormat, name string, srcSize int64, dst *os.File, size int64) error {
	switch {
	case srcFormat != FormatQCOW2 && srcFormat != FormatRaw:
		return invalidf("copy %s: format %q is not qcow2 or raw", name, srcFormat)
	case size < srcSize:
		return invalidf("copy %s: size %s (%d bytes) is smaller than its virtual size %s (%d bytes); disks can only grow",
			name, formatSize(size), size, formatSize(srcSize), srcSize)
	}
	if q.Jail != nil {
		if err := dst.Chown(int(q.Jail.UID), int(q.Jail.GID)); err != nil {
			return fmt.Errorf("copy %s to %s: %w", name, dst.Name(), err)
		}
	}
	groups, err := readGroups(q, src, name)
	if err != nil {
		return err
	}
	files := []imgFile{{name: "dst", label: dst.Name(), f: dst, rw: true}, {name: "src", label: name, f: src}}
	res, err := q.run(ctx, files[:1], nil, "create", "-q", "-f", FormatQCOW2, "-o", overlayOptions, "@dst", strconv.FormatInt(size, 10))
	if err == nil && res.code != 0 {
		err = preconditionf("qemu-img create: %s", message(dropDeleteErrors(res.stderr), ""))
	}
	if err != nil {
		return fmt.Errorf("copy %s to %s: %w", name, dst.Name(), err)
	}
	q.CPUTime = QEMUImgCopyCPUTime
	// -n: write into the image just made; -W: out of order, the faster way.
	res, err = q.run(ctx, files, groups, "convert", "-n", "-W", "-f", srcFormat, "-O", FormatQCOW2, "@src", "@dst")
	if err == nil && res.code != 0 {
		err = preconditionf("qemu-img convert: %s", message(res.stderr, ""))
	}
	if err != nil {
		return fmt.Errorf("copy %s to %s: %w", name, dst.Name(), err)
	}
	return dst.Sync()
}
