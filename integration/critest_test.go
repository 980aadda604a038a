package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// Environment of TestCritest.
const (
	envCritest        = "VMSHIM_CRITEST"         // the critest binary the set-up built
	envCritestHandler = "VMSHIM_CRITEST_HANDLER" // the runtime handler it tests: vm unless set (runc, to compare)
)

// critestCNI is the CNI of TestCritest's daemon: the suite's bridge, and
// the portmap plugin for critest's host port tests, as nodes have it.
const critestCNI = `{"cniVersion": "1.0.0", "name": "vmshim-critest", "plugins": [{
  "type": "bridge", "bridge": "vmshim-br0", "isGateway": true, "ipMasq": false, "mtu": 1400,
  "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.88.0.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}],
           "dataDir": "@DIR@/ipam"}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}`

// critestSkips are the critest tests TestCritest skips, each with the
// reason it cannot pass here. docs/kubernetes.md lists them too.
var critestSkips = []struct{ test, reason string }{
	{"public image with digest should be pulled and removed",
		"critest pulls test-image-digest by the digest of the image cri-tools published; no rebuild has that digest, and no registry is reachable"},
	{"runtime should support MaskedPaths",
		"it masks /bin/ls and expects `sh -c ls` to fail, but Debian's busybox-static runs applets in the shell's process (FEATURE_SH_STANDALONE), never exec'ing /bin/ls; it fails so on runc too"},
}

// critestSelfSkips are the reasons critest gives for the tests it skips
// itself, from what the runtime and the host report; docs/kubernetes.md
// lists them. A test skipped for another reason fails TestCritest.
var critestSelfSkips = []struct{ reason, why string }{
	{"AppArmor is disabled on this host", "no AppArmor on these hosts"},
	{"no runtime handler found which supports user namespaces", "Debian's runc reports no idmapped mounts, the shim no features"},
	{"Image Volume digest reporting", "containerd 2.4 does not report image volumes' image_ref"},
	{"spec discrepancy: containerd los", "critest's check of containerd's NRI synchronization race"},
	{"runtime does not implement recursive readonly mounts", "the vm handler only: the shim's -info reports no rro mount option"},
}

// knownSelfSkip reports whether msg is the message of one of
// critestSelfSkips.
func knownSelfSkip(msg string) bool {
	for _, s := range critestSelfSkips {
		if strings.Contains(msg, s.reason) {
			return true
		}
	}
	return false
}

// critestSkipRegexp is the -ginkgo.skip of critestSkips.
func critestSkipRegexp() string {
	parts := make([]string, len(critestSkips))
	for i, s := range critestSkips {
		parts[i] = regexp.QuoteMeta(s.test)
	}
	return strings.Join(parts, "|")
}

// specReport is what TestCritest reads of a spec in ginkgo's JSON report.
type specReport struct {
	ContainerHierarchyTexts []string
	LeafNodeText            string
	State                   string
	Failure                 struct {
		Message  string
		Location struct {
			FileName   string
			LineNumber int
		}
	}
}

// name is the spec's full text, as -ginkgo.skip matches it.
func (s specReport) name() string {
	return strings.Join(append(append([]string{}, s.ContainerHierarchyTexts...), s.LeafNodeText), " ")
}

// readSpecReports reads ginkgo's JSON report at path.
func readSpecReports(path string) ([]specReport, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var suites []struct{ SpecReports []specReport }
	if err := json.Unmarshal(data, &suites); err != nil {
		return nil, fmt.Errorf("ginkgo report %s: %w", path, err)
	}
	var out []specReport
	for _, s := range suites {
		out = append(out, s.SpecReports...)
	}
	return out, nil
}

// TestCritest runs cri-tools' CRI validation suite (critest) against a
// daemon of its own, with the runtime handler vm: every pod it makes is a
// VM pod, and its containers, whose images hold no VM, run under runc
// beside the pod's sandbox. The images critest pulls are built here and
// served under the names it asks for by a registry in the daemon's
// network namespace; critest runs in that namespace and in containerd's
// IPC namespace, so that what it reaches as "the host" is the daemon's.
// Every test passes but critestSkips, and those critest skips itself for
// the reasons of critestSelfSkips.
func TestCritest(t *testing.T) {
	bin := os.Getenv(envCritest)
	if bin == "" {
		t.Fatalf("%s is not set (make integration sets it)", envCritest)
	}
	handler := os.Getenv(envCritestHandler)
	if handler == "" {
		handler = "vm"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 35*time.Minute)
	defer cancel()
	d := criDaemon(ctx, t, daemonOptions{cni: critestCNI, registryHosts: true, ipcns: true, nri: true})
	// A sandbox image runc can run too, for the comparison on runc.
	sandbox := filepath.Join(t.TempDir(), "sandbox.tar")
	if err := writeBusyboxArchive(sandbox, pauseImage); err != nil {
		t.Fatal(err)
	}
	if err := importArchives(ctx, d, criNamespace, sandbox); err != nil {
		t.Fatal(err)
	}
	nnp, err := buildNNP(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	images, err := critestImages(pauseProgram(), nnp)
	if err != nil {
		t.Fatalf("critest's images: %v", err)
	}
	reg := startRegistry(t, d)
	reg.pushAll(ctx, t, d, images)

	work := t.TempDir()
	report, output := filepath.Join(work, "report.json"), filepath.Join(work, "critest.log")
	out, err := os.Create(output)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	cmd := exec.CommandContext(ctx, "nsenter", "--net=/run/netns/"+d.netns, "--ipc="+d.ipcNS(), "--", bin,
		"-runtime-endpoint=unix://"+d.address, "-image-endpoint=unix://"+d.address,
		"-runtime-handler="+handler, "-nri-socket="+d.nriSocket(), "-ginkgo.skip="+critestSkipRegexp(),
		"-ginkgo.no-color", "-ginkgo.json-report="+report, "-ginkgo.timeout=30m")
	// critest's pod log directories go to the test's.
	cmd.Env = append(os.Environ(), "TMPDIR="+work)
	cmd.Dir, cmd.Stdout, cmd.Stderr = work, out, out
	start := time.Now()
	runErr := cmd.Run()
	took := time.Since(start).Round(time.Second)

	specs, err := readSpecReports(report)
	if err != nil {
		t.Fatalf("critest on %s: %v (exit: %v)\n%s\ncontainerd log:\n%s", handler, err, runErr, tailOf(output, 8000), d.logTail())
	}
	counts := map[string]int{}
	var failures, skipped []string
	failed := 0
	for _, s := range specs {
		counts[s.State]++
		// Skipped by critest itself, for what the runtime reports
		// (benchmarks and critestSkips are skipped before they run).
		if s.State == "skipped" && s.Failure.Message != "" {
			skipped = append(skipped, fmt.Sprintf("%s: %s", s.name(), firstLines(s.Failure.Message, 1)))
			if !knownSelfSkip(s.Failure.Message) {
				failures = append(failures, fmt.Sprintf("[skipped by critest for a reason not in critestSelfSkips] %s\n    %s",
					s.name(), firstLines(s.Failure.Message, 1)))
			}
		}
		if s.State != "passed" && s.State != "skipped" && s.State != "pending" {
			failed++
			failures = append(failures, fmt.Sprintf("[%s] %s\n    %s:%d\n    %s", s.State, s.name(),
				s.Failure.Location.FileName, s.Failure.Location.LineNumber, strings.ReplaceAll(firstLines(s.Failure.Message, 6), "\n", "\n    ")))
		}
	}
	t.Logf("critest on %s: %d passed, %d failed, %d skipped in %s; critest skipped:\n%s",
		handler, counts["passed"], failed, counts["skipped"], took, strings.Join(skipped, "\n"))
	if len(failures) > 0 || runErr != nil {
		t.Errorf("critest on %s failed (%v):\n%s\nimages the registry lacked: %v\nthe end of critest's output:\n%s\ncontainerd log:\n%s",
			handler, runErr, strings.Join(failures, "\n"), reg.missing(), tailOf(output, 3000), d.logTail())
	}
}

// firstLines returns the first n lines of s: gomega's failure messages
// go on with the dump of the error's Go value.
func firstLines(s string, n int) string {
	lines := strings.SplitN(s, "\n", n+1)
	if len(lines) > n {
		lines[n] = "…"
	}
	return strings.Join(lines, "\n")
}

// tailOf returns the last n bytes of the file at path.
func tailOf(path string, n int) string {
	data, _ := os.ReadFile(path)
	if len(data) > n {
		data = data[len(data)-n:]
	}
	return string(data)
}
