package image

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
)

// headerSize is how much of a disk file format detection reads.
const headerSize = 512

// magic is a signature at a fixed offset that identifies a disk format.
type magic struct {
	offset int
	sig    string
	format string
}

// knownMagics are the qcow2 signature and the container formats QEMU would
// accept but vmshim does not boot; everything else is raw.
func knownMagics() []magic {
	return []magic{
		{0, "QFI\xfb", FormatQCOW2},
		{0, "KDMV", "vmdk"},
		{0, "COWD", "vmdk"},
		{0, "# Disk DescriptorFile", "vmdk"},
		{0x40, "\x7f\x10\xda\xbe", "vdi"},
		{0, "vhdxfile", "vhdx"},
		{0, "conectix", "vpc"},
		{0, "QED\x00", "qed"},
		{0, "LUKS\xba\xbe", "luks"},
		{0, "WithoutFreeSpace", "parallels"},
		{0, "WithouFreSpacExt", "parallels"},
		{0, "Bochs Virtual HD Image", "bochs"},
		{0, "#!/bin/sh\n#V2.0 Format", "cloop"},
	}
}

// detectFormat names the format of a disk from its first bytes: qcow2 or raw,
// or an error for another image format.
func detectFormat(header []byte) (string, error) {
	if len(header) == 0 {
		return "", invalidf("empty file")
	}
	for _, m := range knownMagics() {
		end := m.offset + len(m.sig)
		if end > len(header) || !bytes.Equal(header[m.offset:end], []byte(m.sig)) {
			continue
		}
		if m.format == FormatQCOW2 {
			return FormatQCOW2, nil
		}
		return "", invalidf("unsupported disk format %s (convert it to qcow2 or raw)", m.format)
	}
	return FormatRaw, nil
}

// detectFile reads the header of f, a regular file, and detects its format.
func detectFile(f *os.File) (string, error) {
	header := make([]byte, headerSize)
	n, err := f.ReadAt(header, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return "", fmt.Errorf("read header: %w", err)
	}
	return detectFormat(header[:n])
}

// DiskBoot describes a VM disk that is not in the image (one fetched by
// URL): f, open read-only, named name in messages, its format read from
// its header like a disk in an image. An ISO 9660 image (an installer's,
// hybrid or not) is booted as an image's /disk/*.iso is: from a CD-ROM
// onto an empty root disk. The Boot owns f.
func DiskBoot(f *os.File, name string) (*Boot, error) {
	format, err := detectFile(f)
	if err != nil {
		return nil, invalidf("disk %s: %v", name, err)
	}
	if format == FormatRaw {
		iso, err := isISO9660(f)
		if err != nil {
			return nil, invalidf("disk %s: %v", name, err)
		}
		if iso {
			return &Boot{ISO: name, ISOFile: f}, nil
		}
	}
	return &Boot{Disk: name, Format: format, DiskFile: f}, nil
}

// iso9660Magic is the standard identifier of an ISO 9660 volume
// descriptor, after its type byte, in the first descriptor at 32 KiB.
const (
	iso9660Offset = 0x8001
	iso9660Magic  = "CD001"
)

// isISO9660 reports whether f holds an ISO 9660 file system.
func isISO9660(f *os.File) (bool, error) {
	sig := make([]byte, len(iso9660Magic))
	n, err := f.ReadAt(sig, iso9660Offset)
	if err != nil && !errors.Is(err, io.EOF) {
		return false, fmt.Errorf("read the ISO 9660 descriptor: %w", err)
	}
	return n == len(sig) && string(sig) == iso9660Magic, nil
}
