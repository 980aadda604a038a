package topology

import (
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

func TestParseCPUSet(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want CPUSet
		err  string
	}{
		{in: "", want: CPUSet{}},
		{in: " \n\t", want: CPUSet{}},
		{in: "0", want: CPUSet{0}},
		{in: "0-3,8,10-11", want: CPUSet{0, 1, 2, 3, 8, 10, 11}},
		{in: "0-3,8,10-11\n", want: CPUSet{0, 1, 2, 3, 8, 10, 11}},
		{in: "  5-5 ", want: CPUSet{5}},
		{in: "3,1,2", want: CPUSet{1, 2, 3}},
		{in: "0-4,2-6,6,6", want: CPUSet{0, 1, 2, 3, 4, 5, 6}},
		{in: "007", want: CPUSet{7}},
		{in: "8190-8191", want: CPUSet{8190, 8191}},
		{in: "3-1", err: `cpu list "3-1": range 3-1 is reversed`},
		{in: "1,,2", err: `cpu list "1,,2": empty element`},
		{in: ",1", err: `cpu list ",1": empty element`},
		{in: "1,", err: `cpu list "1,": empty element`},
		{in: "8192", err: `cpu list "8192": 8192 is above the highest id 8191`},
		{in: "0-99999999999999999999999", err: `cpu list "0-99999999999999999999999": 99999999999999999999999 is above the highest id 8191`},
		{in: "-1", err: `cpu list "-1": "-1" is not an id or a range of ids`},
		{in: "+1", err: `cpu list "+1": "+1" is not an id or a range of ids`},
		{in: "1-", err: `cpu list "1-": "1-" is not an id or a range of ids`},
		{in: "1-2-3", err: `cpu list "1-2-3": "1-2-3" is not an id or a range of ids`},
		{in: "1, 2", err: `cpu list "1, 2": " 2" is not an id or a range of ids`},
		{in: "0-15:2/4", err: `cpu list "0-15:2/4": "0-15:2/4" is not an id or a range of ids`},
		{in: "x", err: `cpu list "x": "x" is not an id or a range of ids`},
		{in: "1\n2", err: `cpu list "1\n2": "1\n2" is not an id or a range of ids`},
		{in: "١", err: `cpu list "١": "١" is not an id or a range of ids`},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseCPUSet(tc.in)
			if tc.err != "" {
				if err == nil || err.Error() != tc.err || !errdefs.IsInvalidArgument(err) {
					t.Fatalf("ParseCPUSet(%q) = %v, %v; want invalid argument %q", tc.in, got, err, tc.err)
				}
				return
			}
			if err != nil || !got.Equal(tc.want) || got == nil {
				t.Fatalf("ParseCPUSet(%q) = %#v, %v; want %v", tc.in, got, err, tc.want)
			}
		})
	}
}

func TestCPUSetString(t *testing.T) {
	for _, tc := range []struct {
		set  CPUSet
		want string
	}{
		{nil, ""},
		{CPUSet{}, ""},
		{CPUSet{4}, "4"},
		{CPUSet{0, 1}, "0-1"},
		{CPUSet{0, 1, 2, 3, 8, 10, 11}, "0-3,8,10-11"},
		{CPUSet{1, 3, 5}, "1,3,5"},
		{CPUSet{0, 2, 3, 4, 8191}, "0,2-4,8191"},
	} {
		if got := tc.set.String(); got != tc.want {
			t.Errorf("%#v.String() = %q, want %q", tc.set, got, tc.want)
		}
	}
}

func TestCPUSetContains(t *testing.T) {
	s := CPUSet{1, 2, 5, 9}
	for id, want := range map[int]bool{-1: false, 0: false, 1: true, 2: true, 3: false, 5: true, 9: true, 10: false} {
		if got := s.Contains(id); got != want {
			t.Errorf("%v.Contains(%d) = %v, want %v", s, id, got, want)
		}
	}
	if CPUSet(nil).Contains(0) {
		t.Error("the empty set contains 0")
	}
}

func TestCPUSetEqual(t *testing.T) {
	for _, tc := range []struct {
		a, b CPUSet
		want bool
	}{
		{nil, nil, true},
		{nil, CPUSet{}, true},
		{CPUSet{1, 2}, CPUSet{1, 2}, true},
		{CPUSet{1, 2}, CPUSet{1, 3}, false},
		{CPUSet{1, 2}, CPUSet{1}, false},
		{CPUSet{}, CPUSet{0}, false},
	} {
		if got := tc.a.Equal(tc.b); got != tc.want {
			t.Errorf("%v.Equal(%v) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}

// TestParseCPUSetWide checks that many wide elements cost little.
func TestParseCPUSetWide(t *testing.T) {
	in := strings.Repeat("0-8191,", 100000) + "5"
	got, err := ParseCPUSet(in)
	if err != nil || len(got) != MaxCPUID+1 || got.String() != "0-8191" {
		t.Fatalf("ParseCPUSet(100000 × 0-8191) = %d ids %q, %v", len(got), got.String(), err)
	}
}
