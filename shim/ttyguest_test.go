package shim

import (
	"bytes"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/vmshim/vmshim/launch"
)

// hostileArgs are arguments no shell may read as anything but text.
var hostileArgs = []string{
	"sh", "-c", "it's \"$HOME\" `id` $(id) ${x:-y} !! ~ * ? [a] & ; | < > #",
	"", " ", "\t", "line1\nline2\n", "\r\n", `\`, `\'`, "'", "''", `'\''`,
	"-e", "--", "\xff\xfe invalid utf-8", "\x1b[6n\x07", "ünïcødé", strings.Repeat("x'", 500),
}

// TestShellWordsInShells runs the quoted words through the shells the
// guests may have, and checks each argument comes back as given.
func TestShellWordsInShells(t *testing.T) {
	words, err := shellWords(hostileArgs)
	if err != nil {
		t.Fatal(err)
	}
	ran := 0
	for _, sh := range [][]string{{"dash"}, {"busybox", "sh"}, {"bash", "--posix"}, {"/bin/sh"}} {
		if _, err := exec.LookPath(sh[0]); err != nil {
			continue
		}
		ran++
		out, err := exec.Command(sh[0], append(sh[1:], "-c", `printf '%s\0' `+words)...).Output()
		if err != nil {
			t.Errorf("%s: %v", sh, err)
			continue
		}
		got := strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00")
		if !slices.Equal(got, hostileArgs) {
			t.Errorf("%s read %q, want %q", sh, got, hostileArgs)
		}
	}
	if ran == 0 {
		t.Skip("no shell found")
	}
}

// TestTTYCommandLine: the program gets the SHELL of its environment back,
// and a NUL anywhere is refused.
func TestTTYCommandLine(t *testing.T) {
	for _, tc := range []struct {
		args, env []string
		want      string
		err       bool
	}{
		{[]string{"sh"}, nil, "unset SHELL; exec 'sh'", false},
		{[]string{"sh", "-l"}, []string{"A=1", "SHELL=/bin/b'ash"}, `SHELL='/bin/b'\''ash'; export SHELL; exec 'sh' '-l'`, false},
		{[]string{"sh", "a\x00"}, nil, "", true},
		{[]string{"sh"}, []string{"SHELL=\x00"}, "", true},
	} {
		got, err := ttyCommandLine(tc.args, tc.env)
		if tc.err {
			if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "NUL") {
				t.Errorf("ttyCommandLine(%q, %q): %v, want a NUL refused", tc.args, tc.env, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ttyCommandLine(%q, %q) = %q, %v; want %q", tc.args, tc.env, got, err, tc.want)
		}
	}
}

func TestTTYEnv(t *testing.T) {
	for _, tc := range []struct{ env, want []string }{
		{nil, nil},
		{[]string{"PATH=/bin"}, []string{"PATH=/bin", "TERM=xterm"}},
		{[]string{"TERM=vt100"}, []string{"TERM=vt100"}},
	} {
		if got := ttyEnv(tc.env); !slices.Equal(got, tc.want) {
			t.Errorf("ttyEnv(%q) = %q, want %q", tc.env, got, tc.want)
		}
	}
}

// TestTTYStartError: what the terminal program said, or its exit code,
// becomes one printable line.
func TestTTYStartError(t *testing.T) {
	for _, tc := range []struct {
		st   launch.GuestExecStatus
		want string
	}{
		{launch.GuestExecStatus{ExitCode: ttyNoScript}, "no util-linux script"},
		{launch.GuestExecStatus{ExitCode: ttyNoPort}, "no virtio-serial port"},
		{launch.GuestExecStatus{ExitCode: 2}, "status 2"},
		{launch.GuestExecStatus{ExitCode: 127, Stderr: []byte("sh: \x1b[31mscript\x1b[0m:\nnot found\n")}, "sh: [31mscript [0m: not found"},
		{launch.GuestExecStatus{ExitCode: 1, Stderr: bytes.Repeat([]byte("é"), 300)}, strings.Repeat("é", maxMessage) + "..."},
	} {
		err := ttyStartError(tc.st)
		if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), tc.want) || strings.ContainsAny(err.Error(), "\n\x1b") {
			t.Errorf("ttyStartError(%+v) = %q, want one line with %q", tc.st, err, tc.want)
		}
	}
}
