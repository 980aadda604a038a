package image

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"sync"
)

// WriteRaw writes src, a srcFormat disk that Inspect accepted (name says
// which, for messages), onto dev, a block device open read-write, as raw
// from its first byte; the device must hold the source's virtual size
// srcSize. progress, when set, gets how far it is, in whole tens of
// percent. Jailed, qemu-img reaches the device through a node of its own
// in the jail, owned by the jail's ids.
func WriteRaw(ctx context.Context, q QEMUImg, src *os.File, srcFormat, name string, srcSize int64, dev *os.File, progress func(percent int)) error {
	if srcFormat != FormatQCOW2 && srcFormat != FormatRaw {
		return invalidf("write %s: format %q is not qcow2 or raw", name, srcFormat)
	}
	groups, err := readGroups(q, src, name)
	if err != nil {
		return err
	}
	if progress != nil {
		q.stdout = &percentWriter{report: progress}
	}
	q.CPUTime = QEMUImgCopyCPUTime
	files := []imgFile{{name: "src", label: name, f: src}, {name: "dev", label: dev.Name(), f: dev, rw: true, device: true}}
	// -n: the device is there already; -p: progress on stdout.
	res, err := q.run(ctx, files, groups, "convert", "-n", "-p", "-W", "-f", srcFormat, "-O", FormatRaw, "@src", "@dev")
	if err == nil && res.code != 0 {
		err = preconditionf("qemu-img convert: %s", message(res.stderr, ""))
	}
	if err != nil {
		return fmt.Errorf("write %s to %s: %w", name, dev.Name(), err)
	}
	return dev.Sync()
}

// percentRE matches qemu-img -p's progress, "(12.34/100%)".
var percentRE = regexp.MustCompile(`\((\d{1,3})\.\d+/100%\)`)

// percentWriter turns qemu-img -p's output into calls of report, once per
// ten percent.
type percentWriter struct {
	report func(percent int)
	mu     sync.Mutex
	last   int
	tail   []byte
}

func (w *percentWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	buf := append(w.tail, p...)
	for _, m := range percentRE.FindAllSubmatch(buf, -1) {
		if n, err := strconv.Atoi(string(m[1])); err == nil && n/10*10 > w.last && n <= 100 {
			w.last = n / 10 * 10
			w.report(w.last)
		}
	}
	// Keep what could be the start of a progress mark cut in two.
	if len(buf) > 32 {
		buf = buf[len(buf)-32:]
	}
	w.tail = append([]byte(nil), buf...)
	return len(p), nil
}
