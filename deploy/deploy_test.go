package deploy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/vmshim/vmshim/config"
)

// runtimeBlock is containerd's runtime entry for vmshim. The installer's
// drop-in, docs/kubernetes.md and the integration tests' CRI config all
// carry it.
const runtimeBlock = `[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.vm]
  runtime_type = "io.containerd.vm.v2"
  pod_annotations = ["vmshim.io/*"]
  container_annotations = ["vmshim.io/*", "io.kubernetes.pod.terminationGracePeriod"]
`

// Keys of the installer ConfigMap.
const (
	keyConfig = "config.toml"
	keyDropin = "containerd-vmshim.toml"
	keyScript = "install.sh"
)

// document is one decoded YAML document of a manifest file.
type document struct {
	where string // file:index
	obj   metav1.Object
}

// newObject returns an empty typed object for a document's apiVersion and
// kind; only the kinds the manifests are meant to hold are known.
func newObject(apiVersion, kind string) (metav1.Object, error) {
	switch apiVersion + " " + kind {
	case "v1 Namespace":
		return &corev1.Namespace{}, nil
	case "v1 ServiceAccount":
		return &corev1.ServiceAccount{}, nil
	case "v1 ConfigMap":
		return &corev1.ConfigMap{}, nil
	case "v1 Pod":
		return &corev1.Pod{}, nil
	case "apps/v1 DaemonSet":
		return &appsv1.DaemonSet{}, nil
	case "node.k8s.io/v1 RuntimeClass":
		return &nodev1.RuntimeClass{}, nil
	}
	return nil, fmt.Errorf("unknown kind %q of apiVersion %q", kind, apiVersion)
}

// decodeFile decodes every document of a manifest strictly: unknown
// fields, duplicate keys and unknown kinds are errors.
func decodeFile(path string) ([]document, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var docs []document
	r := utilyaml.NewYAMLReader(bufio.NewReader(f))
	for i := 0; ; i++ {
		raw, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		where := fmt.Sprintf("%s:%d", filepath.Base(path), i)
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(raw, &tm); err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		if tm.APIVersion == "" && tm.Kind == "" {
			if isBlank(raw) {
				continue
			}
			return nil, fmt.Errorf("%s: document without apiVersion and kind", where)
		}
		obj, err := newObject(tm.APIVersion, tm.Kind)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		if err := yaml.UnmarshalStrict(raw, obj); err != nil {
			return nil, fmt.Errorf("%s: %s: %w", where, tm.Kind, err)
		}
		if obj.GetName() == "" {
			return nil, fmt.Errorf("%s: %s without metadata.name", where, tm.Kind)
		}
		docs = append(docs, document{where: where, obj: obj})
	}
	return docs, nil
}

// isBlank reports whether a YAML document holds only comments and space.
func isBlank(raw []byte) bool {
	for _, line := range strings.Split(string(raw), "\n") {
		line = strings.TrimSpace(line)
		if line != "" && line != "---" && !strings.HasPrefix(line, "#") {
			return false
		}
	}
	return true
}

// manifests decodes every deploy/*.yaml file.
func manifests(t *testing.T) map[string][]document {
	t.Helper()
	files, err := filepath.Glob("*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no *.yaml manifests in deploy/")
	}
	out := make(map[string][]document)
	for _, f := range files {
		docs, err := decodeFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if len(docs) == 0 {
			t.Fatalf("%s: no documents", f)
		}
		out[f] = docs
	}
	return out
}

// find returns the only object of type T in file.
func find[T metav1.Object](t *testing.T, all map[string][]document, file string) T {
	t.Helper()
	var found []T
	for _, d := range all[file] {
		if o, ok := d.obj.(T); ok {
			found = append(found, o)
		}
	}
	if len(found) != 1 {
		var zero T
		t.Fatalf("%s: %d objects of type %T, want 1", file, len(found), zero)
	}
	return found[0]
}

func TestManifestsDecodeStrictly(t *testing.T) {
	all := manifests(t)
	for _, f := range []string{"runtimeclass.yaml", "installer.yaml", "example-pod.yaml"} {
		if _, ok := all[f]; !ok {
			t.Errorf("deploy/%s is missing", f)
		}
	}
	seen := make(map[string]string)
	for _, docs := range all {
		for _, d := range docs {
			key := fmt.Sprintf("%T %s/%s", d.obj, d.obj.GetNamespace(), d.obj.GetName())
			if prev, dup := seen[key]; dup {
				t.Errorf("%s and %s both define %s", prev, d.where, key)
			}
			seen[key] = d.where
		}
	}
}

func TestDecodeRejects(t *testing.T) {
	tests := map[string]string{
		"unknown field": "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: a\n  nmae: b\n",
		"unknown kind":  "apiVersion: v1\nkind: Secret\nmetadata:\n  name: a\n",
		"duplicate key": "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: a\n  name: b\n",
		"bad quantity":  "apiVersion: node.k8s.io/v1\nkind: RuntimeClass\nmetadata:\n  name: a\nhandler: a\noverhead:\n  podFixed:\n    memory: lots\n",
		"no kind":       "metadata:\n  name: a\n",
	}
	for name, body := range tests {
		t.Run(name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "m.yaml")
			if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
			if _, err := decodeFile(p); err == nil {
				t.Fatalf("decodeFile accepted:\n%s", body)
			}
		})
	}
}

// shimAndPause is what the RuntimeClass overhead must hold beyond
// memory_overhead: the pause process (11 MiB RSS) and the pod's shim (22
// MiB RSS after 5 MB of exec output, make bench's memory section), with
// room to spare.
const shimAndPause = 48 << 20

func TestRuntimeClass(t *testing.T) {
	rc := find[*nodev1.RuntimeClass](t, manifests(t), "runtimeclass.yaml")
	if rc.Name != "vm" || rc.Handler != "vm" {
		t.Errorf("RuntimeClass %q handler %q, want vm and vm", rc.Name, rc.Handler)
	}
	if rc.Overhead == nil {
		t.Fatal("RuntimeClass vm has no overhead")
	}
	for _, r := range []corev1.ResourceName{corev1.ResourceMemory, corev1.ResourceCPU} {
		if q, ok := rc.Overhead.PodFixed[r]; !ok || q.Sign() <= 0 {
			t.Errorf("overhead.podFixed.%s = %v, want a positive quantity", r, q.String())
		}
	}
	// The pod's cgroup holds QEMU's, which allows guest RAM plus
	// memory_overhead, and the pause process and the shim beside it.
	mem := rc.Overhead.PodFixed[corev1.ResourceMemory]
	if room := mem.Value() - config.Default().MemoryOverheadBytes(); room < shimAndPause {
		t.Errorf("overhead.podFixed.memory %s leaves %d MiB beyond the default memory_overhead for the pause process and the shim, want at least %d MiB",
			mem.String(), room>>20, shimAndPause>>20)
	}
	if rc.Scheduling == nil || rc.Scheduling.NodeSelector["vmshim.io/runtime"] != "true" {
		t.Errorf("scheduling.nodeSelector lacks vmshim.io/runtime: \"true\"")
	}
}

// installerConfigMap returns the installer's ConfigMap, checking it has
// every key the DaemonSet uses.
func installerConfigMap(t *testing.T, all map[string][]document) *corev1.ConfigMap {
	t.Helper()
	cm := find[*corev1.ConfigMap](t, all, "installer.yaml")
	for _, k := range []string{keyConfig, keyDropin, keyScript} {
		if cm.Data[k] == "" {
			t.Fatalf("ConfigMap %s has no %s", cm.Name, k)
		}
	}
	return cm
}

func TestInstallerConfigIsTheDefaults(t *testing.T) {
	cm := installerConfigMap(t, manifests(t))
	p := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(p, []byte(cm.Data[keyConfig]), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(p)
	if err != nil {
		t.Fatalf("config.Load(ConfigMap %s) = %v", keyConfig, err)
	}
	if !reflect.DeepEqual(cfg, config.Default()) {
		t.Errorf("ConfigMap %s = %+v, want the defaults %+v", keyConfig, cfg, config.Default())
	}
}

func TestDropinHasRuntimeBlock(t *testing.T) {
	dropin := installerConfigMap(t, manifests(t)).Data[keyDropin]
	if !strings.Contains(dropin, "\n"+runtimeBlock) {
		t.Errorf("ConfigMap %s lacks the runtime block\n%s\ngot:\n%s", keyDropin, runtimeBlock, dropin)
	}
	if !strings.Contains(dropin, "\nversion = 3\n") {
		t.Errorf("ConfigMap %s does not say version = 3 (containerd 2.x)", keyDropin)
	}
}

func TestDocsHaveRuntimeBlock(t *testing.T) {
	doc, err := os.ReadFile("../docs/kubernetes.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), "```toml\n"+runtimeBlock+"```\n") {
		t.Errorf("docs/kubernetes.md has no ```toml block holding exactly\n%s", runtimeBlock)
	}
	rc := find[*nodev1.RuntimeClass](t, manifests(t), "runtimeclass.yaml")
	for r, q := range rc.Overhead.PodFixed {
		if !bytes.Contains(doc, []byte("`"+q.String()+"`")) {
			t.Errorf("docs/kubernetes.md does not quote the RuntimeClass overhead %s `%s`", r, q.String())
		}
	}
}

func TestIntegrationConfigHasRuntimeBlock(t *testing.T) {
	src, err := os.ReadFile("../integration/daemon_test.go")
	if err != nil {
		t.Fatal(err)
	}
	if !containsTrimmedLines(string(src), runtimeBlock) {
		t.Errorf("integration/daemon_test.go's CRI config lacks the runtime block\n%s", runtimeBlock)
	}
}

// containsTrimmedLines reports whether the lines of block, trimmed, occur
// consecutively in text, whatever the indentation.
func containsTrimmedLines(text, block string) bool {
	trim := func(s string) []string {
		lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
		for i := range lines {
			lines[i] = strings.TrimSpace(lines[i])
		}
		return lines
	}
	hay, needle := trim(text), trim(block)
	for i := 0; i+len(needle) <= len(hay); i++ {
		if slices.Equal(hay[i:i+len(needle)], needle) {
			return true
		}
	}
	return false
}

func TestInstallerDaemonSet(t *testing.T) {
	all := manifests(t)
	ns := find[*corev1.Namespace](t, all, "installer.yaml")
	sa := find[*corev1.ServiceAccount](t, all, "installer.yaml")
	cm := installerConfigMap(t, all)
	ds := find[*appsv1.DaemonSet](t, all, "installer.yaml")
	rc := find[*nodev1.RuntimeClass](t, all, "runtimeclass.yaml")

	for _, o := range []metav1.Object{sa, cm, ds} {
		if o.GetNamespace() != ns.Name {
			t.Errorf("%T %s is in namespace %q, want %q", o, o.GetName(), o.GetNamespace(), ns.Name)
		}
	}
	sel, err := metav1.LabelSelectorAsSelector(ds.Spec.Selector)
	if err != nil || sel.Empty() || !sel.Matches(labels.Set(ds.Spec.Template.Labels)) {
		t.Errorf("DaemonSet selector %v does not match its pod labels %v (%v)", ds.Spec.Selector, ds.Spec.Template.Labels, err)
	}
	pod := ds.Spec.Template.Spec
	if pod.ServiceAccountName != sa.Name {
		t.Errorf("serviceAccountName %q, want %q", pod.ServiceAccountName, sa.Name)
	}
	if !pod.HostPID {
		t.Error("hostPID is false; nsenter -t 1 needs the node's PID namespace")
	}
	if rc.Scheduling == nil {
		t.Fatal("RuntimeClass vm has no scheduling")
	}
	for k, v := range rc.Scheduling.NodeSelector {
		if pod.NodeSelector[k] != v {
			t.Errorf("DaemonSet nodeSelector lacks %s=%s, so VM pods could land on nodes without vmshim", k, v)
		}
	}
	if len(pod.InitContainers) != 1 || len(pod.Containers) != 1 {
		t.Fatalf("%d init containers and %d containers, want 1 and 1", len(pod.InitContainers), len(pod.Containers))
	}
	install, idle := pod.InitContainers[0], pod.Containers[0]
	for _, c := range []corev1.Container{install, idle} {
		if c.Image != "vmshim/installer:v0.1.0" {
			t.Errorf("container %s image %q, want vmshim/installer:v0.1.0", c.Name, c.Image)
		}
	}
	if sc := install.SecurityContext; sc == nil || sc.Privileged == nil || !*sc.Privileged {
		t.Error("the install container is not privileged")
	}
	if sc := idle.SecurityContext; sc != nil && sc.Privileged != nil && *sc.Privileged {
		t.Error("the idle container is privileged")
	}

	volumes := make(map[string]corev1.Volume)
	for _, v := range pod.Volumes {
		volumes[v.Name] = v
	}
	env := make(map[string]string)
	for _, e := range install.Env {
		env[e.Name] = e.Value
	}
	mounts := make(map[string]string) // mount path -> host path or "configmap"
	for _, m := range install.VolumeMounts {
		v, ok := volumes[m.Name]
		switch {
		case !ok:
			t.Errorf("volumeMount %s names no volume", m.Name)
		case v.ConfigMap != nil:
			if v.ConfigMap.Name != cm.Name {
				t.Errorf("volume %s mounts ConfigMap %q, want %q", v.Name, v.ConfigMap.Name, cm.Name)
			}
			mounts[m.MountPath] = "configmap"
		case v.HostPath != nil:
			mounts[m.MountPath] = v.HostPath.Path
		}
	}
	for _, p := range []string{"/usr/local/bin", "/etc/vmshim", "/etc/containerd"} {
		if mounts[env["HOST_ROOT"]+p] != p {
			t.Errorf("node directory %s is not mounted at HOST_ROOT%s (HOST_ROOT=%q)", p, p, env["HOST_ROOT"])
		}
	}
	if mounts[env["CONFIG_DIR"]] != "configmap" {
		t.Errorf("CONFIG_DIR %q is not where the ConfigMap is mounted", env["CONFIG_DIR"])
	}
	wantCmd := []string{"/bin/sh", env["CONFIG_DIR"] + "/" + keyScript}
	if !slices.Equal(install.Command, wantCmd) {
		t.Errorf("install command %q, want %q", install.Command, wantCmd)
	}
	dockerfile, err := os.ReadFile("installer/Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	if src := env["SHIM_SRC"]; src == "" || !strings.Contains(string(dockerfile), "containerd-shim-vm-v2 "+src+"\n") {
		t.Errorf("installer/Dockerfile does not copy the shim to SHIM_SRC %q", src)
	}
	if pause := filepath.Join(filepath.Dir(env["SHIM_SRC"]), "vmshim-pause"); !strings.Contains(string(dockerfile), "vmshim-pause "+pause+"\n") {
		t.Errorf("installer/Dockerfile does not copy vmshim-pause next to the shim, to %s", pause)
	}
}

func TestExamplePod(t *testing.T) {
	all := manifests(t)
	pod := find[*corev1.Pod](t, all, "example-pod.yaml")
	rc := find[*nodev1.RuntimeClass](t, all, "runtimeclass.yaml")
	if pod.Spec.RuntimeClassName == nil || *pod.Spec.RuntimeClassName != rc.Name {
		t.Fatalf("runtimeClassName %v, want %q", pod.Spec.RuntimeClassName, rc.Name)
	}
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Spec.Containers))
	}
	c := pod.Spec.Containers[0]
	if c.Image != "quay.io/containerdisks/debian:12" {
		t.Errorf("image %q, want quay.io/containerdisks/debian:12", c.Image)
	}
	for _, a := range []string{config.AnnotationSSHAuthorizedKeys, config.AnnotationUserData} {
		if pod.Annotations[a] == "" {
			t.Errorf("annotation %s is missing", a)
		}
	}
	// The spec the CRI gives the shim: pod annotations (pod_annotations
	// forwards vmshim.io/*) and the limits as a CFS quota and memory limit.
	cpu, mem := c.Resources.Limits[corev1.ResourceCPU], c.Resources.Limits[corev1.ResourceMemory]
	if cpu.Cmp(resource.MustParse("1")) != 0 || mem.Cmp(resource.MustParse("1Gi")) != 0 {
		t.Errorf("limits cpu %s memory %s, want 1 and 1Gi", cpu.String(), mem.String())
	}
	period := uint64(100000)
	quota := cpu.MilliValue() * int64(period) / 1000
	limit := mem.Value()
	spec := &specs.Spec{
		Annotations: pod.Annotations,
		Linux: &specs.Linux{Resources: &specs.LinuxResources{
			CPU:    &specs.LinuxCPU{Quota: &quota, Period: &period},
			Memory: &specs.LinuxMemory{Limit: &limit},
		}},
	}
	vm, err := config.Resolve(config.Default(), "vm", spec)
	if err != nil {
		t.Fatalf("the shim would refuse the example pod: %v", err)
	}
	if vm.VCPUs != 1 || vm.MemoryMiB != 1024 {
		t.Errorf("example VM has %d vCPUs and %d MiB, want 1 and 1024", vm.VCPUs, vm.MemoryMiB)
	}
	if len(vm.SSHAuthorizedKeys) != 1 {
		t.Errorf("example VM has %d ssh keys, want 1", len(vm.SSHAuthorizedKeys))
	}
}
