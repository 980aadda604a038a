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
	if err := createQCOW2(ctx, q, dst, size); err != nil {
		return fmt.Errorf("copy %s to %s: %w", name, dst.Name(), err)
	}
	files := []imgFile{{name: "dst", label: dst.Name(), f: dst, rw: true}, {name: "src", label: name, f: src}}
	q.CPUTime = QEMUImgCopyCPUTime
	// -n: write into the image just made; -W: out of order, the faster way.
	res, err := q.run(ctx, files, groups, "convert", "-n", "-W", "-f", srcFormat, "-O", FormatQCOW2, "@src", "@dst")
	if err == nil && res.code != 0 {
		err = preconditionf("qemu-img convert: %s", message(res.stderr, ""))
	}
	if err != nil {
		return fmt.Errorf("copy %s to %s: %w", name, dst.Name(), err)
	}
	return dst.Sync()
}

// CreateEmpty writes an empty qcow2 image of size bytes into f, an empty
// file open read-write: the disk an installer installs onto.
func CreateEmpty(ctx context.Context, q QEMUImg, f *os.File, size int64) error {
	if size <= 0 {
		return invalidf("empty disk %s: size %d is not positive", f.Name(), size)
	}
	if q.Jail != nil {
		if err := f.Chown(int(q.Jail.UID), int(q.Jail.GID)); err != nil {
			return fmt.Errorf("empty disk %s: %w", f.Name(), err)
		}
	}
	if err := createQCOW2(ctx, q, f, size); err != nil {
		return fmt.Errorf("empty disk %s: %w", f.Name(), err)
	}
	return nil
}

// createQCOW2 runs qemu-img create for a standalone qcow2 image of size
// bytes in dst, which the jail's ids own when jailed.
func createQCOW2(ctx context.Context, q QEMUImg, dst *os.File, size int64) error {
	res, err := q.run(ctx, []imgFile{{name: "dst", label: dst.Name(), f: dst, rw: true}}, nil,
		"create", "-q", "-f", FormatQCOW2, "-o", overlayOptions, "@dst", strconv.FormatInt(size, 10))
	if err == nil && res.code != 0 {
		err = preconditionf("qemu-img create: %s", message(dropDeleteErrors(res.stderr), ""))
	}
	return err
}
