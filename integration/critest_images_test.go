package integration

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The images critest pulls, under the names it asks for, rebuilt from
// their published definitions (cri-tools' images/ Dockerfiles and
// images/build script, Kubernetes' e2e test images) on Debian's static
// busybox. critestImages lists them.
const (
	critestStaging = "gcr.io/k8s-staging-cri-tools/"
	critestE2E     = "registry.k8s.io/e2e-test-images/"
)

// tarEntry is one file, directory or symlink of a layer.
type tarEntry struct {
	name     string // path without a leading slash
	mode     int64  // permission bits
	uid, gid int
	data     []byte // a regular file's content
	link     string // a symlink's target
	hardlink string // the path a hard link links to
	dir      bool
}

// busyboxPasswd and busyboxGroup are busybox 1.37.0's image's
// /etc/passwd and /etc/group.
const (
	busyboxPasswd = `root:x:0:0:root:/root:/bin/sh
daemon:x:1:1:daemon:/usr/sbin:/bin/false
bin:x:2:2:bin:/bin:/bin/false
sys:x:3:3:sys:/dev:/bin/false
sync:x:4:100:sync:/bin:/bin/sync
mail:x:8:8:mail:/var/spool/mail:/bin/false
www-data:x:33:33:www-data:/var/www:/bin/false
operator:x:37:37:Operator:/var:/bin/false
nobody:x:65534:65534:nobody:/home:/bin/false
`
	busyboxGroup = `root:x:0:
daemon:x:1:
bin:x:2:
sys:x:3:
adm:x:4:
tty:x:5:
disk:x:6:
lp:x:7:
mail:x:8:
kmem:x:9:
wheel:x:10:root
cdrom:x:11:
dialout:x:18:
floppy:x:19:
video:x:28:
audio:x:29:
tape:x:32:
www-data:x:33:
operator:x:37:
utmp:x:43:
plugdev:x:46:
staff:x:50:
lock:x:54:
netdev:x:82:
users:x:100:
nogroup:x:65534:
`
)

// Applets of busybox's own image that Debian's busybox-static leaves
// out and critest runs, as shell scripts over /proc.
const (
	pgrepScript = `#!/bin/sh
# pgrep PATTERN: the pids of the processes whose name holds PATTERN.
found=1
for d in /proc/[0-9]*; do
	read -r name < "$d/comm" 2>/dev/null || continue
	case "$name" in *"$1"*) [ "${d#/proc/}" = "$$" ] || { echo "${d#/proc/}"; found=0; } ;; esac
done
exit $found
`
	ipcsScript = `#!/bin/sh
# ipcs -m: the shared memory segments of the IPC namespace.
echo "------ Shared Memory Segments --------"
cat /proc/sysvipc/shm
`
)

// nginxScript stands in for nginx in the nginx images: busybox httpd
// serves /usr/share/nginx/html on the port of
// /etc/nginx/conf.d/default.conf. As nginx's master process, it holds
// "master process" in its command line, is named nginx and writes
// /var/run/nginx.pid.
const nginxScript = `#!/bin/sh
[ "$1" = "master process" ] || exec /usr/sbin/nginx "master process" "$@"
port=$(sed -n 's/^[[:space:]]*listen[[:space:]]*\([0-9]*\);.*/\1/p' /etc/nginx/conf.d/default.conf | head -n 1)
echo $$ > /var/run/nginx.pid
httpd -f -p "${port:-80}" -h /usr/share/nginx/html &
trap 'kill $!; exit 0' TERM INT QUIT
wait
`

// httpdScript stands in for Apache's httpd-foreground: busybox httpd
// serves /usr/local/apache2/htdocs on port 80, and says on stderr, as
// Apache does, that httpd started.
const httpdScript = `#!/bin/sh
echo "httpd: serving /usr/local/apache2/htdocs on port 80" >&2
exec httpd -f -p 80 -h /usr/local/apache2/htdocs
`

// nginxConf is default.conf of the nginx image; hostnet-nginx's
// default.conf listens on 12003 instead.
const nginxConf = `server {
    listen       %d;
    server_name  localhost;
    location / {
        root   /usr/share/nginx/html;
        index  index.html index.htm;
    }
}
`

// busyboxPath is the PATH of busybox's image.
const busyboxPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// busyboxLayer is busybox's image: Debian's static busybox at
// /bin/busybox, a hard link to it for each applet (as busybox's image
// has: masking /bin/ls must not mask the shell), the stand-ins for the
// applets it lacks, and busybox's /etc/passwd, /etc/group and
// directories.
func busyboxLayer() ([]tarEntry, error) {
	bin, err := os.ReadFile("/bin/busybox")
	if err != nil {
		return nil, err
	}
	out, err := exec.Command("/bin/busybox", "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("busybox --list: %w", err)
	}
	entries := []tarEntry{
		{name: "bin", dir: true, mode: 0o755}, {name: "dev", dir: true, mode: 0o755},
		{name: "etc", dir: true, mode: 0o755}, {name: "home", dir: true, mode: 0o755},
		{name: "root", dir: true, mode: 0o700}, {name: "tmp", dir: true, mode: 0o1777},
		{name: "usr", dir: true, mode: 0o755}, {name: "usr/sbin", dir: true, mode: 0o755},
		{name: "var", dir: true, mode: 0o755}, {name: "var/run", dir: true, mode: 0o755},
		{name: "var/spool", dir: true, mode: 0o755}, {name: "var/spool/mail", dir: true, mode: 0o755},
		{name: "var/www", dir: true, mode: 0o755},
		{name: "bin/busybox", mode: 0o755, data: bin},
		{name: "bin/pgrep", mode: 0o755, data: []byte(pgrepScript)},
		{name: "bin/ipcs", mode: 0o755, data: []byte(ipcsScript)},
		{name: "etc/passwd", mode: 0o644, data: []byte(busyboxPasswd)},
		{name: "etc/group", mode: 0o644, data: []byte(busyboxGroup)},
	}
	for _, applet := range strings.Fields(string(out)) {
		if applet != "busybox" && !strings.Contains(applet, "/") {
			entries = append(entries, tarEntry{name: "bin/" + applet, hardlink: "bin/busybox", mode: 0o755})
		}
	}
	return entries, nil
}

// layerOf makes a gzip-compressed OCI layer of entries, parents first.
func layerOf(entries []tarEntry) (v1.Layer, error) {
	// Parents first, and hard links after what they link to.
	sort.SliceStable(entries, func(i, j int) bool {
		if a, b := entries[i].hardlink != "", entries[j].hardlink != ""; a != b {
			return b
		}
		return entries[i].name < entries[j].name
	})
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: e.mode, Uid: e.uid, Gid: e.gid, Typeflag: tar.TypeReg, Size: int64(len(e.data))}
		switch {
		case e.dir:
			h.Typeflag, h.Name, h.Size = tar.TypeDir, e.name+"/", 0
		case e.link != "":
			h.Typeflag, h.Linkname, h.Size = tar.TypeSymlink, e.link, 0
		case e.hardlink != "":
			h.Typeflag, h.Linkname, h.Size = tar.TypeLink, e.hardlink, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil },
		tarball.WithMediaType(types.OCILayer))
}

// imageOf makes an OCI image for linux/amd64 with config cfg and layers.
func imageOf(cfg v1.Config, layers ...v1.Layer) (v1.Image, error) {
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err := mutate.ConfigFile(img, &v1.ConfigFile{Architecture: "amd64", OS: "linux", Config: cfg,
		RootFS: v1.RootFS{Type: "layers"}})
	if err != nil {
		return nil, err
	}
	return mutate.AppendLayers(img, layers...)
}

// fileLayer is a layer of one empty file at /name, as the image-test
// Dockerfile's `ADD ${TEST} ${TEST}` adds.
func fileLayer(name string) (v1.Layer, error) {
	return layerOf([]tarEntry{{name: name, mode: 0o644}})
}

// critestImages builds the images critest pulls, by the references it
// pulls them by; pauseBin is the pause program of the pause image, nnpBin
// the program of the nonewprivs image (buildNNP). test-image-digest is
// missing: critest pulls it by a published digest.
func critestImages(pauseBin, nnpBin string) (map[string]v1.Image, error) {
	entries, err := busyboxLayer()
	if err != nil {
		return nil, err
	}
	base, err := layerOf(entries)
	if err != nil {
		return nil, err
	}
	shell := v1.Config{Cmd: []string{"sh"}, Env: []string{busyboxPath}}
	images := map[string]v1.Image{}
	add := func(ref string, cfg v1.Config, layers ...v1.Layer) {
		if err != nil {
			return
		}
		images[ref], err = imageOf(cfg, append([]v1.Layer{base}, layers...)...)
	}
	// The e2e busybox: busybox's own image.
	add(critestE2E+"busybox:1.29-2", shell)
	// image-test: busybox with the empty file named by its TEST argument.
	for ref, file := range map[string]string{
		"test-image-1:latest": "test-image-1", "test-image-2:latest": "test-image-2", "test-image-3:latest": "test-image-3",
		"test-image-latest:latest": "test-image-latest", "test-image-tag:test": "test", "test-image-tag:all": "all",
	} {
		var l v1.Layer
		if l, err = fileLayer(file); err == nil {
			add(critestStaging+ref, shell, l)
		}
	}
	// test-image-tags: one image under three tags.
	same, err := fileLayer("same-image")
	add(critestStaging+"test-image-tags:1", shell, same)
	images[critestStaging+"test-image-tags:2"] = images[critestStaging+"test-image-tags:1"]
	images[critestStaging+"test-image-tags:3"] = images[critestStaging+"test-image-tags:1"]
	// image-user: busybox with USER set to the build's USER argument.
	for name, user := range map[string]string{"test-image-user-uid": "1002", "test-image-user-username": "www-data",
		"test-image-user-uid-group": "1003:1004", "test-image-user-username-group": "www-data:1004"} {
		cfg := shell
		cfg.User = user
		add(critestStaging+name+":latest", cfg)
	}
	// image-predefined-group: `adduser -u 1000 -D default-user`,
	// `addgroup -g 50000 group-defined-in-image`, `addgroup default-user
	// group-defined-in-image`, USER 1000.
	group, err := layerOf([]tarEntry{
		{name: "etc", dir: true, mode: 0o755}, {name: "home", dir: true, mode: 0o755},
		{name: "home/default-user", dir: true, mode: 0o755, uid: 1000, gid: 1000},
		{name: "etc/passwd", mode: 0o644, data: []byte(busyboxPasswd + "default-user:x:1000:1000:Linux User,,,:/home/default-user:/bin/sh\n")},
		{name: "etc/group", mode: 0o644, data: []byte(busyboxGroup + "default-user:x:1000:\ngroup-defined-in-image:x:50000:default-user\n")},
	})
	predefined := shell
	predefined.User = "1000"
	add(critestStaging+"test-image-predefined-group:latest", predefined, group)
	// The web servers: nginx (e2e nginx, and hostnet-nginx, whose
	// default.conf listens on 12003) and Apache httpd, each a busybox
	// httpd behind a script of the server's name.
	for ref, port := range map[string]int{critestE2E + "nginx:1.14-2": 80, critestStaging + "hostnet-nginx-amd64:latest": 12003} {
		var l v1.Layer
		l, err = layerOf([]tarEntry{
			{name: "etc", dir: true, mode: 0o755}, {name: "etc/nginx", dir: true, mode: 0o755},
			{name: "etc/nginx/conf.d", dir: true, mode: 0o755},
			{name: "etc/nginx/conf.d/default.conf", mode: 0o644, data: fmt.Appendf(nil, nginxConf, port)},
			{name: "usr", dir: true, mode: 0o755}, {name: "usr/sbin", dir: true, mode: 0o755},
			{name: "usr/sbin/nginx", mode: 0o755, data: []byte(nginxScript)},
			{name: "usr/share", dir: true, mode: 0o755}, {name: "usr/share/nginx", dir: true, mode: 0o755},
			{name: "usr/share/nginx/html", dir: true, mode: 0o755},
			{name: "usr/share/nginx/html/index.html", mode: 0o644, data: []byte("<h1>Welcome to nginx!</h1>\n")},
		})
		add(ref, v1.Config{Cmd: []string{"nginx", "-g", "daemon off;"}, Env: []string{busyboxPath},
			ExposedPorts: map[string]struct{}{fmt.Sprintf("%d/tcp", port): {}}}, l)
	}
	var apache v1.Layer
	if apache, err = httpdLayer(); err == nil {
		add(critestE2E+"httpd:2.4.39-4", v1.Config{Cmd: []string{"httpd-foreground"}, WorkingDir: "/usr/local/apache2",
			Env:          []string{"PATH=/usr/local/apache2/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
			ExposedPorts: map[string]struct{}{"80/tcp": {}}}, apache)
	}
	// nonewprivs: nnp, set-user-ID root, which prints its effective uid.
	if err == nil {
		var nnp []byte
		if nnp, err = os.ReadFile(nnpBin); err != nil {
			return nil, err
		}
		var l v1.Layer
		l, err = layerOf([]tarEntry{
			{name: "usr", dir: true, mode: 0o755}, {name: "usr/local", dir: true, mode: 0o755},
			{name: "usr/local/bin", dir: true, mode: 0o755}, {name: "usr/local/bin/nnp", mode: 0o4755 | 0o2000, data: nnp},
		})
		add(critestE2E+"nonewprivs:1.3", v1.Config{Cmd: []string{"nnp"}, Env: []string{busyboxPath}}, l)
	}
	// The pause image, from two registries: the project's pause program.
	if err == nil {
		pause, perr := pauseLayer(pauseBin)
		if perr != nil {
			return nil, perr
		}
		images["registry.k8s.io/pause:3.9"], err = imageOf(v1.Config{Entrypoint: []string{"/pause"}, User: "65535:65535"}, pause)
		images["k8s.gcr.io/pause:3.9"] = images["registry.k8s.io/pause:3.9"]
	}
	return images, err
}

// httpdLayer is the layer of Apache httpd's image: its stand-in and the
// page it serves.
func httpdLayer() (v1.Layer, error) {
	var entries []tarEntry
	for _, d := range []string{"usr", "usr/local", "usr/local/apache2", "usr/local/apache2/bin", "usr/local/apache2/htdocs"} {
		entries = append(entries, tarEntry{name: d, dir: true, mode: 0o755})
	}
	return layerOf(append(entries,
		tarEntry{name: "usr/local/apache2/bin/httpd-foreground", mode: 0o755, data: []byte(httpdScript)},
		tarEntry{name: "usr/local/apache2/htdocs/index.html", mode: 0o644, data: []byte("<html><body><h1>It works!</h1></body></html>\n")}))
}

// pauseLayer is the layer of the pause image: the program at /pause.
func pauseLayer(bin string) (v1.Layer, error) {
	data, err := os.ReadFile(bin)
	if err != nil {
		return nil, err
	}
	return layerOf([]tarEntry{{name: "pause", mode: 0o755, data: data}})
}

// nnpSource is nonewprivs' program.
const nnpSource = `package main

import (
	"fmt"
	"os"
)

func main() { fmt.Printf("Effective uid: %d\n", os.Geteuid()) }
`

// buildNNP builds nonewprivs' program, static, in dir and returns its
// path.
func buildNNP(ctx context.Context, dir string) (string, error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	if err := os.WriteFile(filepath.Join(dir, "nnp.go"), []byte(nnpSource), 0o644); err != nil {
		return "", err
	}
	out := filepath.Join(dir, "nnp")
	cmd := exec.CommandContext(ctx, goBin, "build", "-o", out, "nnp.go")
	cmd.Dir, cmd.Env = dir, append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-buildvcs=false")
	if msg, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build nnp: %v: %s", err, msg)
	}
	return out, nil
}

// pauseProgram is the project's pause program in the suite's binaries.
func pauseProgram() string { return filepath.Join(env.binDir, "vmshim-pause") }
