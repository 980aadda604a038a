package deploy

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// fakeNode is a node for install.sh: its directories live under a temp
// HOST_ROOT, and the commands the script runs on the node through nsenter
// (systemctl, apt-get, containerd, QEMU) are fakes that log their calls.
type fakeNode struct {
	t         *testing.T
	sh        string
	dir       string
	hostRoot  string // HOST_ROOT: /etc/containerd, /etc/vmshim, /usr/local/bin
	hostBin   string // the node's PATH inside nsenter
	configDir string // the ConfigMap
	shimSrc   string // the shim binary in the installer image
	osRelease string
	log       string   // one line per fake command call
	env       []string // extra environment for the next runs
}

// fakeCommands are the fakes in hostBin; $FAKE_LOG collects their calls.
// They run with the node's PATH (hostBin) and restore the test's.
var fakeCommands = map[string]string{
	"systemctl": `echo "systemctl $*" >>"$FAKE_LOG"
case $1 in show) echo "${FAKE_CONTAINERD_PID:-0}" ;; esac`,
	"apt-get": `echo "apt-get $*" >>"$FAKE_LOG"
[ -z "${FAKE_APT_FAIL:-}" ] || exit 100
case $1 in install)
	for f in qemu-system-x86_64 qemu-img; do printf '#!/bin/sh\n' >"$FAKE_HOSTBIN/$f"; chmod 755 "$FAKE_HOSTBIN/$f"; done ;;
esac`,
	"containerd": `echo "containerd $*" >>"$FAKE_LOG"
[ -n "${FAKE_DUMP_IGNORES_DROPIN:-}" ] || cat "$FAKE_HOST/etc/containerd/conf.d/vmshim.toml" 2>/dev/null || true`,
}

// newFakeNode makes a Debian node without QEMU, whose containerd imports
// conf.d/*.toml and has no vmshim yet.
func newFakeNode(t *testing.T) *fakeNode {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("install.sh reads /proc/PID/cmdline: Linux only")
	}
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh to run install.sh")
	}
	dir := t.TempDir()
	n := &fakeNode{
		t: t, sh: sh, dir: dir,
		hostRoot:  filepath.Join(dir, "host"),
		hostBin:   filepath.Join(dir, "hostbin"),
		configDir: filepath.Join(dir, "configmap"),
		shimSrc:   filepath.Join(dir, "image", "containerd-shim-vm-v2"),
		osRelease: filepath.Join(dir, "os-release"),
		log:       filepath.Join(dir, "calls.log"),
	}
	for _, d := range []string{"etc/containerd", "etc/vmshim", "usr/local/bin"} {
		n.mkdir(filepath.Join(n.hostRoot, d))
	}
	n.mkdir(n.hostBin)
	n.mkdir(n.configDir)
	n.mkdir(filepath.Join(dir, "bin"))
	n.mkdir(filepath.Dir(n.shimSrc))

	cm := installerConfigMap(t, manifests(t))
	for k, v := range cm.Data {
		n.write(filepath.Join(n.configDir, k), v, 0o644)
	}
	n.write(n.shimSrc, "shim v1", 0o755)
	n.write(filepath.Join(filepath.Dir(n.shimSrc), "vmshim-pause"), "pause v1", 0o755)
	n.write(n.osRelease, "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nID=debian\n", 0o644)
	n.write(filepath.Join(n.hostRoot, "etc/containerd/config.toml"),
		"version = 3\nimports = [\"/etc/containerd/conf.d/*.toml\"]\n\n[plugins]\n", 0o644)

	n.write(filepath.Join(dir, "bin", "nsenter"), "#!"+sh+`
while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do shift; done
shift
PATH=$FAKE_HOSTBIN exec "$@"
`, 0o755)
	for name, body := range fakeCommands {
		n.write(filepath.Join(n.hostBin, name), "#!"+sh+"\nPATH=$FAKE_PATH\n"+body+"\n", 0o755)
	}
	for _, tool := range []string{"sh", "cat"} {
		p, err := exec.LookPath(tool)
		if err != nil {
			t.Skipf("no %s: %v", tool, err)
		}
		if err := os.Symlink(p, filepath.Join(n.hostBin, tool)); err != nil {
			t.Fatal(err)
		}
	}
	// containerd's MainPID: any live process without --config will do.
	n.env = []string{"FAKE_CONTAINERD_PID=" + strconv.Itoa(os.Getpid())}
	return n
}

func (n *fakeNode) mkdir(p string) {
	n.t.Helper()
	if err := os.MkdirAll(p, 0o755); err != nil {
		n.t.Fatal(err)
	}
}

func (n *fakeNode) write(p, body string, mode os.FileMode) {
	n.t.Helper()
	if err := os.WriteFile(p, []byte(body), mode); err != nil {
		n.t.Fatal(err)
	}
}

// read returns a node file's content, "" when it does not exist.
func (n *fakeNode) read(nodePath string) string {
	n.t.Helper()
	b, err := os.ReadFile(filepath.Join(n.hostRoot, nodePath))
	if os.IsNotExist(err) {
		return ""
	}
	if err != nil {
		n.t.Fatal(err)
	}
	return string(b)
}

// run runs install.sh and returns its output and the fake calls it made.
func (n *fakeNode) run() (out string, calls []string, err error) {
	n.t.Helper()
	_ = os.Remove(n.log)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, n.sh, filepath.Join(n.configDir, keyScript))
	cmd.Env = append([]string{
		"PATH=" + filepath.Join(n.dir, "bin") + string(os.PathListSeparator) + os.Getenv("PATH"),
		"HOST_ROOT=" + n.hostRoot,
		"CONFIG_DIR=" + n.configDir,
		"SHIM_SRC=" + n.shimSrc,
		"OS_RELEASE=" + n.osRelease,
		"FAKE_HOST=" + n.hostRoot,
		"FAKE_HOSTBIN=" + n.hostBin,
		"FAKE_LOG=" + n.log,
		"FAKE_PATH=" + os.Getenv("PATH"),
	}, n.env...)
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	err = cmd.Run()
	if b, rerr := os.ReadFile(n.log); rerr == nil {
		calls = strings.Split(strings.TrimSpace(string(b)), "\n")
	}
	return buf.String(), calls, err
}

// count returns how many calls start with prefix.
func count(calls []string, prefix string) int {
	c := 0
	for _, l := range calls {
		if strings.HasPrefix(l, prefix) {
			c++
		}
	}
	return c
}

func TestInstallFreshNodeThenIdempotent(t *testing.T) {
	n := newFakeNode(t)
	out, calls, err := n.run()
	if err != nil {
		t.Fatalf("install.sh: %v\n%s", err, out)
	}
	if count(calls, "apt-get install -y --no-install-recommends qemu-system-x86 qemu-utils") != 1 {
		t.Errorf("QEMU not installed with apt-get; calls:\n%s", strings.Join(calls, "\n"))
	}
	if count(calls, "systemctl restart containerd") != 1 {
		t.Errorf("containerd restarted %d times, want 1; calls:\n%s", count(calls, "systemctl restart"), strings.Join(calls, "\n"))
	}
	cm := installerConfigMap(t, manifests(t))
	if got := n.read("usr/local/bin/vmshim-pause"); got != "pause v1" {
		t.Errorf("installed pause program = %q", got)
	}
	if got := n.read("usr/local/bin/containerd-shim-vm-v2"); got != "shim v1" {
		t.Errorf("shim = %q, want the image's", got)
	}
	if fi, err := os.Stat(filepath.Join(n.hostRoot, "usr/local/bin/containerd-shim-vm-v2")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("shim mode: %v %v, want 0755", fi, err)
	}
	if got := n.read("etc/vmshim/config.toml"); got != cm.Data[keyConfig] {
		t.Errorf("config.toml = %q, want the ConfigMap's", got)
	}
	if got := n.read("etc/containerd/conf.d/vmshim.toml"); got != cm.Data[keyDropin] {
		t.Errorf("drop-in = %q, want the ConfigMap's", got)
	}
	if n.read("etc/vmshim/.containerd-restart-pending") != "" || fileExists(filepath.Join(n.hostRoot, "etc/vmshim/.containerd-restart-pending")) {
		t.Error("restart marker left behind after the restart")
	}

	out, calls, err = n.run()
	if err != nil {
		t.Fatalf("second install.sh: %v\n%s", err, out)
	}
	if count(calls, "apt-get") != 0 || count(calls, "systemctl restart") != 0 {
		t.Errorf("second run installed or restarted something; calls:\n%s", strings.Join(calls, "\n"))
	}
	if !strings.Contains(out, "is up to date") {
		t.Errorf("second run output:\n%s", out)
	}
}

func TestInstallKeepsNodeConfigAndUpdatesShim(t *testing.T) {
	n := newFakeNode(t)
	n.write(filepath.Join(n.hostRoot, "etc/vmshim/config.toml"), "accel = \"tcg\"\n", 0o644)
	if out, _, err := n.run(); err != nil {
		t.Fatalf("install.sh: %v\n%s", err, out)
	}
	if got := n.read("etc/vmshim/config.toml"); got != "accel = \"tcg\"\n" {
		t.Errorf("the node's config.toml was replaced by %q", got)
	}
	n.write(n.shimSrc, "shim v2", 0o755)
	out, calls, err := n.run()
	if err != nil {
		t.Fatalf("install.sh: %v\n%s", err, out)
	}
	if got := n.read("usr/local/bin/containerd-shim-vm-v2"); got != "shim v2" {
		t.Errorf("shim = %q after an image update, want shim v2", got)
	}
	if count(calls, "systemctl restart") != 0 {
		t.Errorf("a new shim binary restarted containerd; calls:\n%s", strings.Join(calls, "\n"))
	}
}

func TestInstallRestartsAfterInterruptedRun(t *testing.T) {
	n := newFakeNode(t)
	if out, _, err := n.run(); err != nil {
		t.Fatalf("install.sh: %v\n%s", err, out)
	}
	// A run that wrote the drop-in and died before the restart.
	n.write(filepath.Join(n.hostRoot, "etc/vmshim/.containerd-restart-pending"), "", 0o644)
	out, calls, err := n.run()
	if err != nil {
		t.Fatalf("install.sh: %v\n%s", err, out)
	}
	if count(calls, "systemctl restart containerd") != 1 {
		t.Errorf("the owed restart did not happen; calls:\n%s", strings.Join(calls, "\n"))
	}
}

func TestInstallImports(t *testing.T) {
	tests := []struct {
		name, main string
		ok         bool
	}{
		{"absolute glob", "imports = [\"/etc/containerd/conf.d/*.toml\"]\n", true},
		{"relative glob, single quotes", "version = 2\nimports = ['conf.d/*.toml']\n", true},
		{"the file itself, multi-line", "imports = [\n  \"/etc/other.toml\", # other\n  \"/etc/containerd/conf.d/vmshim.toml\",\n]\n", true},
		{"no imports", "version = 3\n[plugins]\n", false},
		{"commented out", "# imports = [\"/etc/containerd/conf.d/*.toml\"]\n", false},
		{"other directory", "imports = [\"/etc/containerd/runtimes/*.toml\"]\n", false},
		{"not top level", "version = 3\n[plugins.x]\nimports = [\"/etc/containerd/conf.d/*.toml\"]\n", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := newFakeNode(t)
			n.write(filepath.Join(n.hostRoot, "etc/containerd/config.toml"), tc.main, 0o644)
			out, calls, err := n.run()
			if tc.ok {
				if err != nil {
					t.Fatalf("install.sh refused:\n%s\n%s", tc.main, out)
				}
				return
			}
			if err == nil {
				t.Fatalf("install.sh accepted a config that does not import the drop-in:\n%s", tc.main)
			}
			if !strings.Contains(out, "does not import /etc/containerd/conf.d/vmshim.toml") {
				t.Errorf("unclear message:\n%s", out)
			}
			assertUntouched(t, n, calls)
		})
	}
}

// assertUntouched fails if a refused run changed the node.
func assertUntouched(t *testing.T, n *fakeNode, calls []string) {
	t.Helper()
	for _, p := range []string{"usr/local/bin/containerd-shim-vm-v2", "etc/vmshim/config.toml", "etc/containerd/conf.d"} {
		if fileExists(filepath.Join(n.hostRoot, p)) {
			t.Errorf("a refused run created %s", p)
		}
	}
	if count(calls, "apt-get") != 0 || count(calls, "systemctl restart") != 0 {
		t.Errorf("a refused run installed or restarted something; calls:\n%s", strings.Join(calls, "\n"))
	}
}

func TestInstallRefuses(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T, n *fakeNode)
		want  string
	}{
		{"no containerd config", func(t *testing.T, n *fakeNode) {
			if err := os.Remove(filepath.Join(n.hostRoot, "etc/containerd/config.toml")); err != nil {
				t.Fatal(err)
			}
		}, "/etc/containerd/config.toml does not exist"},
		{"containerd not a running unit", func(t *testing.T, n *fakeNode) {
			n.env = []string{"FAKE_CONTAINERD_PID=0"}
		}, "no running systemd unit containerd"},
		{"containerd with another config", func(t *testing.T, n *fakeNode) {
			n.env = []string{"FAKE_CONTAINERD_PID=" + strconv.Itoa(startWithArgs(t, "containerd", "--config", "/opt/k/config.toml"))}
		}, "containerd runs with --config /opt/k/config.toml"},
		{"not Debian without QEMU", func(t *testing.T, n *fakeNode) {
			n.write(n.osRelease, "ID=\"fedora\"\n", 0o644)
		}, "not Debian or Ubuntu"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := newFakeNode(t)
			tc.setup(t, n)
			out, calls, err := n.run()
			if err == nil {
				t.Fatalf("install.sh succeeded:\n%s", out)
			}
			if !strings.Contains(out, tc.want) {
				t.Errorf("output lacks %q:\n%s", tc.want, out)
			}
			assertUntouched(t, n, calls)
		})
	}
}

func TestInstallFailures(t *testing.T) {
	t.Run("apt-get fails", func(t *testing.T) {
		n := newFakeNode(t)
		n.env = append(n.env, "FAKE_APT_FAIL=1")
		out, calls, err := n.run()
		if err == nil || !strings.Contains(out, "apt-get update failed") {
			t.Fatalf("install.sh: %v\n%s", err, out)
		}
		if count(calls, "apt-get update") != 1 {
			t.Errorf("no apt-get update before giving up; calls:\n%s", strings.Join(calls, "\n"))
		}
	})
	t.Run("containerd ignores the drop-in", func(t *testing.T) {
		n := newFakeNode(t)
		n.env = append(n.env, "FAKE_DUMP_IGNORES_DROPIN=1")
		out, calls, err := n.run()
		if err == nil || !strings.Contains(out, "containerd config dump does not show the runtime vm") {
			t.Fatalf("install.sh: %v\n%s", err, out)
		}
		if count(calls, "systemctl restart") != 0 {
			t.Errorf("restarted containerd with a drop-in it ignores; calls:\n%s", strings.Join(calls, "\n"))
		}
	})
}

// startWithArgs starts a long-running process whose command line is
// "sh .../name args..." and returns its pid.
func startWithArgs(t *testing.T, name string, args ...string) int {
	t.Helper()
	script := filepath.Join(t.TempDir(), name)
	// "; :" keeps sh from exec'ing sleep, which would replace the command line.
	if err := os.WriteFile(script, []byte("sleep 30; :\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sh", append([]string{script}, args...)...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd.Process.Pid
}

func fileExists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

// TestDropinLoadsInContainerd asks a real containerd what it makes of the
// drop-in, when $VMSHIM_CONTAINERD names a directory holding one.
func TestDropinLoadsInContainerd(t *testing.T) {
	dir := os.Getenv("VMSHIM_CONTAINERD")
	if dir == "" {
		t.Skip("VMSHIM_CONTAINERD (a directory with a containerd 2.x binary) is not set")
	}
	bin := filepath.Join(dir, "containerd")
	tmp := t.TempDir()
	confd := filepath.Join(tmp, "conf.d")
	if err := os.Mkdir(confd, 0o755); err != nil {
		t.Fatal(err)
	}
	dropin := installerConfigMap(t, manifests(t)).Data[keyDropin]
	if err := os.WriteFile(filepath.Join(confd, "vmshim.toml"), []byte(dropin), 0o644); err != nil {
		t.Fatal(err)
	}
	mains := map[string]string{
		"version 2 with runc": "version = 2\nimports = [\"conf.d/*.toml\"]\n" +
			"[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n  runtime_type = \"io.containerd.runc.v2\"\n",
		"version 3": "version = 3\nimports = [\"" + confd + "/*.toml\"]\n",
	}
	for name, body := range mains {
		t.Run(name, func(t *testing.T) {
			main := filepath.Join(tmp, strings.ReplaceAll(name, " ", "-")+".toml")
			if err := os.WriteFile(main, []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command(bin, "--config", main, "config", "dump").Output()
			if err != nil {
				t.Fatalf("containerd config dump: %v", err)
			}
			for _, want := range []string{
				"[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.vm]",
				"runtime_type = 'io.containerd.vm.v2'",
				"pod_annotations = ['vmshim.io/*']",
				"container_annotations = ['vmshim.io/*', 'io.kubernetes.pod.terminationGracePeriod']",
			} {
				if !strings.Contains(string(out), want) {
					t.Errorf("merged config lacks %s", want)
				}
			}
			if strings.Contains(body, "runc") && !strings.Contains(string(out), "runtimes.runc]") {
				t.Error("the drop-in replaced the main config's runtimes instead of adding to them")
			}
			if t.Failed() {
				t.Logf("containerd config dump:\n%s", out)
			}
		})
	}
}

// The ConfigMap's ksm turns the node's KSM on or off, or leaves it.
func TestInstallKSM(t *testing.T) {
	for _, tc := range []struct {
		name, ksm, before string // before "": the node's kernel has no KSM
		after, wantOut    string
		wantErr           bool
	}{
		{name: "keep", ksm: "keep", before: "0", after: "0"},
		{name: "no key", ksm: "", before: "1", after: "1"},
		{name: "on", ksm: "on", before: "0", after: "1", wantOut: "turned KSM on"},
		{name: "already on", ksm: "on\n", before: "1", after: "1", wantOut: "KSM is already on"},
		{name: "off", ksm: "off", before: "1", after: "2", wantOut: "turned KSM off"},
		{name: "off, never on", ksm: "off", before: "0", after: "0", wantOut: "KSM is already off"},
		{name: "bad value", ksm: "yes", before: "0", after: "0", wantOut: `ksm: "yes" is not keep, on or off`, wantErr: true},
		{name: "no ksm in the kernel", ksm: "on", wantOut: "this node's kernel has no KSM", wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newFakeNode(t)
			ksmDir := filepath.Join(n.dir, "ksm")
			n.mkdir(ksmDir)
			run := filepath.Join(ksmDir, "run")
			if tc.before != "" {
				n.write(run, tc.before+"\n", 0o644)
			}
			key := filepath.Join(n.configDir, "ksm")
			if tc.ksm == "" {
				if err := os.Remove(key); err != nil {
					t.Fatal(err)
				}
			} else {
				n.write(key, tc.ksm, 0o644)
			}
			n.env = append(n.env, "KSM_DIR="+ksmDir)
			out, _, err := n.run()
			if (err != nil) != tc.wantErr || !strings.Contains(out, tc.wantOut) {
				t.Fatalf("install.sh: %v, want error %v and output with %q:\n%s", err, tc.wantErr, tc.wantOut, out)
			}
			if tc.before == "" {
				return
			}
			if got := strings.TrimSpace(n.read(filepath.Join("..", "ksm", "run"))); got != tc.after {
				t.Errorf("ksm run %q after install.sh, want %q", got, tc.after)
			}
		})
	}
}
