// Command vmshim-pack packs a VM disk, or a kernel and initrd, into an OCI
// image in the KubeVirt containerDisk layout (/disk/disk.qcow2 or
// /disk/disk.img; kernels under /boot/), written as an archive that
// `ctr images import` and `nerdctl load` accept, or imported straight into
// a containerd namespace and unpacked. With --url it makes a pointer image
// instead: /disk/disk.url and /disk/disk.sha256, and no disk, which the
// shim downloads.
//
//	vmshim-pack --disk FILE --ref REF -o OUT.tar
//	vmshim-pack --kernel FILE [--initrd FILE] --ref REF -o OUT.tar
//	vmshim-pack --disk FILE --ref REF --import [--namespace NS]
//	vmshim-pack --url URL --sha256 HEX --ref REF -o OUT.tar
//
// Run `vmshim-pack -h` for every flag.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
)

// usageHead is printed before the flags by -h.
const usageHead = `usage: vmshim-pack (--disk FILE | --kernel FILE [--initrd FILE] | --url URL --sha256 HEX) --ref REF (-o OUT.tar | --import) [flags]

Packs a VM disk (qcow2 or raw) as /disk/disk.qcow2 or /disk/disk.img, or a
kernel (bzImage or x86-64 ELF) and initrd as /boot/vmlinuz or /boot/vmlinux
and /boot/initrd.img, into a one-layer OCI image for containerd-shim-vm-v2.
With --url and --sha256 it makes a pointer image instead: no disk, only
/disk/disk.url and /disk/disk.sha256; the shim downloads the disk from the
http(s) URL into the node's cache and checks its sha256 before use.

Examples:
  vmshim-pack --disk debian-12.qcow2 --ref localhost/vms/debian:12 -o debian.tar
  vmshim-pack --kernel vmlinux --initrd initrd.img --ref localhost/vms/tiny:1 -o tiny.tar
  vmshim-pack --disk debian-12.qcow2 --ref localhost/vms/debian:12 --import --namespace k8s.io
  vmshim-pack --disk debian-12-uefi.qcow2 --firmware uefi --ref localhost/vms/debian-uefi:12 -o debian-uefi.tar
  vmshim-pack --disk disk.raw --qcow2 --compression zstd --ref localhost/vms/raw:1 -o raw.tar
  vmshim-pack --disk debian-12.qcow2 --ref localhost/vms/debian:12 -o debian.tar \
      --label org.opencontainers.image.source=https://example.org/vms --description "Debian 12"
  vmshim-pack --url https://example.org/vms/debian-12.qcow2 --sha256 "$(cat debian-12.qcow2.sha256)" \
      --ref localhost/vms/debian-url:12 -o debian-url.tar

Flags:
`

// usageTail is printed after the flags by -h.
const usageTail = `
Environment:
  SOURCE_DATE_EPOCH     image creation time and file times, for reproducible archives
  CONTAINERD_ADDRESS    default of --address
  CONTAINERD_NAMESPACE  default of --namespace
  TMPDIR                where temporary files go when there is no -o
`

func main() {
	opts, err := parseFlags(os.Args[1:], os.Stderr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "vmshim-pack: %v\n", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err = pack(ctx, opts)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "vmshim-pack: %v\n", err)
		os.Exit(1)
	}
}

// parseFlags turns the command line into pack options; usage and progress
// go to stderr. -h prints the usage and exits.
func parseFlags(args []string, stderr *os.File) (packOptions, error) {
	var opts packOptions
	var importFlag bool
	var progressFlag string
	imp := importOptions{
		Address:   envOr("CONTAINERD_ADDRESS", defaultAddress),
		Namespace: envOr("CONTAINERD_NAMESPACE", defaultNamespace),
	}
	opts.Labels = map[string]string{}

	fs := flag.NewFlagSet("vmshim-pack", flag.ExitOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&opts.Disk, "disk", "", "qcow2 or raw disk `FILE`, packed as /disk/disk.qcow2 or /disk/disk.img")
	fs.StringVar(&opts.Kernel, "kernel", "", "kernel `FILE` (bzImage or ELF), packed as /boot/vmlinuz or /boot/vmlinux")
	fs.StringVar(&opts.Initrd, "initrd", "", "initrd `FILE`, packed as /boot/initrd.img (with --kernel)")
	fs.StringVar(&opts.URL, "url", "", "make a pointer image: the shim downloads the disk from the http or https `URL` (with --sha256; no --disk)")
	fs.StringVar(&opts.SHA256, "sha256", "", "sha256 of the disk at --url, as 64 hex digits (`HEX`, also sha256:HEX or a sha256sum line)")
	fs.StringVar(&opts.Ref, "ref", "", "image reference `REF`, e.g. localhost/vms/debian:12")
	fs.StringVar(&opts.Output, "o", "", "write the OCI archive to `FILE` (atomically)")
	fs.BoolVar(&importFlag, "import", false, "import the image into containerd and unpack it (with or without -o)")
	fs.StringVar(&imp.Address, "address", imp.Address, "containerd `SOCKET` for --import (env CONTAINERD_ADDRESS)")
	fs.StringVar(&imp.Namespace, "namespace", imp.Namespace, "containerd `NAMESPACE` for --import, e.g. k8s.io for the CRI (env CONTAINERD_NAMESPACE)")
	fs.StringVar(&imp.Snapshotter, "snapshotter", "", "`NAME` of the snapshotter --import unpacks for (default: containerd's default)")
	fs.StringVar(&opts.Compression, "compression", compressionGzip, "layer compression `NAME`: gzip or zstd")
	fs.IntVar(&opts.GzipLevel, "gzip-level", 6, "gzip `LEVEL`, 1 (fastest) to 9 (smallest)")
	fs.IntVar(&opts.ZstdLevel, "zstd-level", 3, "zstd `LEVEL`, 1 (fastest) to 22 (smallest), in four steps: 1-2, 3-5, 6-9, 10-22")
	fs.BoolVar(&opts.Qcow2, "qcow2", false, "convert a raw disk to qcow2 before packing (a temporary file next to -o)")
	fs.StringVar(&opts.QemuImg, "qemu-img", "qemu-img", "qemu-img `BINARY` for --qcow2")
	fs.Func("label", "add the image config label `KEY=VALUE` (repeatable; not io.vmshim.*)", func(s string) error {
		k, v, ok := strings.Cut(s, "=")
		if !ok || k == "" {
			return fmt.Errorf("want KEY=VALUE")
		}
		opts.Labels[k] = v
		return nil
	})
	fs.StringVar(&opts.Firmware, "firmware", "", "set the label io.vmshim.firmware: the `FIRMWARE` the disk boots with, bios, uefi or uefi-secure (the annotation vmshim.io/firmware wins over it)")
	fs.StringVar(&opts.Description, "description", "", "set the label org.opencontainers.image.description to `TEXT`")
	fs.StringVar(&progressFlag, "progress", "auto", "how to report the input bytes read on stderr, `MODE` auto (a live line when stderr is a terminal), plain (a line every 10%) or none")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usageHead)
		printFlags(fs.Output(), fs)
		fmt.Fprint(fs.Output(), usageTail)
	}
	_ = fs.Parse(args)
	if fs.NArg() > 0 {
		return opts, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if importFlag {
		opts.Import = &imp
	}
	if opts.URL != "" && flagSet(fs, "qemu-img") {
		return opts, fmt.Errorf("--qemu-img is for --qcow2, which converts a disk, and a pointer image (--url) holds none: %w", errdefs.ErrInvalidArgument)
	}
	mode, err := parseProgressMode(progressFlag, isTerminal(stderr.Fd()))
	if err != nil {
		return opts, err
	}
	opts.Progress = progressOptions{Mode: mode, Out: stderr}
	opts.Created, err = creationTime()
	return opts, err
}

// printFlags lists the flags of fs as the examples write them: two dashes,
// one for -o (the flag package takes either).
func printFlags(w io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		arg, usage := flag.UnquoteUsage(f)
		line := "  --" + f.Name
		if len(f.Name) == 1 {
			line = "  -" + f.Name
		}
		if arg != "" {
			line += " " + arg
		}
		if f.DefValue != "" && f.DefValue != "false" {
			usage += " (default " + f.DefValue + ")"
		}
		fmt.Fprintf(w, "%s\n    \t%s\n", line, usage)
	})
}

// flagSet reports whether the flag name was given on the command line.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// envOr is the environment variable key, or def when it is unset or empty.
func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// creationTime is SOURCE_DATE_EPOCH when set (reproducible archives), else now.
func creationTime() (time.Time, error) {
	v := os.Getenv("SOURCE_DATE_EPOCH")
	if v == "" {
		return time.Now(), nil
	}
	secs, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH %q is not a number of seconds", v)
	}
	return time.Unix(secs, 0), nil
}
