package integration

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

const (
	annotationDiskURL    = "vmshim.io/disk-url"
	annotationDiskSHA256 = "vmshim.io/disk-sha256"
)

// bridgeGateway is the daemon's address on the pod network (bridgeCNI's
// gateway): what a pod reaches of the daemon's namespace.
const bridgeGateway = "10.88.0.1"

// diskServer serves disk files over HTTP inside the suite's network
// namespace, where containerd and its shims run, and keeps a log of what
// it was asked and what it sent.
type diskServer struct {
	addr  string
	files map[string][]byte

	mu   sync.Mutex
	log  []served
	drop map[string]bool // paths whose next response is cut off halfway
}

// served is one response of a diskServer.
type served struct {
	path, rng string
	sent      int  // body bytes written
	full      bool // the whole file, from its first byte
}

// startDiskServer serves files (path → content) on the pod network's
// gateway address, which pods reach, until the test ends.
func startDiskServer(t *testing.T, files map[string][]byte) *diskServer {
	t.Helper()
	return startDiskServerAt(t, net.JoinHostPort(bridgeGateway, "0"), files)
}

// startDiskServerAt serves files on addr in the daemon's namespace.
func startDiskServerAt(t *testing.T, addr string, files map[string][]byte) *diskServer {
	t.Helper()
	s := &diskServer{files: files, drop: map[string]bool{}}
	s.addr = serveInDaemonNetns(t, addr, s)
	return s
}

// serveInDaemonNetns serves h on addr in the daemon's namespace until the
// test ends, and returns the address it listens on. The address need not
// be there yet (IP_FREEBIND): the CNI bridge gets its gateway address with
// the first pod.
func serveInDaemonNetns(t *testing.T, addr string, h http.Handler) string {
	t.Helper()
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_IP, syscall.IP_FREEBIND, 1) }); err != nil {
			return err
		}
		return serr
	}}
	var ln net.Listener
	if err := inNetns("/run/netns/"+env.daemon.netns, func() (err error) {
		ln, err = lc.Listen(context.Background(), "tcp", addr)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

func (s *diskServer) url(path string) string { return "http://" + s.addr + path }

// ServeHTTP serves a file with Range support (http.ServeContent), or cuts
// the connection after half of it when the path is marked to drop.
func (s *diskServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, ok := s.files[r.URL.Path]
	if !ok {
		http.NotFound(w, r)
		return
	}
	s.mu.Lock()
	drop := s.drop[r.URL.Path]
	delete(s.drop, r.URL.Path)
	s.mu.Unlock()
	cw := &countingWriter{ResponseWriter: w}
	if drop {
		w.Header().Set("Content-Length", fmt.Sprint(len(body)))
		w.Header().Set("ETag", `"`+digestOf(body)[:16]+`"`)
		w.WriteHeader(http.StatusOK)
		cw.Write(body[:len(body)/2])
		w.(http.Flusher).Flush()
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			conn.Close()
		}
	} else {
		w.Header().Set("ETag", `"`+digestOf(body)[:16]+`"`)
		http.ServeContent(cw, r, "", time.Time{}, bytes.NewReader(body))
	}
	s.mu.Lock()
	s.log = append(s.log, served{path: r.URL.Path, rng: r.Header.Get("Range"), sent: cw.n, full: r.Header.Get("Range") == "" && cw.n == len(body)})
	s.mu.Unlock()
}

// requests returns what the server served for path.
func (s *diskServer) requests(path string) []served {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []served
	for _, r := range s.log {
		if r.path == path {
			out = append(out, r)
		}
	}
	return out
}

// downloads returns what the server served for path but for the one-byte
// requests that show a pod can fetch a disk already in the cache.
func (s *diskServer) downloads(path string) []served {
	var out []served
	for _, r := range s.requests(path) {
		if r.rng != "bytes=0-0" {
			out = append(out, r)
		}
	}
	return out
}

type countingWriter struct {
	http.ResponseWriter
	n int
}

func (c *countingWriter) Write(b []byte) (int, error) {
	n, err := c.ResponseWriter.Write(b)
	c.n += n
	return n, err
}

func digestOf(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// bootDiskFile is the test guest's bootable disk (disk:wait's), as a file a
// server can publish.
func bootDiskFile(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(env.guestDir, "disk-wait.qcow2"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// urlPod runs a pod whose VM boots the disk at url: its image is the
// pause image, which holds no disk.
func urlPod(ctx context.Context, t *testing.T, c *cri, name, url, sum string) (*pod, *criContainer, error) {
	t.Helper()
	return vmPodOn(ctx, t, c, runtimeHandler, name, pauseImage, map[string]string{annotationDiskURL: url, annotationDiskSHA256: sum})
}

// vmPodOn runs a pod with the runtime handler, and in it a VM container of
// image with the annotations; it returns the error of its create or start.
func vmPodOn(ctx context.Context, t *testing.T, c *cri, handler, name, image string, ann map[string]string) (*pod, *criContainer, error) {
	t.Helper()
	p := c.runPodOn(ctx, t, handler, name, 0, nil)
	cfg := &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: "vm"}, Image: &runtimeapi.ImageSpec{Image: image}, LogPath: "vm.log",
		Annotations: ann,
	}
	created, err := c.runtime.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: p.id, Config: cfg, SandboxConfig: p.config})
	if err != nil {
		return p, nil, err
	}
	vm := &criContainer{p: p, id: created.ContainerId, log: filepath.Join(p.config.LogDirectory, cfg.LogPath)}
	_, err = c.runtime.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: vm.id})
	return p, vm, err
}

// TestDiskURLOneDownload starts five pods at once that boot the same disk
// by URL, from an image with no disk: all boot, the server sent the disk
// once, and each pod that took it from the cache asked for its first byte.
func TestDiskURLOneDownload(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*bootTimeout)
	defer cancel()
	disk := bootDiskFile(t)
	s := startDiskServer(t, map[string][]byte{"/disk.qcow2": disk})
	c := newCRI(t, env.daemon)
	const n = 5
	vms := make([]*criContainer, n)
	pods := make([]*pod, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, vm, err := urlPod(ctx, t, c, fmt.Sprintf("diskurl-%d", i), s.url("/disk.qcow2"), digestOf(disk))
			pods[i], vms[i] = p, vm
			if err != nil {
				t.Errorf("pod %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	for i, vm := range vms {
		if vm != nil {
			vm.waitLog(ctx, t, markerBooted)
			t.Logf("pod %d booted", i)
		}
	}
	reqs := s.downloads("/disk.qcow2")
	full := 0
	for _, r := range reqs {
		if r.full {
			full++
		}
	}
	t.Logf("server log: %+v", s.requests("/disk.qcow2"))
	if full != 1 || len(reqs) != 1 {
		t.Errorf("the server sent the disk %d times in %d requests, want once", full, len(reqs))
	}
	// Every other pod's network answered for the URL before it got the
	// disk from the cache.
	if probes := len(s.requests("/disk.qcow2")) - len(reqs); probes < n-1 {
		t.Errorf("%d one-byte requests, want one from each of the %d pods that used the cache", probes, n-1)
	}
	if line, ok := findLogLine(vms[0].log, "vmshim: "); !ok {
		t.Errorf("no download line in the first pod's log")
	} else {
		t.Logf("log: %s", line)
	}
	for i, p := range pods {
		if p != nil {
			p.remove(t)
			if vms[i] != nil {
				assertNothingLeftCRI(t, vms[i].id)
			}
		}
	}
}

// TestDiskURLResume: the server cuts the first response off halfway; the
// download resumes with a Range request and the pod boots. The disk is
// served gzip-compressed, so it is another digest than other tests'.
func TestDiskURLResume(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*bootTimeout)
	defer cancel()
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(bootDiskFile(t))
	zw.Close()
	s := startDiskServer(t, map[string][]byte{"/disk.qcow2.gz": gz.Bytes()})
	s.drop["/disk.qcow2.gz"] = true
	c := newCRI(t, env.daemon)
	p, vm, err := urlPod(ctx, t, c, "diskurl-resume", s.url("/disk.qcow2.gz"), "sha256:"+digestOf(gz.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	vm.waitLog(ctx, t, markerBooted)
	reqs := s.requests("/disk.qcow2.gz")
	t.Logf("server log: %+v", reqs)
	if len(reqs) < 2 || reqs[0].full || !strings.HasPrefix(reqs[1].rng, "bytes=") {
		t.Errorf("want a cut-off response, then a Range request; server log %+v", reqs)
	}
	if line, ok := findLogLine(vm.log, "resum"); !ok {
		t.Errorf("the container's log does not say the download resumed")
	} else {
		t.Logf("log: %s", line)
	}
	p.remove(t)
	assertNothingLeftCRI(t, vm.id)
}

// TestDiskURLRefused: a wrong digest fails the create with one line that
// gives both digests, an HTTP error with one naming the status, a disk
// that is no safe VM disk with one naming why; none leaves anything, in
// the cache either.
func TestDiskURLRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	body := []byte("not the disk you are looking for")
	backed := backedDisk(t)
	s := startDiskServer(t, map[string][]byte{"/wrong.img": body, "/backed.qcow2": backed})
	wrong := strings.Repeat("ab", 32)
	c := newCRI(t, env.daemon)
	for _, tc := range []struct {
		name, url, sum string
		want           []string
	}{
		{"digest", s.url("/wrong.img"), wrong, []string{s.url("/wrong.img"), "sha256 is " + digestOf(body), "want " + wrong}},
		{"missing", s.url("/missing.img"), wrong, []string{s.url("/missing.img"), "HTTP 404"}},
		{"unsafe", s.url("/backed.qcow2"), digestOf(backed), []string{s.url("/backed.qcow2"), "backing file"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, vm, err := urlPod(ctx, t, c, "diskurl-"+tc.name, tc.url, tc.sum)
			if err == nil {
				t.Fatalf("a VM started")
			}
			t.Logf("refused: %v", err)
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) || strings.Contains(err.Error(), "\n") {
					t.Errorf("want one line containing %q", w)
				}
			}
			if vm != nil {
				c.runtime.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: vm.id})
			}
			p.remove(t)
			if vm != nil {
				assertNothingLeftCRI(t, vm.id)
			}
		})
	}
	for _, d := range []string{"sha256", "tmp"} {
		entries, _ := os.ReadDir(filepath.Join(env.daemon.dir, "disks", d))
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), wrong) || strings.HasPrefix(e.Name(), digestOf(body)) || strings.HasPrefix(e.Name(), digestOf(backed)) {
				t.Errorf("left in the disk cache: %s/%s", d, e.Name())
			}
		}
	}
}

// backedDisk is a qcow2 image whose header names a host file as its
// backing file: a disk no VM may boot.
func backedDisk(t *testing.T) []byte {
	t.Helper()
	p := filepath.Join(t.TempDir(), "backed.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", "-u", "-b", "/etc/shadow", "-F", "raw", p, "1M").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img create: %v: %s", err, out)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestDiskURLPointerImage boots a pointer image made by vmshim-pack --url:
// its rootfs holds only /disk/disk.url and /disk/disk.sha256.
func TestDiskURLPointerImage(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*bootTimeout)
	defer cancel()
	disk, err := os.ReadFile(filepath.Join(env.guestDir, "disk-poweroff.qcow2"))
	if err != nil {
		t.Fatal(err)
	}
	s := startDiskServer(t, map[string][]byte{"/poweroff.qcow2": disk})
	const ref = "localhost/vmshim-test/pointer:poweroff"
	packImage(ctx, t, ref, "--url", s.url("/poweroff.qcow2"), "--sha256", digestOf(disk))
	c := newCRI(t, env.daemon)
	p, vm, err := vmPodOn(ctx, t, c, runtimeHandler, "diskurl-pointer", ref, nil)
	if err != nil {
		t.Fatal(err)
	}
	vm.waitLog(ctx, t, "VMSHIM-GUEST-POWEROFF")
	if st := vm.waitExited(ctx, t); st.ExitCode != 0 {
		t.Errorf("exit %d, want 0", st.ExitCode)
	}
	// The disk may be in the node's cache already, for other URLs: then
	// this URL, new to the cache, answers a one-byte request and serves
	// the disk in full once, to show it serves the same bytes.
	if dl := s.downloads("/poweroff.qcow2"); len(dl) != 1 || !dl[0].full {
		t.Errorf("server log %+v, want one full download", s.requests("/poweroff.qcow2"))
	}
	p.remove(t)
	assertNothingLeftCRI(t, vm.id)
}

// TestDiskURLEviction: a download reserves its room in the cache first.
// The cache holds a little more than one disk: while a running VM uses the
// first disk, a second is refused in one line naming cache_max_size, and
// leaves nothing; once no VM uses the first, the second evicts it. The
// disks are two guests' (the same size, other digests).
func TestDiskURLEviction(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*bootTimeout)
	defer cancel()
	wait := bootDiskFile(t)
	off, err := os.ReadFile(filepath.Join(env.guestDir, "disk-poweroff.qcow2"))
	if err != nil {
		t.Fatal(err)
	}
	s := startDiskServer(t, map[string][]byte{"/a.qcow2": wait, "/c.qcow2": off})
	c := newCRI(t, env.daemon)
	cached := func(sub string) map[string]bool {
		entries, _ := os.ReadDir(filepath.Join(env.daemon.smallCacheDir(), sub))
		m := map[string]bool{}
		for _, e := range entries {
			m[e.Name()] = true
		}
		return m
	}
	run := func(name, path string, body []byte) (*pod, *criContainer, error) {
		return vmPodOn(ctx, t, c, smallCacheHandler, name, pauseImage, map[string]string{annotationDiskURL: s.url(path), annotationDiskSHA256: digestOf(body)})
	}
	a, cc := digestOf(wait), digestOf(off)

	pa, va, err := run("evict-a", "/a.qcow2", wait)
	if err != nil {
		t.Fatalf("evict-a: %v", err)
	}
	va.waitLog(ctx, t, markerBooted)
	pb, vb, err := run("evict-b", "/c.qcow2", off)
	if err == nil {
		t.Fatal("a second disk was downloaded while the first, in use, fills the cache")
	}
	t.Logf("refused: %v", err)
	if !strings.HasSuffix(err.Error(), "(config cache_max_size)") || strings.Contains(err.Error(), "\n") {
		t.Errorf("want one line naming cache_max_size")
	}
	if got := cached("sha256"); !got[a] || got[cc] {
		t.Errorf("with the first disk in use, the cache holds %v, want it alone", got)
	}
	if got := cached("tmp"); len(got) != 0 {
		t.Errorf("the refused download left %v in tmp/", got)
	}
	if vb != nil {
		c.runtime.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: vb.id})
	}
	pb.remove(t)
	pa.remove(t)
	assertNothingLeftCRI(t, va.id)
	if vb != nil {
		assertNothingLeftCRI(t, vb.id)
	}

	pc, vc, err := run("evict-c", "/c.qcow2", off)
	if err != nil {
		t.Fatalf("evict-c: %v", err)
	}
	vc.waitLog(ctx, t, "VMSHIM-GUEST-POWEROFF")
	got := cached("sha256")
	t.Logf("cache after the second disk: %v", got)
	if got[a] || !got[cc] {
		t.Errorf("the cache holds %v: want the unused first disk (%s) evicted for the second", got, a[:12])
	}
	pc.remove(t)
	assertNothingLeftCRI(t, vc.id)
}
