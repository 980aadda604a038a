package pause

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

func TestParseID(t *testing.T) {
	for in, want := range map[string]uint32{"70000": 70000, "1": 1, "2147483647": 2147483647} {
		if got, err := parseID(in); err != nil || got != want {
			t.Errorf("parseID(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "0", "-1", "abc", "2147483648", " 70000", "70000x"} {
		if got, err := parseID(in); err == nil {
			t.Errorf("parseID(%q) = %d, want an error", in, got)
		}
	}
}

// TestRunRefuses checks that a pause process told no id, or root's,
// exits at once with a one-line error rather than waiting as root.
func TestRunRefuses(t *testing.T) {
	if os.Getenv("VMSHIM_PAUSE_TEST") == "1" {
		os.Exit(Run(os.Args[1:]))
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, env := range [][]string{nil, {IDEnv + "=0"}, {IDEnv + "=nobody"}} {
		cmd := exec.Command(self, "-test.run=^TestRunRefuses$")
		cmd.Env = append([]string{"VMSHIM_PAUSE_TEST=1"}, env...)
		out, err := cmd.CombinedOutput()
		msg := strings.TrimSpace(string(out))
		if err == nil || strings.Contains(msg, "\n") || !strings.HasPrefix(msg, Name+": drop privileges: "+IDEnv+"=") {
			t.Errorf("env %q: %v, output %q; want exit 1 with one line naming %s", env, err, out, IDEnv)
		}
	}
	if got := Env(70000); len(got) != 1 || got[0] != IDEnv+"=70000" {
		t.Errorf("Env(70000) = %q", got)
	}
}
