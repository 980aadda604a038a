package image

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
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

// detectFile reads the header of the regular file at p without following a
// final symlink or blocking on a special file, and detects its format.
func detectFile(p string) (string, error) {
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", fmt.Errorf("open: %w", err)
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("stat: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return "", invalidf("not a regular file (%s)", fileKind(fi.Mode()))
	}
	header := make([]byte, headerSize)
	n, err := io.ReadFull(f, header)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return "", fmt.Errorf("read header: %w", err)
	}
	return detectFormat(header[:n])
}
