package integration

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	runtimeoptions "github.com/containerd/containerd/api/types/runtimeoptions/v1"
	"github.com/containerd/containerd/v2/pkg/oci"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// metadataAddr is the cloud metadata address the test gives the daemon's
// namespace (the node's, to its pods).
const metadataAddr = "169.254.169.254"

// addMetadataAddr puts metadataAddr on the loopback of the daemon's
// namespace until the test ends: the pods' gateway would deliver a pod's
// packets to it there, as a node's does.
func addMetadataAddr(t *testing.T) {
	t.Helper()
	ns := env.daemon.netns
	del := func() { _ = exec.Command("ip", "-n", ns, "addr", "del", metadataAddr+"/32", "dev", "lo").Run() }
	del()
	if out, err := exec.Command("ip", "-n", ns, "addr", "add", metadataAddr+"/32", "dev", "lo").CombinedOutput(); err != nil {
		t.Fatalf("ip addr add %s: %v: %s", metadataAddr, err, out)
	}
	t.Cleanup(del)
}

// TestDiskURLPodNetwork repeats the attack of a pod that has the node
// fetch a URL for it, past every NetworkPolicy: a pod names a server on
// containerd's own loopback, and one on the node's metadata address
// (169.254.169.254, on the daemon's namespace's loopback);
// neither sees a request and each create fails in one line. A pod then
// fetches the disk from a server its own network reaches (on the pod
// network's gateway) and boots. Then, with the disk in the cache, a second
// pod that names its digest with either unreachable URL is refused in one
// line, without a request to either server and nothing of the disk; and a
// third that names it with a server it reaches, which answers the one-byte
// request but serves other bytes, downloads them and is refused in one
// line.
func TestDiskURLPodNetwork(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*bootTimeout)
	defer cancel()
	// A digest of its own: gzip at its fastest level.
	var gz bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&gz, gzip.BestSpeed)
	zw.Write(bootDiskFile(t))
	zw.Close()
	disk := gz.Bytes()
	files := map[string][]byte{"/disk.qcow2.gz": disk}
	addMetadataAddr(t)
	node := startDiskServerAt(t, "127.0.0.1:0", files)
	meta := startDiskServerAt(t, metadataAddr+":80", files)
	pod := startDiskServer(t, files)
	c := newCRI(t, env.daemon)

	refused := func(name, url string, want ...string) {
		t.Helper()
		p, vm, err := urlPod(ctx, t, c, name, url, digestOf(disk))
		if err == nil {
			t.Errorf("%s: a VM started from %s", name, url)
		} else {
			t.Logf("%s: refused: %v", name, err)
			msg := err.Error()
			for _, w := range append(want, "disk-url") {
				if !strings.Contains(msg, w) {
					t.Errorf("%s: want the error to contain %q", name, w)
				}
			}
			if strings.Contains(msg, "\n") || strings.Contains(msg, "sha256 is") {
				t.Errorf("%s: the error is not one line, or tells what a server sent", name)
			}
		}
		if vm != nil {
			c.runtime.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: vm.id})
		}
		p.remove(t)
		if vm != nil {
			assertNothingLeftCRI(t, vm.id)
		}
	}
	noRequests := func(when string) {
		t.Helper()
		if r := node.requests("/disk.qcow2.gz"); len(r) != 0 {
			t.Errorf("%s: the server on containerd's loopback got %d requests", when, len(r))
		}
		if r := meta.requests("/disk.qcow2.gz"); len(r) != 0 {
			t.Errorf("%s: the server on the metadata address got %d requests", when, len(r))
		}
	}

	refused("netns-loopback", node.url("/disk.qcow2.gz"), "connection refused")
	refused("netns-metadata", meta.url("/disk.qcow2.gz"), "url_deny_cidrs")
	noRequests("downloads")

	p, vm, err := urlPod(ctx, t, c, "netns-reachable", pod.url("/disk.qcow2.gz"), digestOf(disk))
	if err != nil {
		t.Fatalf("a pod fetching from its own network: %v", err)
	}
	vm.waitLog(ctx, t, markerBooted)
	if r := pod.requests("/disk.qcow2.gz"); len(r) != 1 || !r[0].full {
		t.Errorf("the reachable server's log %+v, want one whole download", r)
	}

	// The disk is in the cache now: a pod naming its digest must reach
	// the URL itself.
	refused("netns-cached-loopback", node.url("/disk.qcow2.gz"), "the pod's network cannot fetch it", "connection refused")
	refused("netns-cached-metadata", meta.url("/disk.qcow2.gz"), "the pod's network cannot fetch it", "url_deny_cidrs")
	noRequests("cache hits")

	// A pod that knows the digest names a server of its own, which its
	// network reaches and which answers the one-byte request, but serves
	// other bytes: it must download them in full, and is refused.
	other := append([]byte(nil), disk...)
	other[len(other)/2] ^= 0xff
	liar := startDiskServer(t, map[string][]byte{"/disk.qcow2.gz": other})
	lp, lvm, err := urlPod(ctx, t, c, "netns-cached-other", liar.url("/disk.qcow2.gz"), digestOf(disk))
	if err == nil {
		t.Errorf("a pod got the cached disk from %s, which serves other bytes", liar.url("/disk.qcow2.gz"))
	} else {
		t.Logf("netns-cached-other: refused: %v", err)
		msg := err.Error()
		for _, w := range []string{"disk-url " + liar.url("/disk.qcow2.gz"), "sha256 is " + digestOf(other), "want " + digestOf(disk)} {
			if !strings.Contains(msg, w) {
				t.Errorf("netns-cached-other: want the error to contain %q", w)
			}
		}
		if strings.Contains(msg, "\n") {
			t.Errorf("netns-cached-other: the error is not one line")
		}
	}
	if r := liar.downloads("/disk.qcow2.gz"); len(r) == 0 || !r[0].full {
		t.Errorf("the other server's log %+v, want a whole download", liar.requests("/disk.qcow2.gz"))
	}
	if lvm != nil {
		c.runtime.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: lvm.id})
	}
	lp.remove(t)
	if lvm != nil {
		assertNothingLeftCRI(t, lvm.id)
	}
	p.remove(t)
	assertNothingLeftCRI(t, vm.id)
}

// TestDiskURLCtrNetwork: under ctr, whose spec asks for a new network
// namespace, the disk is fetched from the namespace the shim makes for the
// task: attached to cni_network, it reaches a server on that network's
// gateway and boots; without a network it has only its own loopback, and
// the create fails in one line while the server sees nothing.
func TestDiskURLCtrNetwork(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	writeCNIConfig(t)
	cfgPath := filepath.Join(env.daemon.dir, "shim-cni-disks.toml")
	cfg := env.daemon.shimConfig() + fmt.Sprintf("cni_network = \"vmshim-ctr\"\ncni_conf_dir = %q\ncni_bin_dirs = [\"/usr/lib/cni\"]\n",
		filepath.Join(env.daemon.dir, "ctr-cni"))
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	disk, err := os.ReadFile(filepath.Join(env.guestDir, "disk-poweroff.qcow2"))
	if err != nil {
		t.Fatal(err)
	}
	s := startDiskServerAt(t, "10.91.0.1:0", map[string][]byte{"/disk.qcow2": disk})
	ann := oci.WithAnnotations(map[string]string{annotationDiskURL: s.url("/disk.qcow2"), annotationDiskSHA256: digestOf(disk)})

	id := uniqueID(t)
	v, err := createVM(ctx, t, id, imageKernelWait, nil, ann)
	if err == nil {
		t.Fatalf("a task with no network fetched %s", s.url("/disk.qcow2"))
	}
	t.Logf("no network: refused: %v", err)
	if !strings.Contains(err.Error(), "disk-url") || strings.Contains(err.Error(), "\n") {
		t.Errorf("want one line naming disk-url")
	}
	if r := s.requests("/disk.qcow2"); len(r) != 0 {
		t.Errorf("the server got %d requests from a task with no network", len(r))
	}
	v.remove(t)
	assertNothingLeft(ctx, t, id)

	id = uniqueID(t) + "-cni"
	v, err = createVM(ctx, t, id, imageKernelWait, &runtimeoptions.Options{ConfigPath: cfgPath}, ann)
	if err != nil {
		t.Fatalf("create on cni_network: %v", err)
	}
	v.start(ctx, t)
	v.console.waitFor(ctx, t, "VMSHIM-GUEST-POWEROFF")
	if r := s.requests("/disk.qcow2"); len(r) == 0 {
		t.Errorf("the server on the task's network got no request")
	}
	v.waitExit(ctx, t)
	v.remove(t)
	assertNothingLeft(ctx, t, id)
}
