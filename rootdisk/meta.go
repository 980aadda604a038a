package rootdisk

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode"

	"golang.org/x/sys/unix"
)

// maxMeta bounds what is read of MetaName.
const maxMeta = 64 << 10

// meta is MetaName: where the volume's disk came from.
type meta struct {
	Version int       `json:"version"`
	Image   string    `json:"image"`  // Fingerprint of the image's disk
	Source  string    `json:"source"` // the image's disk, as Image.Name named it
	Made    time.Time `json:"made"`
}

// source names where the disk came from, for a log line.
func (m meta) source() string {
	if m.Image == "" {
		return "an image it does not record"
	}
	s := strings.Map(func(r rune) rune {
		if !unicode.IsGraphic(r) {
			return -1
		}
		return r
	}, m.Source)
	if len(s) > 200 {
		s = strings.ToValidUTF8(s[:200], "") + "…"
	}
	return fmt.Sprintf("%s on %s", strconv.Quote(s), m.Made.Format(time.RFC3339))
}

// parseMeta reads MetaName's content; anything it cannot read is a disk of
// unknown origin, the zero meta.
func parseMeta(b []byte) meta {
	var m meta
	if len(b) > maxMeta || json.Unmarshal(b, &m) != nil || m.Version != 1 || !isFingerprint(m.Image) {
		return meta{}
	}
	return m
}

// readMeta reads the volume's MetaName; none is the zero meta. A name that
// is not a regular file with one link is an error, never opened.
func (v volume) readMeta() (meta, error) {
	f, err := v.open(MetaName, unix.O_RDONLY)
	if errors.Is(err, os.ErrNotExist) {
		return meta{}, nil
	}
	if err != nil {
		return meta{}, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxMeta+1))
	if err != nil {
		return meta{}, fmt.Errorf("root disk volume %s: read %s: %w", v.name, MetaName, err)
	}
	return parseMeta(b), nil
}

// writeMeta replaces the volume's MetaName.
func (v volume) writeMeta(m meta) error {
	const temp = MetaName + ".part"
	b, err := marshalMeta(m)
	if err != nil {
		return err
	}
	_ = unix.Unlinkat(int(v.dir.Fd()), temp, 0)
	f, err := v.open(temp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL)
	if err != nil {
		return err
	}
	_, err = f.Write(append(b, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = unix.Renameat(int(v.dir.Fd()), temp, int(v.dir.Fd()), MetaName)
	}
	if err != nil {
		_ = unix.Unlinkat(int(v.dir.Fd()), temp, 0)
		return fmt.Errorf("root disk volume %s: write %s: %w", v.name, MetaName, err)
	}
	return nil
}

// marshalMeta writes m as one line of JSON, at most maxMeta bytes.
func marshalMeta(m meta) ([]byte, error) {
	b, err := json.Marshal(m)
	if err == nil && len(b) > maxMeta {
		err = fmt.Errorf("record of %d bytes, more than %d", len(b), maxMeta)
	}
	return b, err
}

// Fingerprint samples an image's disk so that a rebuilt image is told from
// the one a disk was made from without reading all of it: the sha256 of
// its format, size, and 64 KiB at 32 offsets spread over it (the first and
// the last among them), which cover a qcow2 image's header and tables.
func Fingerprint(f *os.File, format string) (string, error) {
	const samples, chunk = 32, 64 << 10
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return "", fmt.Errorf("fingerprint %s: %w", f.Name(), err)
	}
	h := sha256.New()
	fmt.Fprintf(h, "vmshim-rootdisk-v1 %s %d\n", format, st.Size)
	buf := make([]byte, chunk)
	for i := range int64(samples) {
		off := max(0, (st.Size-chunk)*i/(samples-1))
		n, err := f.ReadAt(buf, off)
		if err != nil && !errors.Is(err, io.EOF) {
			return "", fmt.Errorf("fingerprint %s: %w", f.Name(), err)
		}
		h.Write(buf[:n])
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

// isFingerprint reports whether s has Fingerprint's shape.
func isFingerprint(s string) bool {
	h, ok := strings.CutPrefix(s, "sha256:")
	if !ok || len(h) != 64 {
		return false
	}
	_, err := hex.DecodeString(h)
	return err == nil && strings.ToLower(h) == h
}
