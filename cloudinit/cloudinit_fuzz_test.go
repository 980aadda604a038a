package cloudinit

import (
	"bytes"
	"encoding/json"
	"flag"
	"net"
	"os/exec"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/containerd/errdefs"
	"sigs.k8s.io/yaml"
)

// cloudInitSeed is one FuzzCloudInit input; list fields are split on
// newlines (ssh keys, env) or commas (MACs).
type cloudInitSeed struct {
	instanceID, hostname, userData, sshKeys, env, tag, path string
	readOnly                                                bool
	macs, networkConfig                                     string
}

// cloudInitSeeds are valid and tricky FuzzCloudInit inputs.
func cloudInitSeeds() []cloudInitSeed {
	return []cloudInitSeed{
		{instanceID: "vmshim-pod-1"},
		{instanceID: "vmshim-pod-1", hostname: "vm-1", sshKeys: key1 + "\n" + key2, env: "A=1\nB=two words\nPATH=/usr/bin", tag: "vmshim0", path: "/data", macs: mac0},
		{instanceID: "i", userData: "#cloud-config\npackages: [curl]\nssh_authorized_keys: [x]\nwrite_files:\n- path: /a\n  content: |\n    hi\n", sshKeys: key1, env: "X=" + hostile},
		{instanceID: "i", userData: "#cloud-config\r\nhostname: a\r\n", env: "A=1", readOnly: true, tag: "v", path: "/v"},
		{instanceID: "i", userData: "#cloud-config\n", sshKeys: key1},
		{instanceID: "i", userData: "#cloud-config\nn: 1e+21\nf: 1.5\nb: yes\nd: 2001-12-14\nz: ~\nk: {\"<<\": 1, \"=\": 2, \"\": 3}\n", sshKeys: key1},
		{instanceID: "i", userData: "#cloud-config\nnested: [[a, []], {}, {x: [{y: \"z\\n\"}]}]\ns: \"\\u0085 \\u2028 \\ufeff \\t\\x01\"\n", env: "A=1"},
		{instanceID: "i", userData: "#!/bin/sh\necho hi\n", sshKeys: key1},
		{instanceID: "i", userData: "#!/bin/sh\necho hi\n"},
		{instanceID: "i", userData: userMIME, env: "A=1"},
		{instanceID: "i", userData: userMIME, sshKeys: key1, macs: mac0 + ",52:54:00:12:34:57"},
		{instanceID: "i", userData: "#cloud-config\n- a\n", env: "A=1"},
		{instanceID: "i", userData: "#cloud-config\nmounts: {}\n", tag: "v", path: "/v"},
		{instanceID: "i", userData: "hello", env: "A=1"},
		{instanceID: "i", userData: " \n"},
		{instanceID: "i\n---\nx: y", hostname: "yes", env: "=x\n1A=2\nA\nB=\x00\nC=\xff\xfe\nD=a\nb\nE=", macs: mac0, networkConfig: "version: 2\n"},
		{instanceID: "i", hostname: "a\n b\n", env: "A= lead\nB=trail \nC=\n\nD=x\r\ny"},
		{instanceID: "i", tag: "vdb1", path: "/a"},
		{instanceID: "i", tag: "v", path: "/a/../b"},
		{instanceID: "i", tag: "v", path: "/a\xffb"},
		{instanceID: "i", macs: "52:54:00:12:34"},
		{instanceID: "i", macs: mac0 + "," + strings.ToUpper(mac0)},
		{instanceID: "i", macs: "00:00:00:00:fe:80:00:00:00:00:00:00:02:00:5e:10:00:00:00:01"},
		{},
	}
}

// FuzzCloudInit renders NoCloud seeds from fuzzed user-data, keys,
// environment, mounts, hostname and MACs, and reads every document back:
// nothing the user or the container sets may change what the shim adds
// or be lost from what the user gave.
func FuzzCloudInit(f *testing.F) {
	for _, s := range cloudInitSeeds() {
		f.Add(s.instanceID, s.hostname, s.userData, s.sshKeys, s.env, s.tag, s.path, s.readOnly, s.macs, s.networkConfig)
	}
	py := newPyBatch(f)
	f.Fuzz(func(t *testing.T, instanceID, hostname, userData, sshKeys, env, tag, path string, readOnly bool, macs, networkConfig string) {
		ci := Documents{InstanceID: instanceID, Hostname: hostname, UserData: userData, NetworkConfig: networkConfig}
		ci.SSHKeys = splitNonEmpty(sshKeys, "\n")
		ci.Env = splitNonEmpty(env, "\n")
		ci.MACs = splitNonEmpty(macs, ",")
		if tag != "" || path != "" {
			ci.Mounts = []Mount{{Tag: tag, Path: path, ReadOnly: readOnly}}
		}
		files, err := ci.Files()
		if err != nil {
			checkOneLine(t, err)
			return
		}
		again, err := ci.Files()
		if err != nil || !reflect.DeepEqual(files, again) {
			t.Fatalf("Files is not deterministic: %v", err)
		}
		checkCloudInitFiles(t, py, ci, files)
	})
}

// checkCloudInitFiles reads back the documents of a rendered seed.
func checkCloudInitFiles(t *testing.T, py *pyBatch, ci Documents, files map[string][]byte) {
	t.Helper()
	meta := map[string]any{"instance-id": ci.InstanceID}
	if ci.Hostname != "" {
		meta["local-hostname"] = ci.Hostname
	}
	readBack(t, py, SeedMetaData, files[SeedMetaData], meta)

	network, ok := files[SeedNetworkConfig]
	switch {
	case ci.NetworkConfig != "":
		if string(network) != ci.NetworkConfig {
			t.Errorf("network-config %q, want the user's %q", network, ci.NetworkConfig)
		}
	case len(ci.MACs) > 0:
		eth := map[string]any{}
		for i, s := range ci.MACs {
			mac, _ := net.ParseMAC(s)
			eth["nic"+strconv.Itoa(i)] = map[string]any{"match": map[string]any{"macaddress": mac.String()}, "dhcp4": true}
		}
		readBack(t, py, SeedNetworkConfig, network, map[string]any{"version": json.Number("2"), "ethernets": eth})
	case ok:
		t.Errorf("network-config %q with neither MACs nor the user's", network)
	}

	shim, err := ci.shimConfig()
	if err != nil {
		t.Fatalf("shimConfig fails after Files succeeded: %v", err)
	}
	checkShimConfig(t, ci, shim)
	ud := files[SeedUserData]
	user := ci.UserData
	first, _, _ := strings.Cut(user, "\n")
	switch {
	case strings.TrimSpace(user) == "":
		readBack(t, py, SeedUserData, ud, shim)
	case len(shim) == 0:
		if string(ud) != user {
			t.Errorf("user-data %q, want the user's %q unchanged", ud, user)
		}
	case strings.TrimRight(first, " \t\r") == "#cloud-config":
		var doc any
		if err := yaml.Unmarshal([]byte(user), &doc, useNumber); err != nil {
			t.Fatalf("user's cloud-config was merged but does not parse: %v", err)
		}
		m, _ := doc.(map[string]any)
		if m == nil {
			m = map[string]any{}
		}
		for k, v := range shim {
			have, _ := m[k].([]any)
			m[k] = append(have, v.([]any)...)
		}
		readBack(t, py, SeedUserData, ud, m)
	case strings.HasPrefix(user, "#!"):
		script := checkMIME(t, py, ud, user, shim)
		if !strings.HasPrefix(script, "Content-Type: text/x-shellscript;") {
			t.Fatalf("second part is not a shell script:\n%s", script)
		}
		_, body, _ := strings.Cut(script, "\n\n")
		if got := decodeB64(t, []byte(body)); string(got) != user {
			t.Fatalf("script part decodes to %q, want the user's %q", got, user)
		}
	default:
		if nested := checkMIME(t, py, ud, user, shim); nested != user {
			t.Fatalf("user's message is not kept byte for byte: %q, want %q", nested, user)
		}
	}
}

// checkShimConfig checks what the shim adds against ci, without the code
// that renders it.
func checkShimConfig(t *testing.T, ci Documents, shim map[string]any) {
	t.Helper()
	if keys, _ := shim["ssh_authorized_keys"].([]any); len(keys) != len(ci.SSHKeys) {
		t.Errorf("%d ssh keys added, want %d", len(keys), len(ci.SSHKeys))
	}
	if mounts, _ := shim["mounts"].([]any); len(mounts) != len(ci.Mounts) {
		t.Errorf("%d mounts added, want %d", len(mounts), len(ci.Mounts))
	}
	_, hasFiles := shim["write_files"]
	wantFiles := false
	for _, kv := range ci.Env {
		name, value, ok := strings.Cut(kv, "=")
		if ok && shellName.MatchString(name) && !strings.ContainsRune(value, 0) {
			wantFiles = true
		}
	}
	if hasFiles != wantFiles {
		t.Errorf("write_files added: %v, want %v for env %q", hasFiles, wantFiles, ci.Env)
	}
}

// checkMIME checks a two-part multipart/mixed user-data whose first part
// is the shim's cloud-config, and returns the second part, headers and all.
func checkMIME(t *testing.T, py *pyBatch, ud []byte, user string, shim map[string]any) string {
	t.Helper()
	const head = "Content-Type: multipart/mixed; boundary=\""
	rest, ok := strings.CutPrefix(string(ud), head)
	boundary, rest, ok2 := strings.Cut(rest, "\"\nMIME-Version: 1.0\n\n")
	if !ok || !ok2 || boundary == "" || strings.ContainsAny(boundary, "\"\n") {
		t.Fatalf("user-data is not the shim's multipart message:\n%s", ud)
	}
	if strings.Contains(user, boundary) {
		t.Fatalf("boundary %q occurs in the user's data", boundary)
	}
	delim := "--" + boundary
	rest, ok = strings.CutPrefix(rest, delim+"\n")
	rest, ok2 = strings.CutSuffix(rest, "\n"+delim+"--\n")
	parts := strings.Split(rest, "\n"+delim+"\n")
	if !ok || !ok2 || len(parts) != 2 {
		t.Fatalf("user-data is not two parts between %s lines:\n%s", delim, ud)
	}
	_, body, ok := strings.Cut(parts[0], "\n\n")
	if !ok || !strings.HasPrefix(parts[0], "Content-Type: text/cloud-config;") {
		t.Fatalf("first part is not the shim's cloud-config:\n%s", parts[0])
	}
	readBack(t, py, "user-data shim part", decodeB64(t, []byte(body)), shim)
	return parts[1]
}

// readBack parses a YAML document and compares it with want as the guest
// would get it (strings as UTF-8, numbers by value); with py it also has
// PyYAML, cloud-init's parser, read it.
func readBack(t *testing.T, py *pyBatch, name string, doc []byte, want any) {
	t.Helper()
	var got any
	if err := yaml.Unmarshal(doc, &got, useNumber); err != nil {
		t.Fatalf("%s does not parse: %v\n%s", name, err, doc)
	}
	want = normalize(want)
	if got = normalize(got); !reflect.DeepEqual(got, want) {
		t.Fatalf("%s reads back as\n%#v\nwant\n%#v\nfrom\n%s", name, got, want, doc)
	}
	py.add(t.Name()+" "+name, doc, want)
}

// pyBatch collects documents for PyYAML to read in one process once the
// seed corpus has run: a process per document would make the corpus
// slow to replay and fuzzing crawl.
type pyBatch struct {
	mu   sync.Mutex
	docs []pyDoc
}

type pyDoc struct {
	name string
	doc  string
	want any
}

// newPyBatch returns a batch checked when f's seed corpus has run, or nil
// when fuzzing, with -short or without PyYAML.
func newPyBatch(f *testing.F) *pyBatch {
	if fuzzing() || !hasPyYAML() {
		return nil
	}
	py := &pyBatch{}
	f.Cleanup(func() { py.check(f) })
	return py
}

func (b *pyBatch) add(name string, doc []byte, want any) {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.docs = append(b.docs, pyDoc{name: name, doc: string(doc), want: want})
}

// check has PyYAML's safe loader read every document and compares.
func (b *pyBatch) check(t testing.TB) {
	const script = "import json, sys, yaml\n" +
		"out = []\n" +
		"for d in json.load(sys.stdin):\n" +
		"    try:\n" +
		"        out.append({'v': yaml.safe_load(d)})\n" +
		"    except Exception as e:\n" +
		"        out.append({'err': str(e)})\n" +
		"json.dump(out, sys.stdout, default=str)\n"
	docs := make([]string, len(b.docs))
	for i, d := range b.docs {
		docs[i] = d.doc
	}
	in, err := json.Marshal(docs)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("python3", "-c", script)
	cmd.Stdin = bytes.NewReader(in)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("PyYAML: %v", err)
	}
	var res []struct {
		V   any    `json:"v"`
		Err string `json:"err"`
	}
	if err := json.Unmarshal(out, &res); err != nil || len(res) != len(b.docs) {
		t.Fatalf("PyYAML gave %d results for %d documents: %v", len(res), len(b.docs), err)
	}
	t.Logf("PyYAML read %d documents back", len(b.docs))
	for i, d := range b.docs {
		if res[i].Err != "" {
			t.Errorf("%s: PyYAML cannot parse it: %s\n%s", d.name, res[i].Err, d.doc)
		} else if got := normalize(res[i].V); !reflect.DeepEqual(got, d.want) {
			t.Errorf("%s: PyYAML reads back\n%#v\nwant\n%#v\nfrom\n%s", d.name, got, d.want, d.doc)
		}
	}
}

// normalize makes strings valid UTF-8 as the renderer does and turns
// numbers into float64, so that 1e+21 and 1.0e+21 compare equal.
func normalize(v any) any {
	switch v := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, x := range v {
			out[strings.ToValidUTF8(k, "\uFFFD")] = normalize(x)
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = normalize(x)
		}
		return out
	case string:
		return strings.ToValidUTF8(v, "\uFFFD")
	case json.Number:
		f, err := v.Float64()
		if err != nil {
			return "bad number " + string(v)
		}
		return f
	case int:
		return float64(v)
	}
	return v
}

func useNumber(d *json.Decoder) *json.Decoder {
	d.UseNumber()
	return d
}

// checkOneLine checks an error is invalid-argument and one line of UTF-8:
// the shim's errors reach kubectl describe through gRPC.
func checkOneLine(t *testing.T, err error) {
	t.Helper()
	msg := err.Error()
	if msg == "" || strings.ContainsAny(msg, "\n\r") || !utf8.ValidString(msg) {
		t.Fatalf("error is not one line of UTF-8: %q", msg)
	}
	if !errdefs.IsInvalidArgument(err) {
		t.Fatalf("error is not invalid-argument: %v", err)
	}
}

func splitNonEmpty(s, sep string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, sep)
}

// fuzzing reports whether this run generates inputs (-test.fuzz), when
// the Python cross-checks are too slow to run on each one.
func fuzzing() bool {
	f := flag.Lookup("test.fuzz")
	return f != nil && f.Value.String() != ""
}
