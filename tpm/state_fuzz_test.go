package tpm

import (
	"encoding/binary"
	"testing"
)

// FuzzParseState feeds parseState any header and file size: it must not
// panic, and what it accepts must be a store swtpm reads within the file.
func FuzzParseState(f *testing.F) {
	f.Add(store(linearHdrSize), int64(linearHdrSize))
	f.Add(store(linearHdrSize+2048, slot{linearHdrSize, 1900, 2048}), int64(linearHdrSize+2048))
	f.Add([]byte("swtpmlin"), int64(8))
	f.Fuzz(func(t *testing.T, b []byte, size int64) {
		if len(b) > linearHdrSize {
			b = b[:linearHdrSize]
		}
		if parseState(b, size) != nil {
			return
		}
		if len(b) < linearHdrSize || size < linearHdrSize {
			t.Fatalf("accepted a header of %d bytes in a file of %d", len(b), size)
		}
		for i := range linearSlots {
			p := b[12+i*linearSlotSize:]
			off, length, sect := int64(binary.LittleEndian.Uint32(p)), int64(binary.LittleEndian.Uint32(p[4:])), int64(binary.LittleEndian.Uint32(p[8:]))
			if off != 0 && (off < linearHdrSize || off+length > size || length > sect) {
				t.Fatalf("accepted slot %d at %d, %d of %d bytes, in a file of %d", i, off, length, sect, size)
			}
		}
	})
}
