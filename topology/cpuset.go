package topology

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
)

// MaxCPUID is the highest CPU (or NUMA node) id a CPUSet may hold: the
// largest CONFIG_NR_CPUS Linux builds with is 8192.
const MaxCPUID = 8191

// CPUSet is a set of CPU (or NUMA node) ids, sorted, unique and
// non-negative.
type CPUSet []int

// ParseCPUSet parses the Linux list format of cpuset.cpus, cpuset.mems
// and sysfs cpulist files, such as "0-3,8,10-11". Whitespace around the
// whole value is ignored, and an empty value is the empty set.
// Overlapping elements are merged. Errors wrap errdefs.ErrInvalidArgument.
func ParseCPUSet(s string) (CPUSet, error) {
	v := strings.TrimSpace(s)
	if v == "" {
		return CPUSet{}, nil
	}
	// depth[id] counts the ranges that start at or before id minus those
	// that end before it, so each element costs O(1) however wide it is.
	var depth [MaxCPUID + 2]int
	for elem := range strings.SplitSeq(v, ",") {
		if elem == "" {
			return nil, invalidf("cpu list %q: empty element", s)
		}
		lo, hi := elem, elem
		if a, b, ok := strings.Cut(elem, "-"); ok {
			lo, hi = a, b
		}
		first, ok := parseID(lo)
		last, ok2 := parseID(hi)
		if !ok || !ok2 {
			return nil, invalidf("cpu list %q: %q is not an id or a range of ids", s, elem)
		}
		if first > MaxCPUID {
			return nil, invalidf("cpu list %q: %s is above the highest id %d", s, lo, MaxCPUID)
		}
		if last > MaxCPUID {
			return nil, invalidf("cpu list %q: %s is above the highest id %d", s, hi, MaxCPUID)
		}
		if first > last {
			return nil, invalidf("cpu list %q: range %s is reversed", s, elem)
		}
		depth[first]++
		depth[last+1]--
	}
	set := CPUSet{}
	n := 0
	for id := range MaxCPUID + 1 {
		n += depth[id]
		if n > 0 {
			set = append(set, id)
		}
	}
	return set, nil
}

// parseID parses a run of decimal digits; values above 1<<20 come back
// as 1<<20, so that long runs cannot overflow.
func parseID(s string) (int, bool) {
	if s == "" {
		return 0, false
	}
	n := 0
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = min(n*10+int(c-'0'), 1<<20)
	}
	return n, true
}

// String returns s in the canonical list format, with runs of consecutive
// ids as ranges: "0-3,8,10-11". The empty set is "".
func (s CPUSet) String() string {
	var b strings.Builder
	for i := 0; i < len(s); {
		j := i
		for j+1 < len(s) && s[j+1] == s[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(s[i]))
		if j > i {
			b.WriteByte('-')
			b.WriteString(strconv.Itoa(s[j]))
		}
		i = j + 1
	}
	return b.String()
}

// Contains reports whether id is in s.
func (s CPUSet) Contains(id int) bool {
	i := sort.SearchInts(s, id)
	return i < len(s) && s[i] == id
}

// Equal reports whether s and o hold the same ids; nil and empty are equal.
func (s CPUSet) Equal(o CPUSet) bool {
	if len(s) != len(o) {
		return false
	}
	for i := range s {
		if s[i] != o[i] {
			return false
		}
	}
	return true
}

// invalidf returns a one-line error that is errdefs.ErrInvalidArgument.
func invalidf(format string, args ...any) error {
	return errdefs.ErrInvalidArgument.WithMessage(fmt.Sprintf(format, args...))
}
