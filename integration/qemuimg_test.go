package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// TestSecurityQEMUImgLeavesNothing repeats what a qemu-img an image took
// over would try: leave a process behind with the VM's id, for the VM
// that gets the id next to inherit. After a disk VM's create, in which
// qemu-img inspected the image and made the overlay, the only process
// of the VM's id is QEMU. A process planted with that id while the VM
// runs is killed when the VM is deleted, before the id is given back.
func TestSecurityQEMUImgLeavesNothing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*bootTimeout)
	defer cancel()
	v := startVM(ctx, t, imageDiskWait)
	pid, _ := secQEMU(t, v.id)
	uid := strings.Fields(secStatus(t, pid)["Uid"])[0]
	if got := secIDProcesses(t, uid); !reflect.DeepEqual(got, []int{pid}) {
		t.Errorf("processes of the VM's id %s after the create: %v, want QEMU (%d) alone", uid, got, pid)
	}
	id, err := strconv.ParseUint(uid, 10, 32)
	if err != nil {
		t.Fatal(err)
	}
	planted := exec.Command("sleep", "1000")
	planted.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Credential: &syscall.Credential{Uid: uint32(id), Gid: uint32(id)}}
	if err := planted.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- planted.Wait() }()
	defer func() {
		_ = planted.Process.Kill()
	}()

	v.remove(t)
	select {
	case err := <-waited:
		var exitErr *exec.ExitError
		if !errors.As(err, &exitErr) || exitErr.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Errorf("planted process of id %s ended with %v, want SIGKILL", uid, err)
		}
	case <-ctx.Done():
		t.Fatalf("planted process %d of id %s outlived the VM's delete", planted.Process.Pid, uid)
	}
	assertNothingLeft(ctx, t, v.id)
	if got := secIDProcesses(t, uid); len(got) != 0 {
		t.Errorf("processes of id %s after the delete: %v", uid, got)
	}
	if _, err := os.Stat(filepath.Join(secIDsDir, uid)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the claim on id %s is still there after the delete: %v", uid, err)
	}
	data, _ := os.ReadFile(env.daemon.logPath)
	if logs := string(data); !strings.Contains(logs, "killed processes left with the vm's jail id") || !strings.Contains(logs, strconv.Itoa(planted.Process.Pid)) {
		t.Errorf("the shim's log does not name the process it killed (%d)", planted.Process.Pid)
	}
}

// secIDProcesses lists the live processes that run with id as a uid or
// gid.
func secIDProcesses(t *testing.T, id string) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			continue
		}
		st := map[string]string{}
		for _, line := range strings.Split(string(data), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok {
				st[k] = strings.TrimSpace(v)
			}
		}
		if strings.HasPrefix(st["State"], "Z") {
			continue
		}
		for _, f := range append(strings.Fields(st["Uid"]), strings.Fields(st["Gid"])...) {
			if f == id {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}
