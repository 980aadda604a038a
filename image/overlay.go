package image

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
)

// overlayOptions are the qcow2 creation options of an overlay: subcluster
// allocation (extended L2 entries with 128 KiB clusters) makes the first
// write to a cluster of the base copy 4 KiB instead of a whole cluster.
const overlayOptions = "extended_l2=on,cluster_size=128k"

// CreateOverlay makes a qcow2 overlay at overlayPath whose backing is base
// (format pinned with -F), grown to size bytes (0 = baseSize, the base's
// virtual size; a size below it is refused). qemu-img runs with -u and an
// explicit size, so it never opens, probes or writes the base. overlayPath
// must not exist; on failure nothing is left behind.
func CreateOverlay(ctx context.Context, qemuImg string, base string, baseFormat string, baseSize int64, overlayPath string, size int64) (retErr error) {
	switch {
	case !filepath.IsAbs(base):
		return invalidf("overlay base %q: not an absolute path", base)
	case !filepath.IsAbs(overlayPath):
		return invalidf("overlay %q: not an absolute path", overlayPath)
	case baseFormat != FormatQCOW2 && baseFormat != FormatRaw:
		return invalidf("overlay base %s: format %q is not qcow2 or raw", base, baseFormat)
	case baseSize <= 0:
		return invalidf("overlay base %s: virtual size %d is not positive", base, baseSize)
	case size < 0:
		return invalidf("overlay %s: size %d is negative", overlayPath, size)
	case size == 0:
		size = baseSize
	case size < baseSize:
		return invalidf("overlay %s: size %s (%d bytes) is smaller than the image's virtual size %s (%d bytes); disks can only grow",
			overlayPath, formatSize(size), size, formatSize(baseSize), baseSize)
	}
	fi, err := os.Stat(base)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return notFoundf("overlay base %s: does not exist", base)
		}
		return fmt.Errorf("overlay base %s: %w", base, err)
	}
	if !fi.Mode().IsRegular() {
		return invalidf("overlay base %s: not a regular file (%s)", base, fileKind(fi.Mode()))
	}
	if _, err = os.Lstat(overlayPath); err == nil {
		return fmt.Errorf("overlay %s: %w", overlayPath, errdefs.ErrAlreadyExists)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("overlay %s: %w", overlayPath, err)
	}
	defer func() {
		if retErr == nil {
			return
		}
		if rmErr := os.Remove(overlayPath); rmErr != nil && !errors.Is(rmErr, fs.ErrNotExist) {
			log.G(ctx).WithError(rmErr).WithField("overlay", overlayPath).Warn("failed to remove partial overlay")
		}
	}()
	res, err := runQEMUImg(ctx, qemuImg, "create", "-q", "-f", FormatQCOW2, "-u",
		"-F", baseFormat, "-b", base, "-o", overlayOptions, overlayPath, strconv.FormatInt(size, 10))
	if err != nil {
		return fmt.Errorf("overlay %s: %w", overlayPath, err)
	}
	if res.code != 0 {
		// qemu-img names the overlay again; say it once.
		return preconditionf("overlay %s: qemu-img create: %s", overlayPath, message(strings.ReplaceAll(res.stderr, overlayPath+": ", ""), ""))
	}
	if _, err = os.Stat(overlayPath); err != nil {
		return preconditionf("overlay %s: qemu-img create reported success but left no file", overlayPath)
	}
	return nil
}
