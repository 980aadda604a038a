package integration

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"k8s.io/apimachinery/pkg/util/wait"
)

// TestCtrCheckpointRestore: `ctr containers checkpoint --task` of a VM
// with its root disk on a volume writes its state into a checkpoint
// image and ends it with 0; `ctr containers restore --live` resumes the
// guest in a new container, its marker in RAM and a process (same PID)
// there. Once the restored guest has written its disk, the checkpoint
// no longer goes with it, and a second restore is refused in one line.
func TestCtrCheckpointRestore(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*bootTimeout)
	defer cancel()
	d := env.daemon
	vol := filepath.Join(d.dir, "volumes", "checkpoint")
	if err := os.MkdirAll(vol, 0o700); err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(vol)
	id := uniqueID(t)
	ref := "localhost/vmshim-test/checkpoint:" + id
	ctr := func(args ...string) string {
		t.Helper()
		out, err := d.ctr(ctx, args...)
		if err != nil {
			t.Fatalf("ctr %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	gone := func(cid string) {
		_, _ = d.ctr(context.Background(), "task", "kill", "-s", "SIGKILL", cid)
		_, _ = d.ctr(context.Background(), "task", "rm", "-f", cid)
		_, _ = d.ctr(context.Background(), "containers", "rm", cid)
	}
	// exec runs a program in the guest through containerd's client, with
	// no stdin, within a minute: its stdout, and its stderr in the error.
	exec := func(cid string, args ...string) (string, error) {
		ectx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		c, err := env.client.LoadContainer(ectx, cid)
		if err != nil {
			return "", err
		}
		task, err := c.Task(ectx, nil)
		if err != nil {
			return "", err
		}
		var stdout, stderr bytes.Buffer
		proc, err := task.Exec(ectx, fmt.Sprintf("x%d", time.Now().UnixNano()), &specs.Process{Args: args, Cwd: "/"},
			cio.NewCreator(cio.WithStreams(nil, &stdout, &stderr)))
		if err != nil {
			return "", err
		}
		defer func() { _, _ = proc.Delete(context.WithoutCancel(ectx), client.WithProcessKill) }()
		statusC, err := proc.Wait(ectx)
		if err != nil {
			return "", err
		}
		if err := proc.Start(ectx); err != nil {
			return "", err
		}
		var st client.ExitStatus
		select {
		case st = <-statusC:
		case <-ectx.Done():
			return stdout.String(), fmt.Errorf("exec %q never ended: %w; the shim's goroutines:\n%s", args, ectx.Err(), dumpShimStacks(d, cid))
		}
		output := make(chan struct{})
		go func() { proc.IO().Wait(); close(output) }()
		select {
		case <-output:
		case <-ectx.Done():
			return stdout.String(), fmt.Errorf("exec %q exited %d, its output never ended: %w; the shim's goroutines:\n%s",
				args, st.ExitCode(), ectx.Err(), dumpShimStacks(d, cid))
		}
		if code := st.ExitCode(); code != 0 {
			return stdout.String(), fmt.Errorf("exit %d: %s", code, stderr.String())
		}
		return stdout.String(), nil
	}
	mustExec := func(cid string, args ...string) string {
		t.Helper()
		out, err := exec(cid, args...)
		if err != nil {
			t.Fatalf("exec %q in %s: %v (stdout %q)", args, cid, err, out)
		}
		return out
	}
	stopped := func(cid string) {
		t.Helper()
		err := wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(context.Context) (bool, error) {
			out, err := d.ctr(ctx, "task", "ls")
			for _, line := range strings.Split(out, "\n") {
				if f := strings.Fields(line); len(f) == 3 && f[0] == cid {
					return f[2] == "STOPPED", nil
				}
			}
			return false, err
		})
		if err != nil {
			t.Fatalf("task %s never stopped: %v", cid, err)
		}
	}

	defer gone(id)
	defer func() { _, _ = d.ctr(context.Background(), "images", "rm", ref) }()
	ctr("run", "-d", "--runtime", runtimeName, "--annotation", annotationRootDiskVolume+"=/data",
		"--mount", "type=bind,src="+vol+",dst=/data,options=rbind:rw", imageDiskAgent, id)
	if err := wait.PollUntilContextCancel(ctx, time.Second, true, func(context.Context) (bool, error) {
		_, err := exec(id, "true")
		return err == nil, nil
	}); err != nil {
		t.Fatalf("the guest's agent never answered: %v", err)
	}
	const marker = "vmshim-checkpointed-marker"
	mustExec(id, "sh", "-c", "echo "+marker+" >/run/marker")
	pid := strings.TrimSpace(mustExec(id, "sh", "-c", "sleep 86400 </dev/null >/dev/null 2>&1 & echo $!"))

	began := time.Now()
	t.Logf("ctr containers checkpoint --task: %s", strings.TrimSpace(ctr("containers", "checkpoint", "--task", id, ref)))
	t.Logf("checkpointed in %.1f s", time.Since(began).Seconds())
	stopped(id)
	if out := ctr("task", "rm", id); strings.Contains(out, "exit status") && !strings.Contains(out, "exit status 0") {
		t.Errorf("the checkpointed task: %s, want exit status 0", out)
	}
	ctr("containers", "rm", id)

	restored := id + "-r"
	defer gone(restored)
	began = time.Now()
	ctr("containers", "restore", "--live", restored, ref)
	t.Logf("restored in %.1f s", time.Since(began).Seconds())
	if got := strings.TrimSpace(mustExec(restored, "cat", "/run/marker")); got != marker {
		t.Errorf("the marker in the restored guest's RAM is %q, want %q", got, marker)
	}
	if got := mustExec(restored, "cat", "/proc/"+pid+"/cmdline"); !strings.HasPrefix(got, "sleep\x0086400") {
		t.Errorf("process %s in the restored guest runs %q, want the sleep started before the checkpoint", pid, got)
	}
	mustExec(restored, "sh", "-c", `part=$(findfs LABEL=VMSHIM) && printf '%-511s\n' restored | dd of="${part%1}" bs=512 seek=101 count=1 conv=notrunc,fsync`)
	gone(restored)

	again := id + "-a"
	defer gone(again)
	out, err := d.ctr(ctx, "containers", "restore", "--live", again, ref)
	if err == nil {
		t.Fatalf("a second restore after the disk changed: %s", out)
	}
	if !strings.Contains(out, "the saved state does not go with the root disk, which changed after the save") {
		t.Errorf("second restore: %s", out)
	}
}
