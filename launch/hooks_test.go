package launch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// writeScript writes an executable `#!/bin/sh` script to dir.
func writeScript(t *testing.T, dir, name, body string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// hookRun is what a recording hook saw on one run.
type hookRun struct {
	arg0, args, env, cwd, netns string
	state                       map[string]any // the state JSON as read from stdin
	raw                         string
}

// recordingHook writes a hook that appends one tab-separated line to log
// per run: $0, $*, its environment (sorted, without the PWD the shell
// adds), its physical cwd, its network namespace and its stdin.
func recordingHook(t *testing.T, dir, log string) string {
	t.Helper()
	return writeScript(t, dir, "record", fmt.Sprintf(
		`printf '%%s\t%%s\t%%s\t%%s\t%%s\t%%s\n' "$0" "$*" `+
			`"$(/usr/bin/env | /bin/grep -v '^PWD=' | /usr/bin/sort | /usr/bin/paste -sd ' ')" `+
			`"$(pwd -P)" "$(/bin/readlink /proc/self/ns/net)" "$(/bin/cat)" >> %q`, log))
}

// readHookRuns parses the lines recordingHook hooks appended to log.
func readHookRuns(t *testing.T, log string) []hookRun {
	t.Helper()
	data, err := os.ReadFile(log)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var runs []hookRun
	for _, line := range strings.Split(strings.TrimSuffix(string(data), "\n"), "\n") {
		f := strings.Split(line, "\t")
		if len(f) != 6 {
			t.Fatalf("hook log line %q has %d fields", line, len(f))
		}
		r := hookRun{arg0: f[0], args: f[1], env: f[2], cwd: f[3], netns: f[4], raw: f[5]}
		if err := json.Unmarshal([]byte(f[5]), &r.state); err != nil {
			t.Fatalf("hook state %q: %v", f[5], err)
		}
		runs = append(runs, r)
	}
	return runs
}

// hookTags returns the first argument of each run: the hook's tag.
func hookTags(runs []hookRun) []string {
	var tags []string
	for _, r := range runs {
		tag, _, _ := strings.Cut(r.args, " ")
		tags = append(tags, tag)
	}
	return tags
}

// taggedHook is a hook of script that passes tag as its first argument
// and in HOOK_TAG.
func taggedHook(script, tag string) specs.Hook {
	return specs.Hook{Path: script, Args: []string{"hookname", tag, "b"}, Env: []string{"HOOK_TAG=" + tag, "OTHER=x y"}}
}

// ourNetns names the test process's network namespace.
func ourNetns(t *testing.T) string {
	t.Helper()
	return netnsID(t, "/proc/self/ns/net")
}

func TestHooksLifecycle(t *testing.T) {
	for _, tc := range []struct {
		name  string
		netns bool
	}{
		{name: "host netns"},
		{name: "vm netns", netns: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, logs := testLogger(t)
			var nsPath string
			if tc.netns {
				nsPath = testNetns(t)
			}
			dir, bundle := t.TempDir(), t.TempDir()
			log := filepath.Join(dir, "log")
			rec := recordingHook(t, dir, log)
			spec := &specs.Spec{
				Version:     "1.2.0",
				Annotations: map[string]string{"io.example/a": "1"},
				Hooks: &specs.Hooks{
					Prestart:        []specs.Hook{taggedHook(rec, "prestart-0")}, //nolint:staticcheck // still run
					CreateRuntime:   []specs.Hook{taggedHook(rec, "createRuntime-0"), taggedHook(rec, "createRuntime-1")},
					CreateContainer: []specs.Hook{taggedHook(rec, "createContainer-0")},
					StartContainer:  []specs.Hook{taggedHook(rec, "startContainer-0")},
					Poststart:       []specs.Hook{taggedHook(rec, "poststart-0")},
					Poststop:        []specs.Hook{taggedHook(rec, "poststop-0"), taggedHook(rec, "poststop-1")},
				},
			}
			h := newOCIHooks("task1", bundle, spec, nsPath)
			if len(spec.Annotations) != 1 {
				t.Errorf("newOCIHooks changed the spec's annotations: %v", spec.Annotations)
			}
			if !h.any() {
				t.Fatal("any() = false for a spec with hooks")
			}
			if err := h.check(); err != nil {
				t.Fatal(err)
			}
			if err := h.create(ctx); err != nil {
				t.Fatal(err)
			}
			if err := h.run(ctx, phaseStartContainer, specs.StateCreated, 4242); err != nil {
				t.Fatal(err)
			}
			h.runAll(ctx, phasePoststart, specs.StateRunning, 4242)
			h.runAll(ctx, phasePoststop, specs.StateStopped, 0)
			if w := logs.Warnings(); len(w) > 0 {
				t.Errorf("warnings: %q", w)
			}

			runs := readHookRuns(t, log)
			wantTags := []string{"prestart-0", "createRuntime-0", "createRuntime-1", "createContainer-0",
				"startContainer-0", "poststart-0", "poststop-0", "poststop-1"}
			if got := hookTags(runs); !reflect.DeepEqual(got, wantTags) {
				t.Fatalf("hooks ran in order %q, want %q", got, wantTags)
			}
			wantCwd, err := filepath.EvalSymlinks(bundle)
			if err != nil {
				t.Fatal(err)
			}
			wantAnn := map[string]any{"io.example/a": "1"}
			if nsPath != "" {
				wantAnn[netnsAnnotation] = nsPath
			}
			host := ourNetns(t)
			for _, r := range runs {
				tag, _, _ := strings.Cut(r.args, " ")
				phase, _, _ := strings.Cut(tag, "-")
				if r.arg0 != rec {
					t.Errorf("%s: $0 = %q, want the script %q", tag, r.arg0, rec)
				}
				if want := tag + " b"; r.args != want {
					t.Errorf("%s: $* = %q, want %q (Args[0] is argv[0])", tag, r.args, want)
				}
				if want := "HOOK_TAG=" + tag + " OTHER=x y"; r.env != want {
					t.Errorf("%s: environment %q, want exactly %q", tag, r.env, want)
				}
				if r.cwd != wantCwd {
					t.Errorf("%s: cwd %q, want the bundle %q", tag, r.cwd, wantCwd)
				}
				wantNetns := host
				if nsPath != "" && (phase == phaseCreateContainer || phase == phaseStartContainer) {
					wantNetns = netnsID(t, nsPath)
				}
				if r.netns != wantNetns {
					t.Errorf("%s: ran in netns %s, want %s (ours is %s)", tag, r.netns, wantNetns, host)
				}
				checkHookState(t, tag, r, bundle, wantAnn)
			}
		})
	}
}

// checkHookState checks the state a hook of the phase tag names got.
func checkHookState(t *testing.T, tag string, r hookRun, bundle string, wantAnn map[string]any) {
	t.Helper()
	phase, _, _ := strings.Cut(tag, "-")
	status, pid := map[string]string{
		phasePrestart: "creating", phaseCreateRuntime: "creating", phaseCreateContainer: "creating",
		phaseStartContainer: "created", phasePoststart: "running", phasePoststop: "stopped",
	}[phase], 0
	if status == "created" || status == "running" {
		pid = 4242
	}
	st := r.state
	for key, want := range map[string]any{"ociVersion": "1.2.0", "id": "task1", "status": status, "bundle": bundle} {
		if st[key] != want {
			t.Errorf("%s: state %s = %v, want %v (%s)", tag, key, st[key], want, r.raw)
		}
	}
	if got, ok := st["pid"]; pid == 0 && ok {
		t.Errorf("%s: state has pid %v, want none (%s)", tag, got, r.raw)
	} else if pid != 0 && got != float64(pid) {
		t.Errorf("%s: state pid %v, want %d (%s)", tag, got, pid, r.raw)
	}
	if ann, _ := st["annotations"].(map[string]any); !reflect.DeepEqual(ann, wantAnn) {
		t.Errorf("%s: state annotations %v, want %v", tag, st["annotations"], wantAnn)
	}
}

func TestHookArgv(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "log")
	script := writeScript(t, dir, "argv", fmt.Sprintf(
		`printf '%%s|%%s|%%s\n' "$0" "$*" "$(/usr/bin/tr '\0' ' ' < /proc/$$/cmdline)" > %q`, log))
	for _, tc := range []struct {
		name string
		hook specs.Hook
		want string
	}{
		{
			name: "args[0] is not an argument",
			hook: specs.Hook{Path: script, Args: []string{"hookname", "a", "b"}},
			// The kernel runs a script as `interpreter script args[1:]`.
			want: script + "|a b|/bin/sh " + script + " a b ",
		},
		{
			name: "args[0] is argv[0]",
			hook: specs.Hook{Path: "/bin/sh", Args: []string{"hookname", script, "a", "b"}},
			want: script + "|a b|hookname " + script + " a b ",
		},
		{
			name: "no args",
			hook: specs.Hook{Path: script},
			want: script + "||/bin/sh " + script + " ",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, _ := testLogger(t)
			h := newOCIHooks("task1", t.TempDir(), &specs.Spec{Hooks: &specs.Hooks{CreateRuntime: []specs.Hook{tc.hook}}}, "")
			if err := h.run(ctx, phaseCreateRuntime, specs.StateCreating, 0); err != nil {
				t.Fatal(err)
			}
			data, err := os.ReadFile(log)
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.TrimSuffix(string(data), "\n"); got != tc.want {
				t.Errorf("hook saw %q, want %q", got, tc.want)
			}
		})
	}
}

func TestHookErrors(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, body string
		path       string // instead of a script made of body
		want       string // the error after "createRuntime hook #1 (PATH): "
	}{
		{
			name: "exit status and last stderr line",
			body: "echo noise; echo first >&2; echo boom >&2; exit 3",
			want: "exit status 3: boom",
		},
		{name: "stdout is not reported", body: "echo first >&2; echo last words; exit 2", want: "exit status 2: first"},
		{name: "no output", body: "exit 1", want: "exit status 1"},
		{name: "killed", body: "kill -9 $$", want: "signal: killed"},
		{name: "missing", path: filepath.Join(dir, "missing"), want: "fork/exec " + filepath.Join(dir, "missing") + ": no such file or directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, _ := testLogger(t)
			log := filepath.Join(t.TempDir(), "log")
			rec := recordingHook(t, t.TempDir(), log)
			path := tc.path
			if path == "" {
				path = writeScript(t, t.TempDir(), "fail", tc.body)
			}
			spec := &specs.Spec{Hooks: &specs.Hooks{
				CreateRuntime:   []specs.Hook{taggedHook(rec, "ok-0"), {Path: path}, taggedHook(rec, "ok-2")},
				CreateContainer: []specs.Hook{taggedHook(rec, "createContainer-0")},
			}}
			err := newOCIHooks("task1", t.TempDir(), spec, "").create(ctx)
			if err == nil {
				t.Fatal("create succeeded with a failing hook")
			}
			if want := fmt.Sprintf("createRuntime hook #1 (%s): %s", path, tc.want); err.Error() != want {
				t.Errorf("error %q, want %q", err, want)
			}
			if got := hookTags(readHookRuns(t, log)); !reflect.DeepEqual(got, []string{"ok-0"}) {
				t.Errorf("hooks run: %q, want only the one before the failure", got)
			}
		})
	}
}

func TestHooksRunAllGoesOn(t *testing.T) {
	ctx, logs := testLogger(t)
	dir := t.TempDir()
	log := filepath.Join(dir, "log")
	rec := recordingHook(t, dir, log)
	fail := writeScript(t, dir, "fail", "echo boom >&2; exit 3")
	spec := &specs.Spec{Hooks: &specs.Hooks{
		Poststart: []specs.Hook{{Path: fail}, taggedHook(rec, "poststart-1")},
		Poststop:  []specs.Hook{taggedHook(rec, "poststop-0"), {Path: fail}, {Path: fail}, taggedHook(rec, "poststop-3")},
	}}
	h := newOCIHooks("task1", t.TempDir(), spec, "")
	h.runAll(ctx, phasePoststart, specs.StateRunning, 4242)
	h.runAll(ctx, phasePoststop, specs.StateStopped, 0)
	want := []string{"poststart-1", "poststop-0", "poststop-3"}
	if got := hookTags(readHookRuns(t, log)); !reflect.DeepEqual(got, want) {
		t.Errorf("hooks run: %q, want %q", got, want)
	}
	wantLogs := []string{
		fmt.Sprintf("hook failed: poststart hook #0 (%s): exit status 3: boom", fail),
		fmt.Sprintf("hook failed: poststop hook #1 (%s): exit status 3: boom", fail),
		fmt.Sprintf("hook failed: poststop hook #2 (%s): exit status 3: boom", fail),
	}
	if got := logs.Warnings(); !reflect.DeepEqual(got, wantLogs) {
		t.Errorf("warnings %q, want %q", got, wantLogs)
	}
}

// runHookAsync runs one createRuntime hook in the background.
func runHookAsync(t *testing.T, hk specs.Hook) <-chan error {
	t.Helper()
	ctx, _ := testLogger(t)
	h := newOCIHooks("task1", t.TempDir(), &specs.Spec{Hooks: &specs.Hooks{CreateRuntime: []specs.Hook{hk}}}, "")
	done := make(chan error, 1)
	go func() { done <- h.run(ctx, phaseCreateRuntime, specs.StateCreating, 0) }()
	return done
}

// hookDeadline bounds how long a hook test waits for run to return.
const hookDeadline = 20 * time.Second

func TestHookTimeout(t *testing.T) {
	timeout := 1
	path := writeScript(t, t.TempDir(), "sleeper", "exec /bin/sleep 30")
	start := time.Now()
	select {
	case err := <-runHookAsync(t, specs.Hook{Path: path, Timeout: &timeout}):
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "timeout of 1s") {
			t.Errorf("error %v, want one about the timeout of 1s", err)
		}
		// The hook ran for its whole timeout, and no longer than its
		// sleep: the timeout, not the hook, ended it.
		if d := time.Since(start); d < time.Second || d >= 30*time.Second {
			t.Errorf("returned after %v, want between the timeout (1s) and the hook's own end (30s)", d)
		}
	case <-time.After(hookDeadline):
		t.Fatalf("run did not return within %v", hookDeadline)
	}
}

func TestHookLeavesChildHoldingOutput(t *testing.T) {
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "child")
	path := writeScript(t, dir, "daemonizer", fmt.Sprintf("/bin/sleep 30 &\necho $! > %q\necho started >&2\nexit 0", pidFile))
	t.Cleanup(func() {
		if b, err := os.ReadFile(pidFile); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				_ = unix.Kill(pid, unix.SIGKILL)
			}
		}
	})
	start := time.Now()
	select {
	case err := <-runHookAsync(t, specs.Hook{Path: path}):
		// The hook itself succeeded: the child left holding its stderr
		// neither hangs the run nor fails it.
		if err != nil {
			t.Errorf("hook failed: %v", err)
		}
		// It returned with the hook, not with the child (30s).
		if d := time.Since(start); d >= 30*time.Second {
			t.Errorf("returned after %v, once the child holding the output ended", d)
		}
	case <-time.After(hookDeadline):
		t.Fatalf("run did not return within %v", hookDeadline)
	}
}

func TestHooksCheck(t *testing.T) {
	zero, negative, one := 0, -1, 1
	for _, tc := range []struct {
		name  string
		hooks specs.Hooks
		ok    bool
	}{
		{name: "none", ok: true},
		{
			name: "valid",
			hooks: specs.Hooks{
				CreateRuntime: []specs.Hook{{Path: "/bin/true", Timeout: &one}},
				Poststop:      []specs.Hook{{Path: "/bin/true"}},
			},
			ok: true,
		},
		{name: "relative path", hooks: specs.Hooks{Poststop: []specs.Hook{{Path: "/bin/true"}, {Path: "bin/true"}}}},
		{name: "bare name", hooks: specs.Hooks{CreateContainer: []specs.Hook{{Path: "true"}}}},
		{name: "zero timeout", hooks: specs.Hooks{Prestart: []specs.Hook{{Path: "/bin/true", Timeout: &zero}}}}, //nolint:staticcheck // still checked
		{name: "negative timeout", hooks: specs.Hooks{StartContainer: []specs.Hook{{Path: "/bin/true", Timeout: &negative}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := newOCIHooks("task1", "/bundle", &specs.Spec{Hooks: &tc.hooks}, "").check()
			switch {
			case tc.ok && err != nil:
				t.Errorf("check: %v", err)
			case !tc.ok && !errors.Is(err, errdefs.ErrInvalidArgument):
				t.Errorf("check: %v, want an invalid argument", err)
			}
		})
	}
}

func TestHooksAny(t *testing.T) {
	for _, tc := range []struct {
		name string
		spec *specs.Spec
		want bool
	}{
		{name: "no hooks", spec: &specs.Spec{}},
		{name: "empty hooks", spec: &specs.Spec{Hooks: &specs.Hooks{}}},
		{name: "annotations only", spec: &specs.Spec{Annotations: map[string]string{"a": "b"}}},
		{name: "poststop", spec: &specs.Spec{Hooks: &specs.Hooks{Poststop: []specs.Hook{{Path: "/bin/true"}}}}, want: true},
		{name: "prestart", spec: &specs.Spec{Hooks: &specs.Hooks{Prestart: []specs.Hook{{Path: "/bin/true"}}}}, want: true}, //nolint:staticcheck // still run
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := newOCIHooks("task1", "/bundle", tc.spec, "/run/netns/x").any(); got != tc.want {
				t.Errorf("any() = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestHooksNoneRunsNothing(t *testing.T) {
	ctx, _ := testLogger(t)
	h := newOCIHooks("task1", "/nonexistent", &specs.Spec{}, "")
	if err := h.create(ctx); err != nil {
		t.Fatal(err)
	}
	if err := h.run(ctx, phaseStartContainer, specs.StateCreated, 1); err != nil {
		t.Fatal(err)
	}
}

func TestTailBuffer(t *testing.T) {
	for _, tc := range []struct {
		name   string
		limit  int
		writes []string
		want   string
	}{
		{name: "empty", limit: 16},
		{name: "one line", limit: 16, writes: []string{"boom"}, want: "boom"},
		{name: "last of several", limit: 16, writes: []string{"a\nb\n"}, want: "b"},
		{name: "trailing blank lines", limit: 16, writes: []string{"a\n  x  \n\n \n"}, want: "x"},
		{name: "across writes", limit: 16, writes: []string{"first\nse", "cond\n"}, want: "second"},
		{name: "keeps the tail", limit: 4, writes: []string{"hello\nworld"}, want: "orld"},
		{name: "keeps the tail across writes", limit: 6, writes: []string{"abc\n", "defgh\n"}, want: "defgh"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &tailBuffer{limit: tc.limit}
			for _, w := range tc.writes {
				if n, err := b.Write([]byte(w)); n != len(w) || err != nil {
					t.Fatalf("Write(%q) = %d, %v", w, n, err)
				}
			}
			if len(b.buf) > tc.limit {
				t.Errorf("kept %d bytes, limit %d", len(b.buf), tc.limit)
			}
			if got := b.lastLine(); got != tc.want {
				t.Errorf("lastLine() = %q, want %q", got, tc.want)
			}
		})
	}
}
