package image

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"
)

// qemuImgInfoSeeds are `qemu-img info --output=json` answers as qemu-img
// 7.2 writes them, and some it never would.
func qemuImgInfoSeeds() [][]byte {
	return [][]byte{
		[]byte(`{"virtual-size": 1073741824, "filename": "/dev/fd/3", "cluster-size": 65536, "format": "qcow2", "actual-size": 200704,
 "format-specific": {"type": "qcow2", "data": {"compat": "1.1", "compression-type": "zlib", "lazy-refcounts": false, "refcount-bits": 16, "corrupt": false, "extended-l2": false}}, "dirty-flag": false}`),
		[]byte(`{"virtual-size": 1048576, "filename": "/dev/fd/3", "format": "raw", "actual-size": 4096, "dirty-flag": false}`),
		[]byte(`{"backing-filename-format": "qcow2", "virtual-size": 1073741824, "format": "qcow2", "full-backing-filename": "/etc/shadow", "backing-filename": "/etc/shadow"}`),
		[]byte(`{"virtual-size": 1048576, "format": "qcow2", "format-specific": {"type": "qcow2", "data": {"data-file": "/dev/sda", "data-file-raw": true, "corrupt": false}}}`),
		[]byte(`{"virtual-size": 1048576, "format": "qcow2", "format-specific": {"data": {"data-file-raw": false}}}`),
		[]byte(`{"virtual-size": 1048576, "format": "qcow2", "encrypted": true}`),
		[]byte(`{"virtual-size": 1048576, "format": "qcow2", "format-specific": {"data": {"corrupt": true}}}`),
		[]byte(`{"virtual-size": 0, "format": "raw"}`),
		[]byte(`{"virtual-size": -1, "format": "raw"}`),
		[]byte(`{"virtual-size": 9223372036854775807, "format": "raw"}`),
		[]byte(`{"virtual-size": 1e3, "format": "raw"}`),
		[]byte(`{"format": "vmdk", "virtual-size": 1}`),
		[]byte(`{"Format": "raw", "Virtual-Size": 1, "backing-filename": null}`),
		[]byte(`{"format": "raw", "format": "qcow2", "virtual-size": 1}`),
		[]byte(`{"format": "raw\n", "virtual-size": 1}`),
		[]byte(`[]`),
		[]byte(``),
	}
}

// FuzzQEMUImgInfo decodes qemu-img info answers as Inspect does and checks
// that refuse lets through only self-contained, unencrypted, sound disks
// of the pinned format within the size limit, and errs in one line.
func FuzzQEMUImgInfo(f *testing.F) {
	for _, s := range qemuImgInfoSeeds() {
		f.Add(s, false, int64(0))
		f.Add(s, true, int64(256<<30))
	}
	f.Fuzz(func(t *testing.T, data []byte, raw bool, maxSize int64) {
		var ii imgInfo
		if json.Unmarshal(data, &ii) != nil {
			return
		}
		format := FormatQCOW2
		if raw {
			format = FormatRaw
		}
		lim := Limits{MaxVirtualSize: maxSize}
		err := refuse("/disk/disk.img", format, &ii, lim)
		if err != nil {
			checkOneLine(t, err)
			return
		}
		d := ii.FormatSpecific.Data
		switch {
		case ii.Format != format:
			t.Fatalf("accepted format %q, pinned %q", ii.Format, format)
		case ii.BackingFilename != nil || ii.FullBackingFilename != nil || ii.BackingFormat != nil:
			t.Fatal("accepted a backing file")
		case d.DataFile != nil || d.DataFileRaw != nil:
			t.Fatal("accepted an external data file")
		case ii.Encrypted || d.Corrupt:
			t.Fatal("accepted an encrypted or corrupt image")
		case ii.VirtualSize <= 0 || (maxSize > 0 && ii.VirtualSize > maxSize):
			t.Fatalf("accepted virtual size %d with limit %d", ii.VirtualSize, maxSize)
		}
	})
}

// qemuImgMessageSeeds are FuzzQEMUImgMessage inputs: qemu-img's stderr
// and the rootfs whose paths it shortens.
func qemuImgMessageSeeds() [][2]string {
	return [][2]string{
		{"qemu-img: Could not open '/r/rootfs/disk/a.qcow2': bad\nqemu-img: second\n", "/r/rootfs"},
		{"", "/"},
		{"\n \t\n", ""},
		{strings.Repeat("é", 300), ""},
		{strings.Repeat("x", maxMessage-1) + "\xff\xfe\xfd", ""},
		{"qemu-img: Could not open backing file '\xff\xfe': No such file", ""},
		{"qemu-img: \x1b[31mred\x1b[0m\r\nqemu-img:\u2028next", "/r"},
		{"qemu-img: /r/x/r/y", "/r"},
	}
}

// moreLines is the count of more lines message adds at its end.
var moreLines = regexp.MustCompile(` \(and [0-9]+ more\)$`)

// FuzzQEMUImgMessage condenses fuzzed qemu-img stderr, which quotes names
// and strings from the image, into the one line an error carries.
func FuzzQEMUImgMessage(f *testing.F) {
	for _, s := range qemuImgMessageSeeds() {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, stderr, root string) {
		msg := message(stderr, root)
		if msg == "" || strings.ContainsAny(msg, "\n\r") {
			t.Fatalf("message %q is not one line", msg)
		}
		// The message is cut at maxMessage bytes, then the count of more
		// lines is added.
		if first := moreLines.ReplaceAllString(msg, ""); len(first) > maxMessage+len("…") {
			t.Fatalf("message is %d bytes before its count of more lines: %q", len(first), msg)
		}
		if !utf8.ValidString(msg) {
			// qemu-img quotes names from the image byte for byte; the
			// error goes through gRPC, which takes only UTF-8.
			t.Fatalf("message %q is not valid UTF-8", msg)
		}
	})
}
