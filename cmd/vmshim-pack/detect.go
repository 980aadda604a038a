package main

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/containerd/errdefs"
)

// Disk formats an image can carry.
const (
	formatQcow2 = "qcow2"
	formatRaw   = "raw"
)

// headerSize is how much of a file the format checks look at: enough for
// every magic below, including the ustar magic at offset 257.
const headerSize = 4096

// diskInfo is what the header of a disk file tells about it.
type diskInfo struct {
	format      string // formatQcow2 or formatRaw
	virtualSize int64  // size of the disk as the guest sees it, in bytes
	fileSize    int64  // size of the file on the host, in bytes
}

// foreignMagic names a file format that is not a qcow2 or raw disk, found by
// the bytes at a fixed offset.
type foreignMagic struct {
	offset int
	magic  string
	name   string
}

// foreignMagics lists the formats a disk is most often confused with:
// other VM disk formats, and compressed or archived disks.
func foreignMagics() []foreignMagic {
	return []foreignMagic{
		{0, "KDMV", "vmdk"},
		{0, "# Disk DescriptorFile", "vmdk descriptor"},
		{0, "COWD", "vmdk (esx cow)"},
		{0, "vhdxfile", "vhdx"},
		{0, "conectix", "vhd (vpc)"},
		{0, "<<< ", "vdi"},
		{0, "QED\x00", "qed"},
		{0, "\x1f\x8b", "gzip-compressed"},
		{0, "\xfd7zXZ\x00", "xz-compressed"},
		{0, "\x28\xb5\x2f\xfd", "zstd-compressed"},
		{0, "BZh", "bzip2-compressed"},
		{0, "PK\x03\x04", "zip archive"},
		{257, "ustar", "tar archive"},
	}
}

// readHeader reads up to headerSize bytes from the start of f.
func readHeader(f *os.File) ([]byte, error) {
	buf := make([]byte, headerSize)
	n, err := io.ReadFull(f, buf)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return nil, err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	return buf[:n], nil
}

// inspectDisk tells a qcow2 disk from a raw one by its header and refuses
// anything that is neither (other disk formats, compressed files, qcow2
// images that cannot boot on their own).
func inspectDisk(path string, f *os.File) (diskInfo, error) {
	st, err := f.Stat()
	if err != nil {
		return diskInfo{}, fmt.Errorf("stat disk %s: %w", path, err)
	}
	if !st.Mode().IsRegular() {
		return diskInfo{}, fmt.Errorf("disk %s is not a regular file: %w", path, errdefs.ErrInvalidArgument)
	}
	hdr, err := readHeader(f)
	if err != nil {
		return diskInfo{}, fmt.Errorf("read disk header %s: %w", path, err)
	}
	info := diskInfo{fileSize: st.Size()}
	if bytes.HasPrefix(hdr, []byte("QFI\xfb")) {
		info.format = formatQcow2
		info.virtualSize, err = checkQcow2(path, hdr)
		return info, err
	}
	for _, m := range foreignMagics() {
		if len(hdr) >= m.offset+len(m.magic) && string(hdr[m.offset:m.offset+len(m.magic)]) == m.magic {
			return diskInfo{}, fmt.Errorf("disk %s is a %s file, not a qcow2 or raw disk image: %w",
				path, m.name, errdefs.ErrInvalidArgument)
		}
	}
	if st.Size() < 512 || st.Size()%512 != 0 {
		return diskInfo{}, fmt.Errorf("disk %s is not qcow2 and its size %d is not a positive multiple of 512 bytes, so it is not a raw disk image: %w",
			path, st.Size(), errdefs.ErrInvalidArgument)
	}
	info.format = formatRaw
	info.virtualSize = st.Size()
	return info, nil
}

// checkQcow2 validates a qcow2 header and returns the virtual disk size.
// Layout (big endian): magic, version u32 @4, backing_file_offset u64 @8,
// size u64 @24, crypt_method u32 @32.
func checkQcow2(path string, hdr []byte) (int64, error) {
	if len(hdr) < 72 {
		return 0, fmt.Errorf("disk %s has a truncated qcow2 header: %w", path, errdefs.ErrInvalidArgument)
	}
	version := binary.BigEndian.Uint32(hdr[4:8])
	if version != 2 && version != 3 {
		return 0, fmt.Errorf("disk %s is qcow2 version %d, want 2 or 3: %w", path, version, errdefs.ErrInvalidArgument)
	}
	if binary.BigEndian.Uint64(hdr[8:16]) != 0 {
		return 0, fmt.Errorf("disk %s is a qcow2 overlay with a backing file; flatten it with qemu-img convert: %w",
			path, errdefs.ErrInvalidArgument)
	}
	if binary.BigEndian.Uint32(hdr[32:36]) != 0 {
		return 0, fmt.Errorf("disk %s is an encrypted qcow2: %w", path, errdefs.ErrInvalidArgument)
	}
	size := binary.BigEndian.Uint64(hdr[24:32])
	if size == 0 || size > 1<<62 {
		return 0, fmt.Errorf("disk %s has a qcow2 virtual size of %d bytes: %w", path, size, errdefs.ErrInvalidArgument)
	}
	return int64(size), nil
}

// Kernel kinds, named as the file is named in /boot.
const (
	kernelBzImage = "vmlinuz" // compressed bzImage, bootable by any loader
	kernelELF     = "vmlinux" // uncompressed ELF, bootable by QEMU -kernel through PVH
)

// inspectKernel returns whether the kernel at path is a bzImage (vmlinuz)
// or an uncompressed x86-64 ELF (vmlinux), and refuses anything else.
func inspectKernel(path string, f *os.File) (string, error) {
	hdr, err := readHeader(f)
	if err != nil {
		return "", fmt.Errorf("read kernel header %s: %w", path, err)
	}
	switch {
	case bytes.HasPrefix(hdr, []byte("\x7fELF")):
		// e_ident[EI_CLASS] @4 is 2 for 64-bit, e_machine @18 (little
		// endian for x86) is 62 for x86-64.
		if len(hdr) < 20 || hdr[4] != 2 || hdr[5] != 1 || binary.LittleEndian.Uint16(hdr[18:20]) != 62 {
			return "", fmt.Errorf("kernel %s is an ELF file but not an x86-64 one: %w", path, errdefs.ErrInvalidArgument)
		}
		return kernelELF, nil
	case len(hdr) >= 0x206 && hdr[0x1fe] == 0x55 && hdr[0x1ff] == 0xaa && string(hdr[0x202:0x206]) == "HdrS":
		// The x86 boot protocol header: boot flag 0xAA55 at 0x1FE and
		// the "HdrS" signature at 0x202.
		return kernelBzImage, nil
	default:
		return "", fmt.Errorf("kernel %s is neither an x86 bzImage nor an x86-64 ELF vmlinux: %w", path, errdefs.ErrInvalidArgument)
	}
}

// inspectInitrd refuses an initrd that is not a regular, non-empty file.
// Its content (cpio, compressed with any method the kernel supports) is the
// kernel's business.
func inspectInitrd(path string, f *os.File) error {
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("stat initrd %s: %w", path, err)
	}
	if !st.Mode().IsRegular() || st.Size() == 0 {
		return fmt.Errorf("initrd %s is not a non-empty regular file: %w", path, errdefs.ErrInvalidArgument)
	}
	return nil
}
