package image

import (
	"context"
	"encoding/json"
	"fmt"
	"os"

	"github.com/containerd/log"
	"golang.org/x/sys/unix"
)

// Info describes a disk image that Inspect accepted.
type Info struct {
	Format      string // "qcow2" or "raw", as pinned by Find
	VirtualSize int64  // bytes the guest sees
	ActualSize  int64  // bytes allocated on the host
}

// Limits bounds what Inspect accepts.
type Limits struct {
	MaxVirtualSize int64 // bytes; 0 = no limit
}

// qemu-img check exit codes (see qemu-img(1)).
const (
	checkOK        = 0
	checkFailed    = 1
	checkCorrupt   = 2
	checkLeaksOnly = 3
)

// imgInfo is the part of `qemu-img info --output=json` Inspect reads.
// Pointers tell a missing key from an empty value.
type imgInfo struct {
	Format              string  `json:"format"`
	VirtualSize         int64   `json:"virtual-size"`
	ActualSize          int64   `json:"actual-size"`
	Encrypted           bool    `json:"encrypted"`
	BackingFilename     *string `json:"backing-filename"`
	FullBackingFilename *string `json:"full-backing-filename"`
	BackingFormat       *string `json:"backing-filename-format"`
	FormatSpecific      struct {
		Data struct {
			DataFile    *string `json:"data-file"`
			DataFileRaw *bool   `json:"data-file-raw"`
			Corrupt     bool    `json:"corrupt"`
		} `json:"data"`
	} `json:"format-specific"`
}

// imgCheck is the part of `qemu-img check --output=json` Inspect reads.
type imgCheck struct {
	CheckErrors int `json:"check-errors"`
	Corruptions int `json:"corruptions"`
	Leaks       int `json:"leaks"`
}

// Inspect runs `qemu-img info --output=json -f FORMAT PATH` (format pinned)
// and, for qcow2, `qemu-img check -f qcow2 --output=json PATH`, and refuses
// unsafe or unusable disks: a backing file, an external data file, an
// encrypted, corrupt or truncated image, an empty one, or one whose virtual
// size exceeds lim. Both commands open the image read-only; neither is given
// -U, because a read-only open only takes shared locks, which other VMs
// using the same base read-only do not block.
func Inspect(ctx context.Context, q QEMUImg, b *Boot, lim Limits) (*Info, error) {
	if b == nil || b.Disk == "" || b.DiskFile == nil {
		return nil, invalidf("inspect: no disk (kernel boot has nothing to inspect)")
	}
	name := b.InImage(b.Disk)
	if b.Format != FormatQCOW2 && b.Format != FormatRaw {
		return nil, invalidf("disk %s: format %q is not qcow2 or raw", name, b.Format)
	}
	disk := []imgFile{{name: "disk", label: name, f: b.DiskFile}}
	groups, err := readGroups(q, b.DiskFile, name)
	if err != nil {
		return nil, err
	}
	res, err := q.run(ctx, disk, groups, "info", "--output=json", "-f", b.Format, "@disk")
	if err != nil {
		return nil, fmt.Errorf("disk %s: %w", name, err)
	}
	if res.code != 0 {
		return nil, invalidf("disk %s: not a usable %s image: %s", name, b.Format, message(res.stderr, b.Root))
	}
	var ii imgInfo
	if err := json.Unmarshal(res.stdout, &ii); err != nil {
		return nil, preconditionf("disk %s: qemu-img info: unexpected output: %v", name, err)
	}
	if err := refuse(name, b.Format, &ii, lim); err != nil {
		return nil, err
	}
	if b.Format == FormatQCOW2 {
		if err := check(ctx, q, disk, groups, b, name); err != nil {
			return nil, err
		}
	}
	return &Info{Format: b.Format, VirtualSize: ii.VirtualSize, ActualSize: ii.ActualSize}, nil
}

// refuse applies the rules that need only qemu-img info's answer.
func refuse(name, format string, ii *imgInfo, lim Limits) error {
	data := ii.FormatSpecific.Data
	switch {
	case ii.Format != format:
		return invalidf("disk %s: qemu-img reports format %q, expected %q", name, ii.Format, format)
	case ii.BackingFilename != nil || ii.FullBackingFilename != nil || ii.BackingFormat != nil:
		return invalidf("disk %s: image has a backing file %q; a VM image must be self-contained", name, deref(ii.BackingFilename))
	case data.DataFile != nil || data.DataFileRaw != nil:
		return invalidf("disk %s: image uses an external data file %q; a VM image must be self-contained", name, deref(data.DataFile))
	case ii.Encrypted:
		return invalidf("disk %s: image is encrypted", name)
	case data.Corrupt:
		return invalidf("disk %s: image is corrupt: marked corrupt in its header", name)
	case ii.VirtualSize <= 0:
		return invalidf("disk %s: image is empty (virtual size 0)", name)
	case lim.MaxVirtualSize > 0 && ii.VirtualSize > lim.MaxVirtualSize:
		return invalidf("disk %s: virtual size %s is more than the limit %s", name, formatSize(ii.VirtualSize), formatSize(lim.MaxVirtualSize))
	}
	return nil
}

// check runs qemu-img check on a qcow2 disk; leaked clusters are harmless
// (space is wasted, never misread) and are only logged.
func check(ctx context.Context, q QEMUImg, disk []imgFile, groups []uint32, b *Boot, name string) error {
	res, err := q.run(ctx, disk, groups, "check", "-f", FormatQCOW2, "--output=json", "@disk")
	if err != nil {
		return fmt.Errorf("disk %s: %w", name, err)
	}
	var ic imgCheck
	parsed := json.Unmarshal(res.stdout, &ic) == nil
	switch {
	case res.code == checkCorrupt || (parsed && ic.Corruptions > 0):
		return invalidf("disk %s: image is corrupt: %d corruptions: %s", name, ic.Corruptions, message(res.stderr, b.Root))
	case res.code == checkFailed || (parsed && ic.CheckErrors > 0):
		return invalidf("disk %s: image check failed: %s", name, message(res.stderr, b.Root))
	case res.code == checkLeaksOnly:
		log.G(ctx).WithField("disk", name).Infof("qcow2 image has %d leaked clusters; using it anyway", ic.Leaks)
	case res.code != checkOK:
		return invalidf("disk %s: qemu-img check exited with %d: %s", name, res.code, message(res.stderr, b.Root))
	case !parsed:
		return preconditionf("disk %s: qemu-img check: unexpected output", name)
	}
	return nil
}

// readGroups returns the supplementary group a jailed qemu-img needs to
// read f: none when others may read it or it is the jail's own (a disk
// the shim made for the VM), f's group when only its group
// may (KubeVirt's containerDisks are 0440, owned by 107:107); an error when
// only its owner, or only root's group, may read it.
func readGroups(q QEMUImg, f *os.File, name string) ([]uint32, error) {
	if q.Jail == nil {
		return nil, nil
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil, fmt.Errorf("disk %s: %w", name, err)
	}
	switch {
	case st.Mode&0o004 != 0, st.Mode&0o400 != 0 && st.Uid == q.Jail.UID:
		return nil, nil
	case st.Mode&0o040 != 0 && st.Gid != 0:
		return []uint32{st.Gid}, nil
	}
	return nil, invalidf("disk %s: mode %04o, owner %d:%d: vmshim checks images as an unprivileged user, which cannot read it; make the file readable by others, or by a group other than root's",
		name, st.Mode&0o7777, st.Uid, st.Gid)
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// formatSize prints n in the largest binary unit that divides it exactly
// (as Kubernetes quantities do), else in bytes.
func formatSize(n int64) string {
	units := []struct {
		suffix string
		shift  uint
	}{{"Ei", 60}, {"Pi", 50}, {"Ti", 40}, {"Gi", 30}, {"Mi", 20}, {"Ki", 10}}
	for _, u := range units {
		if n != 0 && n%(1<<u.shift) == 0 {
			return fmt.Sprintf("%d%s", n>>u.shift, u.suffix)
		}
	}
	return fmt.Sprintf("%d bytes", n)
}
