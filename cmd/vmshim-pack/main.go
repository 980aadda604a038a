// Command vmshim-pack packs a VM disk, or a kernel and initrd, into an OCI
// image archive that `ctr images import` and `nerdctl load` accept.
//
//	vmshim-pack --disk FILE --ref REF -o OUT.tar
//	vmshim-pack --kernel FILE [--initrd FILE] --ref REF -o OUT.tar
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"
)

func main() {
	var opts packOptions
	fs := flag.NewFlagSet("vmshim-pack", flag.ExitOnError)
	fs.StringVar(&opts.Disk, "disk", "", "qcow2 or raw disk `FILE`, packed as /disk/disk.qcow2 or /disk/disk.img")
	fs.StringVar(&opts.Kernel, "kernel", "", "kernel `FILE` (bzImage or ELF), packed as /boot/vmlinuz or /boot/vmlinux")
	fs.StringVar(&opts.Initrd, "initrd", "", "initrd `FILE`, packed as /boot/initrd.img (with --kernel)")
	fs.StringVar(&opts.Ref, "ref", "", "image reference, e.g. localhost/vm/debian:12")
	fs.StringVar(&opts.Output, "o", "", "output OCI archive `FILE`")
	fs.IntVar(&opts.GzipLevel, "gzip-level", 6, "layer gzip level, 1 (fastest) to 9 (smallest)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: vmshim-pack (--disk FILE | --kernel FILE [--initrd FILE]) --ref REF -o OUT.tar\n")
		fs.PrintDefaults()
	}
	_ = fs.Parse(os.Args[1:])
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "vmshim-pack: unexpected argument %q\n", fs.Arg(0))
		os.Exit(2)
	}
	created, err := creationTime()
	if err != nil {
		fmt.Fprintf(os.Stderr, "vmshim-pack: %v\n", err)
		os.Exit(2)
	}
	opts.Created = created

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err = pack(ctx, opts)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "vmshim-pack: %v\n", err)
		os.Exit(1)
	}
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
