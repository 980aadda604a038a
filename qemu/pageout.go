package qemu

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// madvPageout is MADV_PAGEOUT (Linux 5.4): reclaim the pages of a range now.
const madvPageout = 21

// FileID names a file by device and inode, as /proc/PID/maps does.
type FileID struct{ dev, ino uint64 }

// FileIDOf is f's FileID.
func FileIDOf(f *os.File) (FileID, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return FileID{}, fmt.Errorf("stat %s: %w", f.Name(), err)
	}
	return FileID{st.Dev, st.Ino}, nil
}

// PageOut asks the kernel to reclaim QEMU's pages of the files given,
// the kernel and initrd of a direct kernel boot. QEMU keeps them mapped
// for as long as it runs, to load them again at a reset, but from its
// first reset, before the guest runs, the guest has its own copy in its
// RAM: until the next reset the pages only count against the VM (an
// uncompressed kernel is tens of MiB). They come back from the files if
// QEMU reads them again. Pages that another process maps too, another
// VM's of the same image, are left where they are. It needs Linux 5.10
// (process_madvise).
func (v *VM) PageOut(files ...FileID) error {
	if len(files) == 0 {
		return nil
	}
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", v.Pid()))
	if err != nil {
		return fmt.Errorf("page out qemu's files: %w", err)
	}
	// struct iovec, with addresses in QEMU's memory, not ours.
	type remoteIovec struct{ base, len uintptr }
	var iov []remoteIovec
	for _, m := range fileMappings(maps) {
		for _, f := range files {
			if m.dev == f.dev && m.ino == f.ino {
				iov = append(iov, remoteIovec{uintptr(m.start), uintptr(m.end - m.start)})
			}
		}
	}
	if len(iov) == 0 {
		return nil
	}
	pidfd, err := unix.PidfdOpen(v.Pid(), 0)
	if err != nil {
		return fmt.Errorf("page out qemu's files: pidfd of %d: %w", v.Pid(), err)
	}
	defer unix.Close(pidfd)
	_, _, errno := unix.Syscall6(unix.SYS_PROCESS_MADVISE, uintptr(pidfd),
		uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)), madvPageout, 0, 0)
	if errno != 0 {
		return fmt.Errorf("page out qemu's files: process_madvise: %w", errno)
	}
	return nil
}

// mapping is a file mapping of /proc/PID/maps.
type mapping struct {
	start, end uint64
	dev, ino   uint64
}

// fileMappings parses /proc/PID/maps: "start-end perms offset major:minor
// inode [path]", in hex but the inode. Anonymous mappings (inode 0) and
// malformed lines are left out.
func fileMappings(maps []byte) []mapping {
	var out []mapping
	sc := bufio.NewScanner(bytes.NewReader(maps))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 5 {
			continue
		}
		lo, hi, ok := strings.Cut(f[0], "-")
		major, minor, ok2 := strings.Cut(f[3], ":")
		if !ok || !ok2 {
			continue
		}
		var m mapping
		var errs [5]error
		m.start, errs[0] = strconv.ParseUint(lo, 16, 64)
		m.end, errs[1] = strconv.ParseUint(hi, 16, 64)
		maj, e2 := strconv.ParseUint(major, 16, 32)
		min, e3 := strconv.ParseUint(minor, 16, 32)
		errs[2], errs[3] = e2, e3
		m.ino, errs[4] = strconv.ParseUint(f[4], 10, 64)
		if errors.Join(errs[:]...) != nil || m.ino == 0 || m.end <= m.start {
			continue
		}
		m.dev = unix.Mkdev(uint32(maj), uint32(min))
		out = append(out, m)
	}
	return out
}
