package image

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// overlayOptions are the qcow2 creation options of an overlay: subcluster
// allocation (extended L2 entries with 128 KiB clusters) makes the first
// write to a cluster of the base copy 4 KiB instead of a whole cluster.
const overlayOptions = "extended_l2=on,cluster_size=128k"

// overlayBacking is the backing file name written into an overlay's
// header. It is never opened: QEMU is always given the backing node
// explicitly (an fd of the image's disk), and qemu-img create runs with -u.
const overlayBacking = "image"

// CreateOverlay writes a qcow2 overlay into overlay, an empty file open
// read-write, whose backing is a baseFormat image of baseSize bytes, grown
// to size bytes (0 = baseSize; a size below it is refused). qemu-img runs
// with -u and an explicit size, so it never opens, probes or writes the
// base; it writes only through the given file.
func CreateOverlay(ctx context.Context, q QEMUImg, overlay *os.File, baseFormat string, baseSize int64, size int64) error {
	name := overlay.Name()
	switch {
	case baseFormat != FormatQCOW2 && baseFormat != FormatRaw:
		return invalidf("overlay %s: base format %q is not qcow2 or raw", name, baseFormat)
	case baseSize <= 0:
		return invalidf("overlay %s: base virtual size %d is not positive", name, baseSize)
	case size < 0:
		return invalidf("overlay %s: size %d is negative", name, size)
	case size == 0:
		size = baseSize
	case size < baseSize:
		return invalidf("overlay %s: size %s (%d bytes) is smaller than the image's virtual size %s (%d bytes); disks can only grow",
			name, formatSize(size), size, formatSize(baseSize), baseSize)
	}
	if q.Jail != nil {
		// The jailed qemu-img writes it as the VM's user.
		if err := overlay.Chown(int(q.Jail.UID), int(q.Jail.GID)); err != nil {
			return fmt.Errorf("overlay %s: %w", name, err)
		}
	}
	res, err := q.run(ctx, []imgFile{{name: "overlay", label: name, f: overlay, rw: true}}, nil,
		"create", "-q", "-f", FormatQCOW2, "-u", "-F", baseFormat, "-b", overlayBacking, "-o", overlayOptions, "@overlay", strconv.FormatInt(size, 10))
	if err != nil {
		return fmt.Errorf("overlay %s: %w", name, err)
	}
	if res.code != 0 {
		// qemu-img names the overlay again; say it once.
		return preconditionf("overlay %s: qemu-img create: %s", name, message(dropDeleteErrors(strings.ReplaceAll(res.stderr, name+": ", "")), ""))
	}
	if fi, err := overlay.Stat(); err != nil || fi.Size() == 0 {
		return preconditionf("overlay %s: qemu-img create reported success but wrote nothing", name)
	}
	return nil
}

// dropDeleteErrors drops the lines in which qemu-img says it could not
// remove the file it failed to create: the overlay is the shim's, removed
// with the VM's files directory, and in the jail it is a mount point that
// qemu-img cannot remove. Left in, that line would hide the cause.
func dropDeleteErrors(stderr string) string {
	var keep []string
	for _, l := range strings.Split(stderr, "\n") {
		if !strings.Contains(l, "Error when deleting file") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}
