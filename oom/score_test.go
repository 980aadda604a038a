package oom

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestSetScoreAdj checks that an oom_score_adj reaches the
// process, and that none leaves it as it was.
func TestSetScoreAdj(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	path := fmt.Sprintf("/proc/%d/oom_score_adj", cmd.Process.Pid)
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := SetScoreAdj(cmd.Process.Pid, nil); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(path); string(got) != string(before) {
		t.Errorf("oom_score_adj %q without one in the spec, was %q", got, before)
	}
	adj := 937
	if err := SetScoreAdj(cmd.Process.Pid, &adj); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(path); strings.TrimSpace(string(got)) != "937" {
		t.Errorf("oom_score_adj %q, want 937", got)
	}
	if err := SetScoreAdj(1<<22+1, &adj); err == nil || strings.Contains(err.Error(), "\n") {
		t.Errorf("a process that is gone: %v", err)
	}
}

func TestRaiseScoreAdj(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	pid := cmd.Process.Pid
	file := fmt.Sprintf("/proc/%d/oom_score_adj", pid)
	if err := os.WriteFile(file, []byte("100"), 0); err != nil {
		t.Fatal(err)
	}
	adj := func(v int) *int { return &v }
	for _, tc := range []struct {
		spec *int
		want string
	}{
		{spec: nil, want: "100"},
		{spec: adj(-998), want: "100"}, // never lowered
		{spec: adj(100), want: "100"},
		{spec: adj(999), want: "999"},
		{spec: adj(500), want: "999"},
	} {
		if err := RaiseScoreAdj(pid, tc.spec); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(file)
		if err != nil || strings.TrimSpace(string(b)) != tc.want {
			t.Fatalf("oom_score_adj %q, %v; want %s", b, err, tc.want)
		}
	}
	if err := RaiseScoreAdj(1<<22+1, adj(1)); err == nil || strings.Contains(err.Error(), "\n") {
		t.Errorf("missing process: %v", err)
	}
}
