package launch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// podFile is the name, in a CRI pod sandbox's bundle, of the state the pod
// carries from its sandbox's Create to its VM container's.
const podFile = "vmshim-pod.json"

// podState is what a CRI pod carries from its sandbox's Create to its VM
// container's. It lives in the sandbox's bundle, next to its task record,
// so a shim that restarts between the two Creates still knows it, and it
// goes with the bundle.
type podState struct {
	// VM is the container whose VM the pod runs: a VM owns the pod's IP,
	// which two VMs cannot share.
	VM string `json:"vm,omitempty"`
}

// sandboxBundle is the bundle of sandbox id, a sibling of bundle, the
// bundle of one of its containers (containerd keeps a namespace's bundles
// in one directory); "" when id is not a plain name.
func sandboxBundle(bundle, id string) string {
	if id == "" || id == "." || id == ".." || strings.ContainsAny(id, "/\x00") {
		return ""
	}
	return filepath.Join(filepath.Dir(bundle), id)
}

// writePodState writes st into the sandbox's bundle.
func writePodState(sandboxBundle string, st podState) error {
	data, err := json.Marshal(st)
	if err != nil {
		return err
	}
	p := filepath.Join(sandboxBundle, podFile)
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("write pod state: %w", err)
	}
	if err := os.Rename(tmp, p); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("write pod state: %w", err)
	}
	return nil
}

// readPodState reads the pod state in a sandbox's bundle; ok is false when
// the bundle has none (no vmshim sandbox made it).
func readPodState(sandboxBundle string) (st podState, ok bool, err error) {
	data, err := os.ReadFile(filepath.Join(sandboxBundle, podFile))
	if errors.Is(err, os.ErrNotExist) {
		return st, false, nil
	}
	if err != nil {
		return st, false, fmt.Errorf("read pod state: %w", err)
	}
	if err := json.Unmarshal(data, &st); err != nil {
		return st, false, fmt.Errorf("read pod state %s: %w", sandboxBundle, err)
	}
	return st, true, nil
}

// ClaimPod makes container id the VM of the pod whose sandbox bundle is
// dir; a bundle with no pod state is not a vmshim sandbox's, and is left
// alone.
func ClaimPod(dir, id string) error {
	unlock, err := lockPod(dir)
	if err != nil {
		return err
	}
	defer unlock()
	st, ok, err := readPodState(dir)
	switch {
	case err != nil:
		return err
	case !ok:
		return nil
	case st.VM != "" && st.VM != id:
		return fmt.Errorf("pod already runs a VM in container %s; a VM pod has one VM container: %w", st.VM, errdefs.ErrFailedPrecondition)
	}
	return writePodState(dir, podState{VM: id})
}

// ReleasePod gives back container id's claim on the pod whose sandbox
// bundle is dir; a claim that is another's, or a pod that is gone, is
// left as it is.
func ReleasePod(dir, id string) error {
	unlock, err := lockPod(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer unlock()
	st, ok, err := readPodState(dir)
	if err != nil || !ok || st.VM != id {
		return err
	}
	return writePodState(dir, podState{})
}

// lockPod takes the pod state's lock, an flock on the sandbox bundle, so
// claims from any process (a shim, a delete action) are made one at a
// time.
func lockPod(dir string) (unlock func(), err error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("lock pod state %s: %w", dir, &os.PathError{Op: "open", Path: dir, Err: err})
	}
	if err := unix.Flock(fd, unix.LOCK_EX); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("lock pod state %s: %w", dir, err)
	}
	return func() { unix.Close(fd) }, nil
}

// podNetns maps the /proc/PID/ns/net path of a pod sandbox's pause
// process, through which the CRI names the pod's netns, to the netns's own
// path, which outlives that process: the one the pause process names in
// its argv, if it is the same namespace. Other paths are returned as is.
func podNetns(path string) string {
	pid, ok := strings.CutSuffix(strings.TrimPrefix(path, "/proc/"), "/ns/net")
	if !ok || !strings.HasPrefix(path, "/proc/") || strings.Contains(pid, "/") {
		return path
	}
	cmdline, err := os.ReadFile(filepath.Join("/proc", pid, "cmdline"))
	if err != nil {
		return path
	}
	argv := strings.Split(strings.TrimSuffix(string(cmdline), "\x00"), "\x00")
	if len(argv) != 2 || argv[0] != PauseName || !filepath.IsAbs(argv[1]) {
		return path
	}
	var a, b unix.Stat_t
	if unix.Stat(path, &a) != nil || unix.Stat(argv[1], &b) != nil || a.Dev != b.Dev || a.Ino != b.Ino {
		return path
	}
	return argv[1]
}

// OpenPod starts the pod state in a sandbox's bundle, with no VM yet: a
// bundle with pod state is a vmshim sandbox's, whose containers claim it.
func OpenPod(sandboxBundle string) error { return writePodState(sandboxBundle, podState{}) }

// PodVM is the container whose VM the pod whose sandbox bundle is given
// runs, "" when it runs none or the bundle is no vmshim sandbox's.
func PodVM(sandboxBundle string) (string, error) {
	st, _, err := readPodState(sandboxBundle)
	return st.VM, err
}

// undoPod gives back the task's claim on its pod (madePod).
func undoPod(_ context.Context, r *Record) error { return ReleasePod(r.Pod, r.ID) }
