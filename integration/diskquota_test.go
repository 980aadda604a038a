package integration

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// startHandlerServer serves h where startDiskServer serves files: on the
// pod network's gateway in the daemon's namespace, which pods reach (the
// address may not be there yet: IP_FREEBIND).
func startHandlerServer(t *testing.T, h http.Handler) string {
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
		ln, err = lc.Listen(context.Background(), "tcp", net.JoinHostPort(bridgeGateway, "0"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String()
}

// hostileDisks serves the three misbehaving disk servers of
// TestDiskURLQuota: /halfway always stops half-way through, /trickle
// sends 1 KiB every half second of a 16 MiB body (never stalling), and
// /bomb is a zstd bomb.
type hostileDisks struct {
	halfway, bomb []byte
	trickles      chan string // the Range of each /trickle request
}

func (h *hostileDisks) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/bomb":
		w.Header().Set("Content-Length", fmt.Sprint(len(h.bomb)))
		w.Write(h.bomb)
	case "/halfway":
		w.Header().Set("Content-Length", fmt.Sprint(len(h.halfway)))
		w.WriteHeader(http.StatusOK)
		w.Write(h.halfway[:len(h.halfway)/2])
		w.(http.Flusher).Flush()
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			conn.Close()
		}
	case "/trickle":
		select {
		case h.trickles <- r.Header.Get("Range"):
		default:
		}
		w.Header().Set("Content-Length", fmt.Sprint(16<<20))
		w.WriteHeader(http.StatusOK)
		chunk := bytes.Repeat([]byte{0x5a}, 1<<10)
		for {
			if _, err := w.Write(chunk); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-time.After(500 * time.Millisecond):
			}
		}
	default:
		http.NotFound(w, r)
	}
}

// zstdBomb is 1 GiB of zeros as zstd: one frame of 1 MiB of zeros, 1024
// times over (a stream may hold many frames), a few dozen KiB in all.
func zstdBomb(t *testing.T) []byte {
	t.Helper()
	var frame bytes.Buffer
	w, err := zstd.NewWriter(&frame, zstd.WithEncoderLevel(zstd.SpeedFastest))
	if err != nil {
		t.Fatal(err)
	}
	w.Write(make([]byte, 1<<20))
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return bytes.Repeat(frame.Bytes(), 1024)
}

// cacheTemps lists the files of the test daemon's disk cache tmp/ that
// belong to digest.
func cacheTemps(digest string) []string {
	entries, _ := os.ReadDir(filepath.Join(env.daemon.dir, "disks", "tmp"))
	var out []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), digest) {
			out = append(out, e.Name())
		}
	}
	return out
}

// lockHolders counts the processes that have the cache's lock file of
// digest open: the shim downloading it, and every shim waiting for it.
func lockHolders(digest string) int {
	lock := filepath.Join(env.daemon.dir, "disks", "locks", digest)
	procs, _ := filepath.Glob("/proc/[0-9]*/fd")
	n := 0
	for _, fds := range procs {
		entries, _ := os.ReadDir(fds)
		for _, e := range entries {
			if target, err := os.Readlink(filepath.Join(fds, e.Name())); err == nil && target == lock {
				n++
				break
			}
		}
	}
	return n
}

// TestDiskURLQuota repeats the attacks on the node's disk through URL
// disks: a zstd bomb, a server that stops half-way and a trickling server
// each fail the create in one line naming the limit or the cause, and
// leave no partial file in the cache; a pod that names the digest being
// trickled waits no longer than its own create's deadline.
func TestDiskURLQuota(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*bootTimeout)
	defer cancel()
	h := &hostileDisks{halfway: bytes.Repeat([]byte("half"), 1<<18), bomb: zstdBomb(t), trickles: make(chan string, 4)}
	base := startHandlerServer(t, h)
	c := newCRI(t, env.daemon)

	for _, tc := range []struct {
		name, path, digest string
		want               []string
	}{
		{"bomb", "/bomb", digestOf(h.bomb), []string{"decompressed disk is larger than", "(config max_decompression_ratio)"}},
		{"halfway", "/halfway", digestOf(h.halfway), []string{base + "/halfway", "at 524288 bytes"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, vm, err := urlPod(ctx, t, c, "quota-"+tc.name, base+tc.path, tc.digest)
			if err == nil {
				t.Fatal("a VM started")
			}
			t.Logf("refused: %v", err)
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) || strings.Contains(err.Error(), "\n") {
					t.Errorf("want one line containing %q", w)
				}
			}
			if left := cacheTemps(tc.digest); len(left) != 0 {
				t.Errorf("left in the disk cache's tmp/: %v", left)
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

	t.Run("trickle", func(t *testing.T) {
		digest := digestOf([]byte("the trickled disk, never sent whole"))
		url := base + "/trickle"
		ann := map[string]string{annotationDiskURL: url, annotationDiskSHA256: digest}
		// The trickler's own create: its deadline ends its download.
		pa := c.runPodOn(ctx, t, runtimeHandler, "quota-trickler", 0, nil)
		va := pa.createVM(ctx, t, pauseImage, ann)
		actx, acancel := context.WithTimeout(ctx, 90*time.Second)
		defer acancel()
		aerr := make(chan error, 1)
		go func() {
			_, err := c.runtime.StartContainer(actx, &runtimeapi.StartContainerRequest{ContainerId: va.id})
			aerr <- err
		}()
		select {
		case <-h.trickles:
		case err := <-aerr:
			t.Fatalf("the trickled create ended before its download began: %v", err)
		}
		// Another pod names the same digest, with a create deadline
		// far shorter than the trickler's.
		pb := c.runPodOn(ctx, t, runtimeHandler, "quota-waiter", 0, nil)
		vb := pb.createVM(ctx, t, pauseImage, ann)
		bctx, bcancel := context.WithTimeout(ctx, 15*time.Second)
		_, err := c.runtime.StartContainer(bctx, &runtimeapi.StartContainerRequest{ContainerId: vb.id})
		bcancel()
		if err == nil {
			t.Fatal("the waiting pod's VM started")
		}
		t.Logf("waiter: %v", err)
		vb.waitLog(ctx, t, "waiting for another shim to download sha256:"+digest)
		// Its shim stops waiting at its deadline, while the trickler's
		// download goes on: then only the trickler's shim holds the
		// lock file open.
		for lockHolders(digest) > 1 {
			select {
			case err := <-aerr:
				t.Fatalf("the trickled create ended (%v) while the waiting shim still waited", err)
			case <-time.After(200 * time.Millisecond):
			}
		}
		if len(cacheTemps(digest)) == 0 {
			t.Fatal("the trickled download ended before the waiter gave up: the test proves nothing")
		}
		err = <-aerr
		if err == nil {
			t.Fatal("the trickled VM started")
		}
		t.Logf("trickler: %v", err)
		// The trickler's shim removes its partial file as its create
		// fails, at its own deadline.
		for len(cacheTemps(digest)) != 0 || lockHolders(digest) != 0 {
			select {
			case <-ctx.Done():
				t.Fatalf("left in the disk cache's tmp/: %v", cacheTemps(digest))
			case <-time.After(200 * time.Millisecond):
			}
		}
		st, err := c.runtime.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: va.id})
		if err == nil {
			msg := st.GetStatus().GetMessage()
			t.Logf("trickler's status: %s", msg)
			if strings.Contains(msg, "\n") {
				t.Errorf("the trickler's failure is not one line: %q", msg)
			}
		}
		for _, v := range []*criContainer{va, vb} {
			c.runtime.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: v.id})
		}
		pa.remove(t)
		pb.remove(t)
		assertNothingLeftCRI(t, va.id, vb.id)
	})
}
