package rootdisk

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/vmshim/vmshim/image"
)

// HeaderSpace is the end of a block volume that the guest does not see:
// its first bytes are the header that records the image the disk was
// written from (headerMagic, then MetaName's JSON on one line).
const HeaderSpace = 1 << 20

// headerMagic starts the header of a block volume's root disk.
const headerMagic = "VMSHIM-ROOT-DISK v1\n"

// headerSize is how much of HeaderSpace the header may use.
const headerSize = 128 << 10

// Device is the root disk on a block volume.
type Device struct {
	Size int64 // bytes the guest sees: the device less HeaderSpace
	Made bool  // written (or written again) on this boot
}

// OnDevice keeps the root disk on dev, a block volume open read-write and
// exclusively (the claim: O_EXCL, which ends with the last copy of the
// file); name is the device's path in the container. On its first boot,
// or when the policy is to recreate it from a changed image, the image's
// disk is written onto it as raw, and the guest grows into the rest.
func OnDevice(ctx context.Context, dev *os.File, name string, img Image, o Options) (*Device, error) {
	size, err := dev.Seek(0, io.SeekEnd)
	if err != nil {
		return nil, fmt.Errorf("root disk volume %s: size: %w", name, err)
	}
	usable := (size - HeaderSpace) &^ 511
	if usable < img.VirtualSize || usable < o.Size {
		want := max(img.VirtualSize, o.Size)
		return nil, fmt.Errorf("root disk volume %s holds %s (%d bytes), %d of them for the disk, less than the root disk's %s (%d bytes): %w",
			name, sizeString(size), size, max(usable, 0), sizeString(want), want, errdefs.ErrFailedPrecondition)
	}
	fingerprint, err := Fingerprint(img.File, img.Format)
	if err != nil {
		return nil, fmt.Errorf("root disk volume %s: %w", name, err)
	}
	m := readHeader(dev, usable)
	switch {
	case m.Image == fingerprint:
		return &Device{Size: usable}, nil
	case m.Image != "" && !o.Recreate:
		o.log("vmshim: root disk on volume %s kept: it was written from %s, the image's disk is now another (root-disk-policy recreate starts again from it)", name, m.source())
		return &Device{Size: usable}, nil
	case m.Image != "":
		o.log("vmshim: root disk on volume %s written again: the image's disk %s is not the one it was written from (%s)", name, img.Name, m.source())
	}
	// Until the new header is written, the device holds no disk: a crash
	// before then writes it again.
	if err := writeHeader(dev, usable, nil); err != nil {
		return nil, fmt.Errorf("root disk volume %s: %w", name, err)
	}
	o.log("vmshim: writing the root disk onto volume %s from %s (%s)", name, img.Name, sizeString(img.VirtualSize))
	start := time.Now()
	progress := func(pct int) { o.log("vmshim: writing the root disk onto volume %s: %d%%", name, pct) }
	if err := image.WriteRaw(ctx, o.Img, img.File, img.Format, img.Name, img.VirtualSize, dev, progress); err != nil {
		return nil, fmt.Errorf("root disk volume %s: %w", name, err)
	}
	if err := writeHeader(dev, usable, &meta{Version: 1, Image: fingerprint, Source: img.Name, Made: time.Now().UTC()}); err != nil {
		return nil, fmt.Errorf("root disk volume %s: %w", name, err)
	}
	o.log("vmshim: root disk on volume %s written in %.1f s", name, time.Since(start).Seconds())
	return &Device{Size: usable, Made: true}, nil
}

// readHeader reads the header at off; a device without one (or with one
// it cannot read) holds no disk of the shim's, the zero meta.
func readHeader(dev *os.File, off int64) meta {
	buf := make([]byte, headerSize)
	n, err := dev.ReadAt(buf, off)
	if err != nil && n < len(headerMagic) {
		return meta{}
	}
	return parseHeader(buf[:n])
}

// parseHeader parses a block volume's header.
func parseHeader(b []byte) meta {
	rest, ok := bytes.CutPrefix(b, []byte(headerMagic))
	if !ok {
		return meta{}
	}
	line, _, ok := bytes.Cut(rest, []byte("\n"))
	if !ok {
		return meta{}
	}
	return parseMeta(line)
}

// writeHeader writes m as the header at off, or clears it (m nil), and
// flushes it to the device.
func writeHeader(dev *os.File, off int64, m *meta) error {
	buf := make([]byte, headerSize)
	if m != nil {
		b, err := marshalMeta(*m)
		if err != nil {
			return err
		}
		copy(buf, append(append([]byte(headerMagic), b...), '\n'))
	}
	if _, err := dev.WriteAt(buf, off); err != nil {
		return fmt.Errorf("write header: %w", err)
	}
	return unix.Fsync(int(dev.Fd()))
}
