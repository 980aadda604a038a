package topology

import (
	"fmt"
	"strings"
)

// MaxVCPUs is the most vCPUs a Topology may describe.
const MaxVCPUs = 1024

// Topology is a guest's CPU topology: how many sockets, cores per socket
// and threads per core it has.
type Topology struct {
	Sockets, Cores, Threads int
}

// CPUs returns the number of vCPUs t describes.
func (t Topology) CPUs() int {
	return t.Sockets * t.Cores * t.Threads
}

// DefaultTopology is one socket with maxVCPUs single-threaded cores.
func DefaultTopology(maxVCPUs int) Topology {
	return Topology{Sockets: 1, Cores: maxVCPUs, Threads: 1}
}

// ParseTopology parses an annotation value such as
// "sockets=2,cores=2,threads=1": the keys sockets, cores and threads, each
// exactly once in any order, each a decimal number from 1 to MaxCPUID+1,
// with at most MaxVCPUs vCPUs in all. No whitespace is allowed. Errors
// wrap errdefs.ErrInvalidArgument.
func ParseTopology(s string) (Topology, error) {
	var t Topology
	if s != "" {
		for elem := range strings.SplitSeq(s, ",") {
			key, val, ok := strings.Cut(elem, "=")
			if !ok {
				return Topology{}, invalidf("%q: %q is not key=value", s, elem)
			}
			var field *int
			switch key {
			case "sockets":
				field = &t.Sockets
			case "cores":
				field = &t.Cores
			case "threads":
				field = &t.Threads
			default:
				return Topology{}, invalidf("%q: unknown key %q", s, key)
			}
			if *field != 0 {
				return Topology{}, invalidf("%q: %s given twice", s, key)
			}
			n, ok := parseID(val)
			if !ok {
				return Topology{}, invalidf("%q: %s: %q is not a whole number", s, key, val)
			}
			if n < 1 || n > MaxCPUID+1 {
				return Topology{}, invalidf("%q: %s: %s is not in 1-%d", s, key, val, MaxCPUID+1)
			}
			*field = n
		}
	}
	for _, f := range []struct {
		key string
		n   int
	}{{"sockets", t.Sockets}, {"cores", t.Cores}, {"threads", t.Threads}} {
		if f.n == 0 {
			return Topology{}, invalidf("%q: missing %s", s, f.key)
		}
	}
	if n := int64(t.Sockets) * int64(t.Cores) * int64(t.Threads); n > MaxVCPUs {
		return Topology{}, invalidf("%q: %d vCPUs, more than %d", s, n, MaxVCPUs)
	}
	return t, nil
}

// IDs returns the socket, core and thread of vCPU index i, counting
// threads fastest and sockets slowest: QEMU's x86 APIC id order with one
// die per socket. t must have positive fields; i should be below t.CPUs().
func (t Topology) IDs(i int) (socket, core, thread int) {
	return i / (t.Threads * t.Cores), (i / t.Threads) % t.Cores, i % t.Threads
}

// String returns t as "sockets=S,cores=C,threads=T", the form QEMU's -smp
// takes after the vCPU count and ParseTopology reads.
func (t Topology) String() string {
	return fmt.Sprintf("sockets=%d,cores=%d,threads=%d", t.Sockets, t.Cores, t.Threads)
}
