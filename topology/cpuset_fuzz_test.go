package topology

import (
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

// FuzzParseCPUSet checks that ParseCPUSet never panics, that what it
// accepts is sorted, unique and in range and survives String and a second
// parse unchanged, and that what it refuses gets a one-line invalid
// argument error.
func FuzzParseCPUSet(f *testing.F) {
	for _, s := range []string{"", "\n", "0", "0-3,8,10-11\n", "3-1", "1,,2", "8191", "8192", "-1", "+1", "0-0", "1-2-3", " 4 ", "0-4,2-6"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		set, err := ParseCPUSet(in)
		if err != nil {
			if !errdefs.IsInvalidArgument(err) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("ParseCPUSet(%q) error %q: want one line, invalid argument", in, err)
			}
			return
		}
		for i, id := range set {
			if id < 0 || id > MaxCPUID || (i > 0 && id <= set[i-1]) {
				t.Fatalf("ParseCPUSet(%q) = %v: not sorted, unique, in 0-%d", in, set, MaxCPUID)
			}
		}
		out := set.String()
		again, err := ParseCPUSet(out)
		if err != nil || !again.Equal(set) {
			t.Fatalf("ParseCPUSet(%q) = %v; its String %q parses to %v, %v", in, set, out, again, err)
		}
		if again.String() != out {
			t.Fatalf("String of %v is %q, then %q", set, out, again.String())
		}
	})
}
