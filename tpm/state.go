package tpm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/containerd/errdefs"
)

// StateName is the file that holds a VM's TPM state: in the VM's files
// directory, or on its root disk's filesystem volume beside the disk and
// the UEFI variables, where it is kept.
const StateName = "vmshim-tpm2.state"

// MaxStateSize bounds a state file. swtpm's linear store holds three
// blobs (permanent, volatile, saved state) of a few to a few hundred KiB:
// libtpms's NV space is 128 KiB.
const MaxStateSize = 16 << 20

// The layout of swtpm's linear store (swtpm_nvstore_linear.h), which
// swtpm's file:// state backend keeps: a little-endian header of a magic,
// a version, a header size and 15 slots, each the offset, valid length
// and section length of one blob; the blobs follow the header.
const (
	linearMagic    = 0x737774706d6c696e // "swtpmlin"
	linearVersion  = 1
	linearSlots    = 15
	linearSlotSize = 12
	linearHdrSize  = 8 + 1 + 1 + 2 + linearSlots*linearSlotSize // 192
)

// StateError says why a state file is not one swtpm can use as it is.
type StateError struct{ Reason string }

func (e *StateError) Error() string { return "not a TPM state of swtpm's: " + e.Reason }

// Unwrap classes the error as a failed precondition: the state is kept,
// for the operator to look at.
func (e *StateError) Unwrap() error { return errdefs.ErrFailedPrecondition }

// CheckState checks an open state file before swtpm opens it: an empty
// file is a new TPM, which swtpm formats; anything else must be the
// linear store swtpm writes. swtpm itself would format over a file that
// lacks its magic, losing what it held, and trusts the slots it reads:
// the shim refuses such a file and leaves it as it is.
func CheckState(f *os.File) error {
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return &StateError{Reason: "not a regular file"}
	}
	size := fi.Size()
	if size == 0 {
		return nil
	}
	if size > MaxStateSize {
		return &StateError{Reason: fmt.Sprintf("%d bytes, more than %d", size, MaxStateSize)}
	}
	hdr := make([]byte, linearHdrSize)
	n, err := f.ReadAt(hdr, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	return parseState(hdr[:n], size)
}

// parseState checks hdr, the first bytes (at most linearHdrSize) of a
// state file of size bytes.
func parseState(hdr []byte, size int64) error {
	if len(hdr) < linearHdrSize || size < linearHdrSize {
		return &StateError{Reason: fmt.Sprintf("%d bytes, shorter than swtpm's %d-byte header", size, linearHdrSize)}
	}
	if m := binary.LittleEndian.Uint64(hdr); m != linearMagic {
		return &StateError{Reason: fmt.Sprintf("magic %#x, want %#x", m, uint64(linearMagic))}
	}
	if v := hdr[8]; v != linearVersion {
		return &StateError{Reason: fmt.Sprintf("format version %d, want %d", v, linearVersion)}
	}
	if h := binary.LittleEndian.Uint16(hdr[10:]); h != linearHdrSize {
		return &StateError{Reason: fmt.Sprintf("header size %d, want %d", h, linearHdrSize)}
	}
	type section struct{ start, end int64 }
	var used []section
	for i := range linearSlots {
		b := hdr[12+i*linearSlotSize:]
		off := int64(binary.LittleEndian.Uint32(b))
		length := int64(binary.LittleEndian.Uint32(b[4:]))
		sect := int64(binary.LittleEndian.Uint32(b[8:]))
		if off == 0 {
			if length != 0 || sect != 0 {
				return &StateError{Reason: fmt.Sprintf("slot %d is free but has %d bytes", i, length)}
			}
			continue
		}
		switch {
		case off < linearHdrSize:
			return &StateError{Reason: fmt.Sprintf("slot %d starts at %d, inside the header", i, off)}
		case length > sect:
			return &StateError{Reason: fmt.Sprintf("slot %d holds %d bytes in a section of %d", i, length, sect)}
		case off+sect > size:
			return &StateError{Reason: fmt.Sprintf("slot %d ends at %d, past the file's %d bytes", i, off+sect, size)}
		}
		s := section{off, off + sect}
		for _, u := range used {
			if s.start < u.end && u.start < s.end {
				return &StateError{Reason: fmt.Sprintf("slot %d overlaps another", i)}
			}
		}
		used = append(used, s)
	}
	return nil
}
