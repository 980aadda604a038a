package diskcache

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// The xz container (https://tukaani.org/xz/xz-file-format.txt) is walked
// without decompressing: stream headers, block headers (for the LZMA2
// dictionary size, which sets the decoder's memory), LZMA2 chunk headers
// (for the sizes, and to find the next block), indexes and footers.

var (
	// errXZ is the error for a malformed xz file.
	errXZ = errors.New("malformed xz file")
	// errXZDict is the error for an LZMA2 dictionary over the limit.
	errXZDict = errors.New("xz dictionary too large")
)

// xzMagic starts every xz stream.
var xzMagic = []byte{0xfd, '7', 'z', 'X', 'Z', 0x00}

// lzma2Filter is the filter ID of LZMA2, the last filter of every block.
const lzma2Filter = 0x21

// scanXZ walks the xz file in r and returns the sum of the uncompressed
// sizes of its LZMA2 chunks. It fails with errXZDict for a dictionary over
// maxDict, and stops (with the size so far) once the size passes limit > 0.
func scanXZ(r *bufio.Reader, maxDict, limit int64) (int64, error) {
	var size int64
	for stream := 0; ; stream++ {
		if stream > 0 {
			more, err := skipStreamPadding(r)
			if err != nil || !more {
				return size, err
			}
		}
		var hdr [12]byte
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return size, errXZ
		}
		if !bytes.Equal(hdr[:6], xzMagic) || hdr[6] != 0 || hdr[7] > 0x0f {
			return size, errXZ
		}
		checkSize := 0
		if t := int(hdr[7]); t > 0 {
			checkSize = 4 << ((t - 1) / 3)
		}
		blocks := uint64(0)
		for {
			b, err := r.ReadByte()
			if err != nil {
				return size, errXZ
			}
			if b == 0 { // index indicator
				break
			}
			n, err := scanBlock(r, b, checkSize, maxDict)
			if err != nil {
				return size, err
			}
			if size += n; size < 0 || (limit > 0 && size > limit) {
				return size, nil
			}
			blocks++
		}
		if err := scanIndex(r, blocks, hdr[6:8]); err != nil {
			return size, err
		}
	}
}

// skipStreamPadding skips the zero bytes (a multiple of four) after a
// stream; more tells whether another stream follows.
func skipStreamPadding(r *bufio.Reader) (more bool, err error) {
	for n := 0; ; n++ {
		b, err := r.ReadByte()
		if err == io.EOF {
			return false, padded(n)
		}
		if err != nil {
			return false, err
		}
		if b != 0 {
			return true, errors.Join(padded(n), r.UnreadByte())
		}
	}
}

// padded checks n padding bytes are a multiple of four.
func padded(n int) error {
	if n%4 != 0 {
		return errXZ
	}
	return nil
}

// scanBlock walks a block whose header starts with size byte b, and returns
// its uncompressed size.
func scanBlock(r *bufio.Reader, b byte, checkSize int, maxDict int64) (int64, error) {
	hdr := make([]byte, (int(b)+1)*4)
	hdr[0] = b
	if _, err := io.ReadFull(r, hdr[1:]); err != nil {
		return 0, errXZ
	}
	if err := checkBlockHeader(hdr, maxDict); err != nil {
		return 0, err
	}
	packed, size, err := scanLZMA2(r)
	if err != nil {
		return 0, err
	}
	pad := (4 - (int64(len(hdr))+packed)%4) % 4
	if err := skipZeros(r, int(pad)); err != nil {
		return 0, err
	}
	if _, err := r.Discard(checkSize); err != nil {
		return 0, errXZ
	}
	return size, nil
}

// checkBlockHeader checks a block header (with its size byte and CRC32):
// its filters end with LZMA2, whose dictionary is at most maxDict.
func checkBlockHeader(hdr []byte, maxDict int64) error {
	flags := hdr[1]
	if flags&0x3c != 0 {
		return errXZ
	}
	body := hdr[:len(hdr)-4]
	p := 2
	next := func() (uint64, bool) {
		if p >= len(body) {
			return 0, false
		}
		v, n := binary.Uvarint(body[p:])
		if n <= 0 || n > 9 {
			return 0, false
		}
		p += n
		return v, true
	}
	for _, bit := range []byte{0x40, 0x80} { // compressed, uncompressed size
		if flags&bit != 0 {
			if _, ok := next(); !ok {
				return errXZ
			}
		}
	}
	filters := int(flags&3) + 1
	for i := range filters {
		id, ok1 := next()
		propsLen, ok2 := next()
		if !ok1 || !ok2 || propsLen > uint64(len(body)-p) {
			return errXZ
		}
		props := body[p : p+int(propsLen)]
		p += int(propsLen)
		if (id == lzma2Filter) != (i == filters-1) {
			return errXZ
		}
		if id == lzma2Filter {
			if len(props) != 1 || props[0] > 40 {
				return errXZ
			}
			if dict := lzma2Dict(props[0]); dict > maxDict {
				return fmt.Errorf("%w: %d bytes", errXZDict, dict)
			}
		}
	}
	for _, b := range body[p:] {
		if b != 0 {
			return errXZ
		}
	}
	return nil
}

// lzma2Dict decodes the dictionary size byte (at most 40) of LZMA2.
func lzma2Dict(b byte) int64 {
	if b == 40 {
		return 1<<32 - 1
	}
	return int64(2|b&1) << (b/2 + 11)
}

// scanLZMA2 walks the chunks of an LZMA2 stream to its end marker and
// returns its packed length and its uncompressed size.
func scanLZMA2(r *bufio.Reader) (packed, size int64, err error) {
	var buf [5]byte
	for {
		c, err := r.ReadByte()
		if err != nil {
			return 0, 0, errXZ
		}
		packed++
		var skip, n int
		switch {
		case c == 0:
			return packed, size, nil
		case c == 1 || c == 2: // uncompressed chunk
			if _, err := io.ReadFull(r, buf[:2]); err != nil {
				return 0, 0, errXZ
			}
			n = int(binary.BigEndian.Uint16(buf[:2])) + 1
			packed, skip = packed+2, n
		case c >= 0x80: // LZMA chunk, with properties from 0xc0
			hl := 4
			if c >= 0xc0 {
				hl = 5
			}
			if _, err := io.ReadFull(r, buf[:hl]); err != nil {
				return 0, 0, errXZ
			}
			n = (int(c&0x1f)<<16 | int(binary.BigEndian.Uint16(buf[:2]))) + 1
			skip = int(binary.BigEndian.Uint16(buf[2:4])) + 1
			packed += int64(hl)
		default:
			return 0, 0, errXZ
		}
		if _, err := r.Discard(skip); err != nil {
			return 0, 0, errXZ
		}
		packed += int64(skip)
		size += int64(n)
	}
}

// scanIndex walks an index (after its indicator byte) of blocks records
// and the stream footer, whose flags must be the header's.
func scanIndex(r *bufio.Reader, blocks uint64, flags []byte) error {
	records, err := binary.ReadUvarint(r)
	if err != nil || records != blocks {
		return errXZ
	}
	n := 1 + uvarintLen(records)
	for range 2 * records {
		v, err := binary.ReadUvarint(r)
		if err != nil {
			return errXZ
		}
		n += uvarintLen(v)
	}
	if err := skipZeros(r, (4-n%4)%4); err != nil {
		return err
	}
	var tail [4 + 12]byte // index CRC32, then footer
	if _, err := io.ReadFull(r, tail[:]); err != nil {
		return errXZ
	}
	footer := tail[4:]
	if !bytes.Equal(footer[8:10], flags) || string(footer[10:]) != "YZ" {
		return errXZ
	}
	return nil
}

// uvarintLen is the length of v as a multibyte integer.
func uvarintLen(v uint64) int {
	var buf [binary.MaxVarintLen64]byte
	return binary.PutUvarint(buf[:], v)
}

// skipZeros reads n bytes that must all be zero.
func skipZeros(r *bufio.Reader, n int) error {
	for range n {
		if b, err := r.ReadByte(); err != nil || b != 0 {
			return errXZ
		}
	}
	return nil
}
