package cloudinit

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"sort"
	"strings"

	"github.com/diskfs/go-diskfs/backend/file"
	"github.com/diskfs/go-diskfs/filesystem/iso9660"
)

// SeedLabel is the volume label cloud-init's NoCloud datasource looks for.
const SeedLabel = "cidata"

// isoBlockSize is the ISO9660 logical block size.
const isoBlockSize = 2048

// minSeedSize is the smallest seed WriteSeed writes. busybox's volume_id
// (findfs, blkid, mount LABEL=), which CirrOS- and Alpine-style guests use
// to find the seed, reads a device's first 0x11000 bytes (68 KiB) at once
// and takes a shorter device for an empty one; a seed of a few small
// documents is about 60 KiB.
const minSeedSize = 128 << 10

// seedPreparer is the seed's data preparer identifier (a-characters).
const seedPreparer = "VMSHIM"

// The volume descriptor set (ECMA-119) starts at sector 16, one
// descriptor a block, each known by its type byte and "CD001". The seed's
// set is its primary descriptor, then the terminator.
const (
	vdPrimarySector    = 16
	vdTerminatorSector = 17
	vdPrimary          = 1
	vdTerminator       = 255
	vdStandardID       = "CD001"
)

// Offsets of the fields of the primary volume descriptor (ECMA-119 8.4)
// that WriteSeed reads or rewrites.
const (
	vdTypeOff          = 0   // volume descriptor type, 1 byte
	vdStandardIDOff    = 1   // "CD001", 5 bytes
	vdSystemIDOff      = 8   // system identifier, 32 bytes
	vdVolumeIDOff      = 40  // volume identifier, 32 bytes
	vdSpaceSizeOff     = 80  // volume space size in blocks, 4 bytes LE then 4 BE
	vdVolumeSetIDOff   = 190 // volume set identifier, 128 bytes
	vdPublisherIDOff   = 318 // publisher identifier, 128 bytes
	vdPreparerIDOff    = 446 // data preparer identifier, 128 bytes
	vdApplicationIDOff = 574 // application identifier, 128 bytes
	vdCopyrightFileOff = 702 // copyright file identifier, 37 bytes
	vdAbstractFileOff  = 739 // abstract file identifier, 37 bytes
	vdBibliographicOff = 776 // bibliographic file identifier, 37 bytes
	vdExpirationOff    = 847 // volume expiration date and time, 17 bytes
)

// vdDateUnstated is a descriptor date that is not specified (ECMA-119
// 8.4.26.1): sixteen digits zero and a zero offset.
const vdDateUnstated = "0000000000000000\x00"

// vdText is a text field of the primary volume descriptor and what the
// seed holds in it.
type vdText struct {
	off, size int
	value     string
}

// seedText lists the text fields of the seed's primary volume descriptor
// with their values. The label is lower case, not d-characters:
// cloud-init, CirrOS and busybox's findfs look for "cidata" as genisoimage
// and xorriso write it.
func seedText() []vdText {
	return []vdText{
		{vdSystemIDOff, 32, ""},
		{vdVolumeIDOff, 32, SeedLabel},
		{vdVolumeSetIDOff, 128, ""},
		{vdPublisherIDOff, 128, ""},
		{vdPreparerIDOff, 128, seedPreparer},
		{vdApplicationIDOff, 128, ""},
		{vdCopyrightFileOff, 37, ""},
		{vdAbstractFileOff, 37, ""},
		{vdBibliographicOff, 37, ""},
	}
}

// WriteSeed writes files into f, an empty file open read-write, as an
// ISO9660 image labelled cidata, with Rock Ridge so the guest sees the
// names as given, its descriptor space-padded as the standard has it and
// its size minSeedSize at least, so that busybox finds it by its label as
// util-linux does. The image's scratch files live in a temporary directory
// of the shim's own.
//
// f is not synced: QEMU reads the seed through the page cache, and every
// create writes it anew, so no crash can leave a VM with a torn one, and
// an fsync on a busy node's disk can hold a create up for long.
//
// The image has no Joliet tree: Linux reads the names from Rock Ridge,
// and go-diskfs zeroes the Joliet root directory when the last file's size
// is a multiple of the block size (an empty file included).
func WriteSeed(f *os.File, files map[string][]byte) error {
	name := f.Name()
	names := make([]string, 0, len(files))
	for n := range files {
		if n == "" || strings.ContainsAny(n, "/\x00") || n == "." || n == ".." {
			return invalidf("seed %s: %q is not a file name", name, n)
		}
		names = append(names, n)
	}
	sort.Strings(names)
	workspace, err := os.MkdirTemp("", "vmshim-seed-")
	if err != nil {
		return fmt.Errorf("seed %s: %w", name, err)
	}
	defer os.RemoveAll(workspace)
	fs, err := iso9660.Create(file.New(f, false), 0, 0, isoBlockSize, workspace)
	if err != nil {
		return fmt.Errorf("seed %s: create iso9660: %w", name, err)
	}
	for _, n := range names {
		if err := writeISOFile(fs, n, files[n]); err != nil {
			return fmt.Errorf("seed %s: %w", name, err)
		}
	}
	opts := iso9660.FinalizeOptions{RockRidge: true, VolumeIdentifier: SeedLabel}
	if err := fs.Finalize(opts); err != nil {
		return fmt.Errorf("seed %s: finalize iso9660: %w", name, err)
	}
	blocks, err := padSeed(f)
	if err != nil {
		return fmt.Errorf("seed %s: %w", name, err)
	}
	if err := standardizeDescriptor(f, blocks); err != nil {
		return fmt.Errorf("seed %s: %w", name, err)
	}
	return nil
}

// writeISOFile adds one file to the image being built.
func writeISOFile(fs *iso9660.FileSystem, name string, data []byte) error {
	f, err := fs.OpenFile("/"+name, os.O_CREATE|os.O_RDWR)
	if err != nil {
		return fmt.Errorf("add %s: %w", name, err)
	}
	_, werr := f.Write(data)
	if err := errors.Join(werr, f.Close()); err != nil {
		return fmt.Errorf("add %s: %w", name, err)
	}
	return nil
}

// padSeed extends f with zeros to whole ISO blocks and to minSeedSize at
// least, and returns its size in blocks: the last file ends mid-block, and
// a drive's size must be whole blocks.
func padSeed(f *os.File) (uint32, error) {
	st, err := f.Stat()
	if err != nil {
		return 0, err
	}
	size := max(st.Size(), minSeedSize)
	if rem := size % isoBlockSize; rem != 0 {
		size += isoBlockSize - rem
	}
	if size/isoBlockSize > math.MaxUint32 {
		return 0, fmt.Errorf("image of %d bytes is too large for iso9660", size)
	}
	if size != st.Size() {
		if err := f.Truncate(size); err != nil {
			return 0, err
		}
	}
	return uint32(size / isoBlockSize), nil
}

// standardizeDescriptor rewrites the primary volume descriptor go-diskfs
// wrote as ECMA-119 has it: every text field padded with spaces (go-diskfs
// pads with NULs), the volume space size the image's blocks (padding
// included), and the expiration date unstated (go-diskfs makes the volume
// expire when it is written). It writes nothing unless the set is the
// primary descriptor and the terminator.
func standardizeDescriptor(f *os.File, blocks uint32) error {
	pvd, err := readDescriptor(f, vdPrimarySector, vdPrimary)
	if err != nil {
		return err
	}
	if _, err := readDescriptor(f, vdTerminatorSector, vdTerminator); err != nil {
		return err
	}
	for _, t := range seedText() {
		putPadded(pvd[t.off:t.off+t.size], t.value)
	}
	binary.LittleEndian.PutUint32(pvd[vdSpaceSizeOff:], blocks)
	binary.BigEndian.PutUint32(pvd[vdSpaceSizeOff+4:], blocks)
	copy(pvd[vdExpirationOff:], vdDateUnstated)
	if _, err := f.WriteAt(pvd, vdPrimarySector*isoBlockSize); err != nil {
		return fmt.Errorf("write volume descriptor at sector %d: %w", vdPrimarySector, err)
	}
	return nil
}

// readDescriptor reads the volume descriptor at sector, which must be of
// type typ.
func readDescriptor(f *os.File, sector int64, typ byte) ([]byte, error) {
	vd := make([]byte, isoBlockSize)
	if _, err := f.ReadAt(vd, sector*isoBlockSize); err != nil {
		return nil, fmt.Errorf("read volume descriptor at sector %d: %w", sector, err)
	}
	if string(vd[vdStandardIDOff:vdStandardIDOff+len(vdStandardID)]) != vdStandardID || vd[vdTypeOff] != typ {
		return nil, fmt.Errorf("sector %d is not a volume descriptor of type %d", sector, typ)
	}
	return vd, nil
}

// putPadded writes the ASCII s into field padded with spaces (0x20), as
// ECMA-119 fills a- and d-character fields.
func putPadded(field []byte, s string) {
	n := copy(field, s)
	for i := n; i < len(field); i++ {
		field[i] = ' '
	}
}
