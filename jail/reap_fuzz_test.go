package jail

import (
	"bytes"
	"testing"
)

// FuzzParseStatus feeds parseStatus arbitrary status files (a process
// names itself in one): it never panics, and what it accepts has the id
// lines it read.
func FuzzParseStatus(f *testing.F) {
	f.Add([]byte("Name:\tqemu-img\nState:\tS (sleeping)\nUid:\t5\t6\t7\t8\nGid:\t9\t10\t11\t12\n"))
	f.Add([]byte("State:\tZ (zombie)\nUid:\t1\t1\t1\t1\nGid:\t1\t1\t1\t1\n"))
	f.Add([]byte("Uid:\t4294967295\t0\t0\t0\nGid:\t0\t0\t0\t4294967296\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		st, ok := parseStatus(data)
		if ok && (!bytes.Contains(data, []byte("Uid:")) || !bytes.Contains(data, []byte("Gid:"))) {
			t.Fatalf("parseStatus(%q) = %+v, accepted without id lines", data, st)
		}
	})
}
