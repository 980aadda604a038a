package topology

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

// sysfs is a fake sysfs tree: file paths below the root, and their text.
// A path ending in "/" is an empty directory.
type sysfs map[string]string

// Fake hosts.
var (
	oneNode = sysfs{
		"devices/system/node/node0/cpulist": "0-3\n",
		"devices/system/node/online":        "0\n",
		"devices/system/node/possible":      "0\n",
		"devices/system/node/has_cpu":       "0\n",
		"devices/system/node/power/":        "",
		"devices/system/cpu/online":         "0-3\n",
	}
	twoNodes = sysfs{
		"devices/system/node/node0/cpulist": "0-3\n",
		"devices/system/node/node1/cpulist": "4-7\n",
		"devices/system/node/online":        "0-1\n",
		"devices/system/cpu/online":         "0-7\n",
	}
	threeNodes = sysfs{
		"devices/system/node/node0/cpulist": "0-1\n",
		"devices/system/node/node1/cpulist": "2-3\n",
		"devices/system/node/node2/cpulist": "4-5\n",
	}
	noNUMA = sysfs{
		"devices/system/cpu/online":   "0-1\n",
		"devices/system/cpu/cpu0/":    "",
		"devices/system/cpu/possible": "0-3\n",
	}
)

// tree writes files under a new temporary directory and returns it.
func tree(t *testing.T, files sysfs) string {
	t.Helper()
	root := t.TempDir()
	for name, text := range files {
		p := filepath.Join(root, name)
		if strings.HasSuffix(name, "/") {
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestReadHostNodes(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files sysfs
		want  []HostNode
		err   string // part of the error, after the root
		kind  func(error) bool
	}{
		{name: "one node", files: oneNode, want: []HostNode{{0, CPUSet{0, 1, 2, 3}}}},
		{name: "two nodes", files: twoNodes, want: []HostNode{{0, CPUSet{0, 1, 2, 3}}, {1, CPUSet{4, 5, 6, 7}}}},
		{name: "numeric order", files: sysfs{
			"devices/system/node/node10/cpulist": "10\n",
			"devices/system/node/node2/cpulist":  "2\n",
			"devices/system/node/node1/cpulist":  "1\n",
		}, want: []HostNode{{1, CPUSet{1}}, {2, CPUSet{2}}, {10, CPUSet{10}}}},
		{name: "memory only node", files: sysfs{
			"devices/system/node/node0/cpulist": "0-1\n",
			"devices/system/node/node1/cpulist": "\n",
		}, want: []HostNode{{0, CPUSet{0, 1}}, {1, CPUSet{}}}},
		{name: "odd names ignored", files: sysfs{
			"devices/system/node/node0/cpulist":  "0\n",
			"devices/system/node/node01/cpulist": "garbage",
			"devices/system/node/nodex/cpulist":  "garbage",
			"devices/system/node/node/cpulist":   "garbage",
		}, want: []HostNode{{0, CPUSet{0}}}},
		{name: "no numa", files: noNUMA, want: []HostNode{{0, CPUSet{0, 1}}}},
		{name: "no node in node dir", files: sysfs{
			"devices/system/node/online": "\n",
			"devices/system/cpu/online":  "0\n",
		}, want: []HostNode{{0, CPUSet{0}}}},
		{name: "node without cpulist", files: sysfs{
			"devices/system/node/node0/": "",
		}, err: "devices/system/node/node0/cpulist: no such file or directory", kind: func(err error) bool { return errors.Is(err, os.ErrNotExist) }},
		{name: "bad cpulist", files: sysfs{
			"devices/system/node/node0/cpulist": "0-3\n",
			"devices/system/node/node1/cpulist": "7-4\n",
		}, err: `devices/system/node/node1/cpulist: cpu list "7-4\n": range 7-4 is reversed`, kind: errdefs.IsFailedPrecondition},
		{name: "no cpu online", files: sysfs{
			"devices/system/cpu/": "",
		}, err: "devices/system/cpu/online: no such file or directory", kind: func(err error) bool { return errors.Is(err, os.ErrNotExist) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := tree(t, tc.files)
			got, err := ReadHostNodes(root)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), root+"/"+tc.err) || !tc.kind(err) || strings.Contains(err.Error(), "\n") {
					t.Fatalf("ReadHostNodes = %v, %v; want an error with %q", got, err, tc.err)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("ReadHostNodes = %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

func TestPlan(t *testing.T) {
	for _, tc := range []struct {
		name     string
		host     sysfs
		cpus     string
		mems     string
		maxVCPUs int
		memMiB   int
		want     Layout
		err      string
	}{
		{name: "no cpuset", host: twoNodes, maxVCPUs: 4, memMiB: 1024, want: Layout{}},
		{name: "one node", host: oneNode, cpus: "0-3", maxVCPUs: 2, memMiB: 1024,
			want: Layout{Pin: []int{0, 1}}},
		{name: "one node, vcpus share cpus", host: oneNode, cpus: "1-2", mems: "0", maxVCPUs: 5, memMiB: 1,
			want: Layout{Pin: []int{1, 2, 1, 2, 1}}},
		{name: "no numa", host: noNUMA, cpus: "0-1", maxVCPUs: 2, memMiB: 512,
			want: Layout{Pin: []int{0, 1}}},
		{name: "two nodes, 4 vcpus", host: twoNodes, cpus: "2-5", maxVCPUs: 4, memMiB: 4096,
			want: Layout{Pin: []int{2, 3, 4, 5}, Nodes: []GuestNode{
				{HostNode: 0, VCPUs: []int{0, 1}, MemMiB: 2048},
				{HostNode: 1, VCPUs: []int{2, 3}, MemMiB: 2048},
			}}},
		{name: "two nodes, 8 vcpus", host: twoNodes, cpus: "2-5", mems: "0-1", maxVCPUs: 8, memMiB: 4096,
			want: Layout{Pin: []int{2, 3, 4, 5, 2, 3, 4, 5}, Nodes: []GuestNode{
				{HostNode: 0, VCPUs: []int{0, 1, 4, 5}, MemMiB: 2048},
				{HostNode: 1, VCPUs: []int{2, 3, 6, 7}, MemMiB: 2048},
			}}},
		{name: "two nodes, 2 vcpus in one", host: twoNodes, cpus: "2-5", mems: "0", maxVCPUs: 2, memMiB: 4096,
			want: Layout{Pin: []int{2, 3}}},
		{name: "uneven split", host: twoNodes, cpus: "2-5", maxVCPUs: 3, memMiB: 1000,
			// 1000·2/3 = 666; 1000·1/3 = 333 → 332; 2 left go to the first.
			want: Layout{Pin: []int{2, 3, 4}, Nodes: []GuestNode{
				{HostNode: 0, VCPUs: []int{0, 1}, MemMiB: 668},
				{HostNode: 1, VCPUs: []int{2}, MemMiB: 332},
			}}},
		{name: "odd memory", host: twoNodes, cpus: "2-5", maxVCPUs: 3, memMiB: 1001,
			// 667 → 666; 333 → 332; 3 left.
			want: Layout{Pin: []int{2, 3, 4}, Nodes: []GuestNode{
				{HostNode: 0, VCPUs: []int{0, 1}, MemMiB: 669},
				{HostNode: 1, VCPUs: []int{2}, MemMiB: 332},
			}}},
		{name: "three nodes", host: threeNodes, cpus: "1-4", maxVCPUs: 4, memMiB: 10,
			// 10/4 = 2; 10·2/4 = 5 → 4; 2; 2 left.
			want: Layout{Pin: []int{1, 2, 3, 4}, Nodes: []GuestNode{
				{HostNode: 0, VCPUs: []int{0}, MemMiB: 4},
				{HostNode: 1, VCPUs: []int{1, 2}, MemMiB: 4},
				{HostNode: 2, VCPUs: []int{3}, MemMiB: 2},
			}}},
		{name: "least memory", host: twoNodes, cpus: "3-4", maxVCPUs: 2, memMiB: 4,
			want: Layout{Pin: []int{3, 4}, Nodes: []GuestNode{
				{HostNode: 0, VCPUs: []int{0}, MemMiB: 2},
				{HostNode: 1, VCPUs: []int{1}, MemMiB: 2},
			}}},
		{name: "too little memory", host: twoNodes, cpus: "3-4", maxVCPUs: 2, memMiB: 3,
			err: "3 MiB of memory is too little for 2 guest numa nodes: the one on host node 1 would get 0 MiB, less than 2"},
		{name: "mems refuse", host: sysfs{
			"devices/system/node/node0/cpulist": "0-1\n",
			"devices/system/node/node1/cpulist": "2-3\n",
		}, cpus: "0-3", mems: "0", maxVCPUs: 4, memMiB: 1024,
			err: "cpuset cpus 0-3 use host node 1, which cpuset mems 0 does not allow"},
		{name: "mems leave one node to the cgroup", host: twoNodes, cpus: "4-5", mems: "0", maxVCPUs: 2, memMiB: 1024,
			want: Layout{Pin: []int{4, 5}}},
		{name: "cpu in no node", host: twoNodes, cpus: "6-9", maxVCPUs: 1, memMiB: 1024,
			err: "cpuset cpus 6-9: cpu 8 is in no host node"},
		{name: "cpu in no node, no numa", host: noNUMA, cpus: "1-2", maxVCPUs: 1, memMiB: 1024,
			err: "cpuset cpus 1-2: cpu 2 is in no host node"},
		{name: "no vcpus", host: oneNode, cpus: "0", maxVCPUs: 0, memMiB: 1024,
			err: "0 vCPUs: not in 1-1024"},
		{name: "too many vcpus", host: oneNode, cpus: "0", maxVCPUs: 1025, memMiB: 1024,
			err: "1025 vCPUs: not in 1-1024"},
		{name: "negative memory", host: oneNode, cpus: "0", maxVCPUs: 1, memMiB: -1,
			err: "-1 MiB of memory: negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hosts, err := ReadHostNodes(tree(t, tc.host))
			if err != nil {
				t.Fatal(err)
			}
			cpus, mems := mustParse(t, tc.cpus), mustParse(t, tc.mems)
			got, err := Plan(cpus, mems, tc.maxVCPUs, tc.memMiB, hosts)
			if tc.err != "" {
				if err == nil || err.Error() != tc.err || !errdefs.IsInvalidArgument(err) {
					t.Fatalf("Plan = %+v, %v; want invalid argument %q", got, err, tc.err)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("Plan = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

// TestPlanHosts checks host lists that ReadHostNodes never returns.
func TestPlanHosts(t *testing.T) {
	for _, tc := range []struct {
		name  string
		hosts []HostNode
		want  Layout
		err   string
	}{
		{name: "unsorted", hosts: []HostNode{{1, CPUSet{1}}, {0, CPUSet{0}}},
			want: Layout{Pin: []int{0, 1}, Nodes: []GuestNode{
				{HostNode: 0, VCPUs: []int{0}, MemMiB: 512},
				{HostNode: 1, VCPUs: []int{1}, MemMiB: 512},
			}}},
		{name: "node twice", hosts: []HostNode{{0, CPUSet{0}}, {0, CPUSet{1}}}, err: "host node 0 listed twice"},
		{name: "cpu twice", hosts: []HostNode{{0, CPUSet{0, 1}}, {1, CPUSet{1}}}, err: "host cpu 1 is in host nodes 0 and 1"},
		{name: "none", err: "cpuset cpus 0-1: cpu 0 is in no host node"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Plan(CPUSet{0, 1}, nil, 2, 1024, tc.hosts)
			if tc.err != "" {
				if err == nil || err.Error() != tc.err {
					t.Fatalf("Plan = %+v, %v; want %q", got, err, tc.err)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("Plan = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

// TestPlanHugeMemory checks that a split of a very large size neither
// overflows nor loses memory.
func TestPlanHugeMemory(t *testing.T) {
	hosts := []HostNode{{0, CPUSet{0}}, {1, CPUSet{1}}, {2, CPUSet{2}}}
	mem := math.MaxInt - 1
	got, err := Plan(CPUSet{0, 1, 2}, nil, 1024, mem, hosts)
	if err != nil {
		t.Fatal(err)
	}
	sum := 0
	for _, g := range got.Nodes {
		if g.MemMiB <= 0 {
			t.Fatalf("node %+v", g.HostNode)
		}
		sum += g.MemMiB
	}
	if sum != mem || len(got.Nodes) != 3 {
		t.Fatalf("%d nodes hold %d MiB, want %d", len(got.Nodes), sum, mem)
	}
}

// mustParse parses a cpu list the test table holds.
func mustParse(t *testing.T, s string) CPUSet {
	t.Helper()
	set, err := ParseCPUSet(s)
	if err != nil {
		t.Fatal(err)
	}
	return set
}
