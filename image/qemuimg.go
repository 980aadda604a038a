package image

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"github.com/containerd/log"
)

const (
	// maxOutput bounds what is kept of qemu-img's stdout and stderr.
	maxOutput = 1 << 20
	// maxMessage bounds a qemu-img message quoted in an error.
	maxMessage = 400
)

// result is the outcome of one qemu-img run that started and exited.
type result struct {
	stdout []byte
	stderr string
	code   int
}

// runQEMUImg runs qemu-img with args. A non-zero exit is reported in result.code,
// not as an error; errors mean qemu-img could not be run or ctx ended.
func runQEMUImg(ctx context.Context, qemuImg string, args ...string) (result, error) {
	var stdout, stderr capped
	cmd := exec.CommandContext(ctx, qemuImg, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = 5 * time.Second
	log.G(ctx).WithField("args", args).Debug("running qemu-img")
	err := cmd.Run()
	res := result{stdout: stdout.Bytes(), stderr: stderr.String()}
	if ctxErr := ctx.Err(); ctxErr != nil {
		return res, fmt.Errorf("qemu-img %s: %w", args[0], ctxErr)
	}
	var exitErr *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exitErr) && exitErr.Exited():
		res.code = exitErr.ExitCode()
	default:
		return res, preconditionf("run %s %s: %v", qemuImg, args[0], err)
	}
	return res, nil
}

// message condenses qemu-img's stderr to one line naming files inside root
// as rootfs paths: the first message, and how many more there were.
func message(stderr, root string) string {
	var lines []string
	for _, l := range strings.Split(stderr, "\n") {
		l = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(l), "qemu-img:"))
		if l != "" {
			lines = append(lines, l)
		}
	}
	if len(lines) == 0 {
		return "no message"
	}
	msg := lines[0]
	if root != "" && root != "/" {
		msg = strings.ReplaceAll(msg, root+"/", "/")
	}
	msg = oneLine(msg)
	if len(msg) > maxMessage {
		msg = strings.ToValidUTF8(msg[:maxMessage], "") + "…"
	}
	if n := len(lines) - 1; n > 0 {
		msg = fmt.Sprintf("%s (and %d more)", msg, n)
	}
	return msg
}

// capped is a bytes.Buffer that silently drops writes beyond maxOutput.
type capped struct {
	buf bytes.Buffer
}

func (c *capped) Write(p []byte) (int, error) {
	if room := maxOutput - c.buf.Len(); room > 0 {
		if len(p) > room {
			c.buf.Write(p[:room])
		} else {
			c.buf.Write(p)
		}
	}
	return len(p), nil
}

func (c *capped) Bytes() []byte  { return c.buf.Bytes() }
func (c *capped) String() string { return c.buf.String() }
