package topology

import (
	"testing"

	"github.com/containerd/errdefs"
)

func TestParseTopology(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Topology
		err  string
	}{
		{in: "sockets=2,cores=2,threads=1", want: Topology{2, 2, 1}},
		{in: "threads=2,sockets=1,cores=4", want: Topology{1, 4, 2}},
		{in: "sockets=1,cores=1024,threads=1", want: Topology{1, 1024, 1}},
		{in: "sockets=01,cores=08,threads=2", want: Topology{1, 8, 2}},
		{in: "sockets=2,cores=x", err: `"sockets=2,cores=x": cores: "x" is not a whole number`},
		{in: "sockets=2,cores=2", err: `"sockets=2,cores=2": missing threads`},
		{in: "", err: `"": missing sockets`},
		{in: "sockets=1,cores=1,threads=1,dies=1", err: `"sockets=1,cores=1,threads=1,dies=1": unknown key "dies"`},
		{in: "sockets=1,sockets=1,cores=1,threads=1", err: `"sockets=1,sockets=1,cores=1,threads=1": sockets given twice`},
		{in: "sockets=0,cores=1,threads=1", err: `"sockets=0,cores=1,threads=1": sockets: 0 is not in 1-8192`},
		{in: "sockets=1,cores=8193,threads=1", err: `"sockets=1,cores=8193,threads=1": cores: 8193 is not in 1-8192`},
		{in: "sockets=1,cores=99999999999999999999,threads=1", err: `"sockets=1,cores=99999999999999999999,threads=1": cores: 99999999999999999999 is not in 1-8192`},
		{in: "sockets=1,cores=-1,threads=1", err: `"sockets=1,cores=-1,threads=1": cores: "-1" is not a whole number`},
		{in: "sockets=1,cores=+1,threads=1", err: `"sockets=1,cores=+1,threads=1": cores: "+1" is not a whole number`},
		{in: "sockets=1,cores=,threads=1", err: `"sockets=1,cores=,threads=1": cores: "" is not a whole number`},
		{in: "sockets=1, cores=1,threads=1", err: `"sockets=1, cores=1,threads=1": unknown key " cores"`},
		{in: "sockets=1,cores=1 ,threads=1", err: `"sockets=1,cores=1 ,threads=1": cores: "1 " is not a whole number`},
		{in: "sockets=1,,cores=1,threads=1", err: `"sockets=1,,cores=1,threads=1": "" is not key=value`},
		{in: "sockets", err: `"sockets": "sockets" is not key=value`},
		{in: "Sockets=1,cores=1,threads=1", err: `"Sockets=1,cores=1,threads=1": unknown key "Sockets"`},
		{in: "sockets=2,cores=32,threads=32", err: `"sockets=2,cores=32,threads=32": 2048 vCPUs, more than 1024`},
		{in: "sockets=8192,cores=8192,threads=8192", err: `"sockets=8192,cores=8192,threads=8192": 549755813888 vCPUs, more than 1024`},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseTopology(tc.in)
			if tc.err != "" {
				if err == nil || err.Error() != tc.err || !errdefs.IsInvalidArgument(err) {
					t.Fatalf("ParseTopology(%q) = %v, %v; want invalid argument %q", tc.in, got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ParseTopology(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
			}
		})
	}
}

func TestTopologyString(t *testing.T) {
	for _, tc := range []struct {
		t    Topology
		want string
	}{
		{Topology{2, 2, 1}, "sockets=2,cores=2,threads=1"},
		{DefaultTopology(4), "sockets=1,cores=4,threads=1"},
	} {
		if got := tc.t.String(); got != tc.want {
			t.Errorf("%#v.String() = %q, want %q", tc.t, got, tc.want)
		}
	}
}

func TestDefaultTopology(t *testing.T) {
	for _, n := range []int{1, 3, 1024} {
		if got := DefaultTopology(n); got != (Topology{1, n, 1}) || got.CPUs() != n {
			t.Errorf("DefaultTopology(%d) = %v (%d cpus)", n, got, got.CPUs())
		}
	}
}

func TestTopologyIDs(t *testing.T) {
	type ids struct{ socket, core, thread int }
	for _, tc := range []struct {
		t    Topology
		want []ids
	}{
		{Topology{1, 1, 1}, []ids{{0, 0, 0}}},
		{Topology{1, 4, 1}, []ids{{0, 0, 0}, {0, 1, 0}, {0, 2, 0}, {0, 3, 0}}},
		{Topology{4, 1, 1}, []ids{{0, 0, 0}, {1, 0, 0}, {2, 0, 0}, {3, 0, 0}}},
		{Topology{1, 1, 3}, []ids{{0, 0, 0}, {0, 0, 1}, {0, 0, 2}}},
		{Topology{2, 2, 2}, []ids{
			{0, 0, 0}, {0, 0, 1}, {0, 1, 0}, {0, 1, 1},
			{1, 0, 0}, {1, 0, 1}, {1, 1, 0}, {1, 1, 1},
		}},
		{Topology{2, 3, 1}, []ids{{0, 0, 0}, {0, 1, 0}, {0, 2, 0}, {1, 0, 0}, {1, 1, 0}, {1, 2, 0}}},
	} {
		if len(tc.want) != tc.t.CPUs() {
			t.Fatalf("%v: table has %d vCPUs, want %d", tc.t, len(tc.want), tc.t.CPUs())
		}
		for i, w := range tc.want {
			s, c, th := tc.t.IDs(i)
			if (ids{s, c, th}) != w {
				t.Errorf("%v.IDs(%d) = %d, %d, %d; want %v", tc.t, i, s, c, th, w)
			}
		}
	}
}
