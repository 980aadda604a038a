// Package procmem asks the kernel to take back file pages that a process
// keeps mapped but no longer needs: QEMU's copy of a direct boot's kernel
// and initrd, and the pages of the shim's own program that only setting a
// VM up used. It reads the process's /proc/PID/maps to find them.
package procmem

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// madvPageout is MADV_PAGEOUT (Linux 5.4): reclaim the pages of a range now.
const madvPageout = 21

// FileID names a file by device and inode, as /proc/PID/maps does.
type FileID struct{ Dev, Ino uint64 }

// FileIDOf is f's FileID.
func FileIDOf(f *os.File) (FileID, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return FileID{}, fmt.Errorf("stat %s: %w", f.Name(), err)
	}
	return FileID{st.Dev, st.Ino}, nil
}

// Mapping is a file mapping of /proc/PID/maps.
type Mapping struct {
	Start, End uint64
	// Perms is the mapping's "rwxp" field, such as "r-xp".
	Perms string
	File  FileID
	// AnonymousKiB is, from /proc/PID/smaps, how much of a private
	// mapping the process has its own copies of, written since the file
	// was mapped (0 from /proc/PID/maps).
	AnonymousKiB uint64
}

// Writable reports whether the process can write the mapping's pages, so
// that they may differ from the file's.
func (m Mapping) Writable() bool { return strings.Contains(m.Perms, "w") }

// FileMappings parses /proc/PID/maps or /proc/PID/smaps: a line
// "start-end perms offset major:minor inode [path]", in hex but the inode,
// per mapping, which smaps follows with "Field: value" lines. Anonymous
// mappings (inode 0) and malformed lines are left out.
func FileMappings(maps []byte) []Mapping {
	var out []Mapping
	var last *Mapping // the mapping the smaps fields that follow are of
	sc := bufio.NewScanner(bytes.NewReader(maps))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) > 0 && strings.HasSuffix(f[0], ":") {
			if last != nil && f[0] == "Anonymous:" && len(f) >= 2 {
				n, err := strconv.ParseUint(f[1], 10, 64)
				if err != nil {
					n = ^uint64(0) // unknown: as if all its own
				}
				last.AnonymousKiB = n
			}
			continue
		}
		last = nil
		if len(f) < 5 || len(f[1]) != 4 {
			continue
		}
		lo, hi, ok := strings.Cut(f[0], "-")
		major, minor, ok2 := strings.Cut(f[3], ":")
		if !ok || !ok2 {
			continue
		}
		m := Mapping{Perms: f[1]}
		var errs [5]error
		m.Start, errs[0] = strconv.ParseUint(lo, 16, 64)
		m.End, errs[1] = strconv.ParseUint(hi, 16, 64)
		maj, e2 := strconv.ParseUint(major, 16, 32)
		min, e3 := strconv.ParseUint(minor, 16, 32)
		errs[2], errs[3] = e2, e3
		m.File.Ino, errs[4] = strconv.ParseUint(f[4], 10, 64)
		if errors.Join(errs[:]...) != nil || m.File.Ino == 0 || m.End <= m.Start {
			continue
		}
		m.File.Dev = unix.Mkdev(uint32(maj), uint32(min))
		out = append(out, m)
		last = &out[len(out)-1]
	}
	return out
}

// PageOut asks the kernel to reclaim process pid's pages of the files
// given, now (process_madvise MADV_PAGEOUT, Linux 5.10). The pages come
// back from the files if the process reads them again. Pages that another
// process maps too are left where they are.
func PageOut(pid int, files ...FileID) error {
	if len(files) == 0 {
		return nil
	}
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return err
	}
	// struct iovec, with addresses in the other process's memory.
	type remoteIovec struct{ base, len uintptr }
	var iov []remoteIovec
	for _, m := range FileMappings(maps) {
		for _, f := range files {
			if m.File == f {
				iov = append(iov, remoteIovec{uintptr(m.Start), uintptr(m.End - m.Start)})
			}
		}
	}
	if len(iov) == 0 {
		return nil
	}
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return fmt.Errorf("pidfd of %d: %w", pid, err)
	}
	defer unix.Close(pidfd)
	_, _, errno := unix.Syscall6(unix.SYS_PROCESS_MADVISE, uintptr(pidfd),
		uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)), madvPageout, 0, 0)
	if errno != 0 {
		return fmt.Errorf("process_madvise: %w", errno)
	}
	return nil
}

// ReleaseOwn gives back what this process holds only because of work it
// has finished: it unmaps the read-only mappings of its own executable
// (its code and constant data; MADV_DONTNEED) and returns the Go heap's
// free pages to the kernel. Unmapped pages stay in the page cache, shared
// with every other process of the same program, and the kernel can
// reclaim them when memory is short, which it does not do for pages a
// process maps; the process maps again, from the page cache, the ones it
// runs next. It returns the bytes of the mappings released.
func ReleaseOwn() (uint64, error) {
	// First, as its collection maps the type data and code tables the
	// heap and stacks need.
	debug.FreeOSMemory()
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/exe", &st); err != nil {
		return 0, fmt.Errorf("stat own executable: %w", err)
	}
	smaps, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		return 0, err
	}
	exe := FileID{st.Dev, st.Ino}
	var released uint64
	for _, m := range FileMappings(smaps) {
		// A private mapping that is or was writable (relocated data,
		// made read-only after) holds the process's own copies of pages
		// it wrote: dropping them would lose them.
		if m.File != exe || m.Writable() || m.AnonymousKiB != 0 {
			continue
		}
		if _, _, errno := unix.Syscall(unix.SYS_MADVISE, uintptr(m.Start), uintptr(m.End-m.Start), unix.MADV_DONTNEED); errno != 0 {
			return released, fmt.Errorf("madvise %x-%x: %w", m.Start, m.End, errno)
		}
		released += m.End - m.Start
	}
	return released, nil
}
