package jail

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// reapLimit bounds how long KillID goes on killing what a jail id left.
const reapLimit = 5 * time.Second

// ReleaseEmpty gives back id as Release does, but only once no process
// is left that runs with it: it first kills every process whose uid or
// gid (real, effective, saved or filesystem) is id, and tells killed
// which. An id of 0 does so for each claim owner holds. A process that
// outlives the kill keeps the claim, and the error says so.
func ReleaseEmpty(dir string, id uint32, owner string, killed func(id uint32, pids []int)) error {
	ids := []uint32{id}
	if id == 0 {
		var err error
		if ids, err = ownedIDs(dir, owner); err != nil {
			return err
		}
	}
	for _, id := range ids {
		data, err := os.ReadFile(idFile(dir, id))
		if errors.Is(err, os.ErrNotExist) || (err == nil && string(data) != owner) {
			continue // not ours: its processes are another VM's
		}
		if err != nil {
			return fmt.Errorf("release id %d: %w", id, err)
		}
		pids, err := KillID("/proc", id, reapLimit)
		if len(pids) > 0 && killed != nil {
			killed(id, pids)
		}
		if err != nil {
			return fmt.Errorf("release id %d: %w", id, err)
		}
		if err := Release(dir, id, owner); err != nil {
			return err
		}
	}
	return nil
}

// ownedIDs lists the ids whose claim in dir owner holds.
func ownedIDs(dir, owner string) ([]uint32, error) {
	if owner == "" {
		return nil, nil
	}
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("release ids of %s: %w", owner, err)
	}
	var ids []uint32
	for _, e := range entries {
		id, err := strconv.ParseUint(e.Name(), 10, 32)
		if err != nil || id == 0 || !e.Type().IsRegular() {
			continue
		}
		if data, err := os.ReadFile(idFile(dir, uint32(id))); err == nil && string(data) == owner {
			ids = append(ids, uint32(id))
		}
	}
	return ids, nil
}

// KillID sends SIGKILL to every process under proc (a procfs) that runs
// with id as a uid or gid, again and again until none is left (a process
// may fork while it is killed), for at most limit. It returns the pids
// it killed; zombies, which hold nothing, are left to their parents.
func KillID(proc string, id uint32, limit time.Duration) ([]int, error) {
	deadline := time.Now().Add(limit)
	var killed []int
	seen := map[int]bool{}
	for {
		pids, err := idProcesses(proc, id)
		if err != nil {
			return killed, err
		}
		if len(pids) == 0 {
			return killed, nil
		}
		if time.Now().After(deadline) {
			return killed, fmt.Errorf("processes %v of id %d are still there after %v of SIGKILL: %w", pids, id, limit, errdefs.ErrUnavailable)
		}
		for _, pid := range pids {
			if err := unix.Kill(pid, unix.SIGKILL); err == nil && !seen[pid] {
				seen[pid] = true
				killed = append(killed, pid)
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// idProcesses lists the live processes under proc that run with id.
func idProcesses(proc string, id uint32) ([]int, error) {
	entries, err := os.ReadDir(proc)
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		data, err := os.ReadFile(filepath.Join(proc, e.Name(), "status"))
		if err != nil {
			continue // gone already
		}
		st, ok := parseStatus(data)
		if ok && !st.zombie && st.runsWith(id) {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// procStatus is what KillID reads of /proc/PID/status.
type procStatus struct {
	uids, gids [4]uint32 // real, effective, saved, filesystem
	zombie     bool
}

// runsWith reports whether id is one of the process's uids or gids.
func (s procStatus) runsWith(id uint32) bool {
	for i := range s.uids {
		if s.uids[i] == id || s.gids[i] == id {
			return true
		}
	}
	return false
}

// parseStatus reads the State, Uid and Gid lines of a /proc/PID/status
// (whose Name line the process chose); ok is false unless both id lines
// are there, four ids each.
func parseStatus(data []byte) (procStatus, bool) {
	var st procStatus
	var haveUID, haveGID bool
	for _, line := range bytes.Split(data, []byte("\n")) {
		key, value, found := bytes.Cut(line, []byte(":"))
		if !found {
			continue
		}
		switch string(key) {
		case "State":
			f := bytes.Fields(value)
			st.zombie = len(f) > 0 && (string(f[0]) == "Z" || string(f[0]) == "X")
		case "Uid":
			haveUID = parseIDs(value, &st.uids)
		case "Gid":
			haveGID = parseIDs(value, &st.gids)
		}
	}
	return st, haveUID && haveGID
}

// parseIDs parses four whitespace-separated ids into out.
func parseIDs(value []byte, out *[4]uint32) bool {
	f := bytes.Fields(value)
	if len(f) != 4 {
		return false
	}
	for i, s := range f {
		n, err := strconv.ParseUint(string(s), 10, 32)
		if err != nil {
			return false
		}
		out[i] = uint32(n)
	}
	return true
}
