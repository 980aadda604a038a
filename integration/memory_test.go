package integration

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// memory is a process's resident memory, split the way a VM pod's host
// cost is reckoned.
type memory struct {
	rssKiB      int // all resident memory
	guestKiB    int // resident part of the guest RAM mapping
	guestPSSKiB int // the guest RAM mapping's proportional share (below guestKiB where KSM merged pages)
	guestTHPKiB int // the resident part of guest RAM in transparent huge pages
}

// overheadKiB is what the process costs the host beyond guest RAM.
func (m memory) overheadKiB() int { return m.rssKiB - m.guestKiB }

// processMemory reads /proc/PID/smaps; the mapping of exactly guestMiB is
// taken as guest RAM (QEMU maps it in one piece).
func processMemory(pid, guestMiB int) (memory, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		return memory{}, err
	}
	defer f.Close()
	var m memory
	var size int
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		n, _ := strconv.Atoi(fields[1])
		switch fields[0] {
		case "Size:":
			size = n
		case "Rss:":
			m.rssKiB += n
			if guestMiB > 0 && size == guestMiB*1024 {
				m.guestKiB += n
			}
		case "Pss:":
			if guestMiB > 0 && size == guestMiB*1024 {
				m.guestPSSKiB += n
			}
		case "AnonHugePages:":
			if guestMiB > 0 && size == guestMiB*1024 {
				m.guestTHPKiB += n
			}
		}
	}
	return m, sc.Err()
}

// pidOf returns the pid of the one process whose command line contains s.
func pidOf(s string) (int, error) {
	procs := processesMentioning(s)
	if len(procs) != 1 {
		return 0, fmt.Errorf("processes mentioning %q: %v", s, procs)
	}
	pid, _, _ := strings.Cut(procs[0], ":")
	return strconv.Atoi(pid)
}
