package topology

import (
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

// FuzzParseTopology checks that ParseTopology never panics, that what it
// accepts is within limits, gives distinct ids to every vCPU and survives
// String and a second parse, and that what it refuses gets a one-line
// invalid argument error.
func FuzzParseTopology(f *testing.F) {
	for _, s := range []string{
		"sockets=2,cores=2,threads=1", "threads=2,sockets=1,cores=4", "", "sockets=2,cores=x",
		"sockets=1,cores=1,threads=1,dies=1", "sockets=1,sockets=1", "sockets=0,cores=1,threads=1",
		"sockets=8192,cores=8192,threads=8192", "sockets=1,cores=1024,threads=1", "=,=",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		top, err := ParseTopology(in)
		if err != nil {
			if !errdefs.IsInvalidArgument(err) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("ParseTopology(%q) error %q: want one line, invalid argument", in, err)
			}
			return
		}
		n := top.CPUs()
		if top.Sockets < 1 || top.Cores < 1 || top.Threads < 1 || n > MaxVCPUs {
			t.Fatalf("ParseTopology(%q) = %v", in, top)
		}
		again, err := ParseTopology(top.String())
		if err != nil || again != top {
			t.Fatalf("ParseTopology(%q) = %v; its String %q parses to %v, %v", in, top, top.String(), again, err)
		}
		seen := make(map[[3]int]bool, n)
		for i := range n {
			s, c, th := top.IDs(i)
			if s >= top.Sockets || c >= top.Cores || th >= top.Threads || seen[[3]int{s, c, th}] {
				t.Fatalf("%v.IDs(%d) = %d, %d, %d: out of range or repeated", top, i, s, c, th)
			}
			seen[[3]int{s, c, th}] = true
		}
	})
}
