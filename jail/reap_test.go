package jail

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// The ids the reap tests run processes as.
const (
	reapID      = 2000040
	otherReapID = 2000041
)

// startAs starts a shell as uid and gid id that forks a sleeping child
// and sleeps itself, as a process a jailed program left behind would.
func startAs(t *testing.T, id uint32) *exec.Cmd {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("running a process as another uid needs root")
	}
	cmd := exec.Command("/bin/sh", "-c", "sleep 1000 & sleep 1000")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: id, Gid: id}}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	// Wait until the shell has forked its child.
	for {
		pids, err := idProcesses("/proc", id)
		if err != nil {
			t.Fatal(err)
		}
		if len(pids) >= 2 {
			return cmd
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestKillID checks that KillID kills a process of the id and the child
// it forked, and nothing of another id.
func TestKillID(t *testing.T) {
	cmd := startAs(t, reapID)
	other := startAs(t, otherReapID)
	killed, err := KillID("/proc", reapID, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(killed) < 2 || !slices.Contains(killed, cmd.Process.Pid) {
		t.Errorf("KillID() killed %v, want the shell %d and its child", killed, cmd.Process.Pid)
	}
	if pids, _ := idProcesses("/proc", reapID); len(pids) != 0 {
		t.Errorf("processes of id %d left: %v", reapID, pids)
	}
	if pids, _ := idProcesses("/proc", otherReapID); len(pids) < 2 || !slices.Contains(pids, other.Process.Pid) {
		t.Errorf("processes of id %d = %v, want the other shell and its child untouched", otherReapID, pids)
	}
}

// TestReleaseEmpty checks an id is given back only once its processes
// are killed, and that an id another owner holds now is neither killed
// nor released.
func TestReleaseEmpty(t *testing.T) {
	dir := t.TempDir()
	r := IDRange{First: reapID, Last: otherReapID}
	for _, owner := range []string{"ns/a", "ns/b"} {
		if _, err := Claim(dir, r, owner); err != nil {
			t.Fatal(err)
		}
	}
	ownerOf := func(id uint32) string {
		data, _ := os.ReadFile(filepath.Join(dir, strconv.Itoa(int(id))))
		return string(data)
	}
	mine, theirs := uint32(reapID), uint32(otherReapID)
	if ownerOf(mine) != "ns/a" {
		mine, theirs = theirs, mine
	}
	startAs(t, mine)
	startAs(t, theirs)
	var reported []int
	err := ReleaseEmpty(dir, 0, "ns/a", func(id uint32, pids []int) {
		if id != mine {
			t.Errorf("killed processes of id %d, want only %d", id, mine)
		}
		reported = append(reported, pids...)
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(reported) < 2 {
		t.Errorf("ReleaseEmpty() reported %v killed, want the shell and its child", reported)
	}
	if pids, _ := idProcesses("/proc", mine); len(pids) != 0 {
		t.Errorf("processes of released id %d left: %v", mine, pids)
	}
	if got := ownerOf(mine); got != "" {
		t.Errorf("id %d still claimed by %q", mine, got)
	}
	if pids, _ := idProcesses("/proc", theirs); len(pids) < 2 {
		t.Errorf("processes of id %d, held by another owner, = %v, want them untouched", theirs, pids)
	}
	if got := ownerOf(theirs); got != "ns/b" {
		t.Errorf("id %d claimed by %q, want ns/b's claim kept", theirs, got)
	}
	// Releasing the other owner's id by number as ns/a does nothing.
	if err := ReleaseEmpty(dir, theirs, "ns/a", nil); err != nil {
		t.Fatal(err)
	}
	if pids, _ := idProcesses("/proc", theirs); len(pids) < 2 || ownerOf(theirs) != "ns/b" {
		t.Errorf("ReleaseEmpty(their id) touched it: processes %v, claim %q", pids, ownerOf(theirs))
	}
}

func TestParseStatus(t *testing.T) {
	tests := []struct {
		name, data string
		want       procStatus
		ok         bool
	}{
		{"running", "Name:\tqemu-img\nState:\tS (sleeping)\nUid:\t5\t6\t7\t8\nGid:\t9\t10\t11\t12\n",
			procStatus{uids: [4]uint32{5, 6, 7, 8}, gids: [4]uint32{9, 10, 11, 12}}, true},
		{"zombie", "State:\tZ (zombie)\nUid:\t5\t5\t5\t5\nGid:\t5\t5\t5\t5\n",
			procStatus{uids: [4]uint32{5, 5, 5, 5}, gids: [4]uint32{5, 5, 5, 5}, zombie: true}, true},
		// A name is escaped in status: "\n" in it is two characters.
		{"name that looks like a uid line", "Name:\tx\\nUid:\t1\t1\t1\t1\nUid:\t5\t5\t5\t5\nGid:\t5\t5\t5\t5\n",
			procStatus{uids: [4]uint32{5, 5, 5, 5}, gids: [4]uint32{5, 5, 5, 5}}, true},
		{"no gid", "Uid:\t5\t5\t5\t5\n", procStatus{uids: [4]uint32{5, 5, 5, 5}}, false},
		{"three ids", "Uid:\t5\t5\t5\nGid:\t5\t5\t5\t5\n", procStatus{gids: [4]uint32{5, 5, 5, 5}}, false},
		{"not a number", "Uid:\t5\t5\tx\t5\nGid:\t5\t5\t5\t5\n", procStatus{gids: [4]uint32{5, 5, 5, 5}}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := parseStatus([]byte(tc.data))
			if ok != tc.ok || (ok && got != tc.want) {
				t.Errorf("parseStatus() = %+v, %v, want %+v, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
	if (procStatus{uids: [4]uint32{1, 2, 3, 4}, gids: [4]uint32{5, 6, 7, 8}}).runsWith(9) {
		t.Error("runsWith(9) of ids 1-8 is true")
	}
	if !(procStatus{uids: [4]uint32{1, 2, 3, 4}, gids: [4]uint32{5, 6, 7, 8}}).runsWith(7) {
		t.Error("runsWith(7) of saved gid 7 is false")
	}
}
