package shim

import (
	"context"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/fifo"
	"github.com/containerd/log"
)

// fifoTimeout bounds how long output written at once, when a program has
// ended, waits for a reader of its fifos.
const fifoTimeout = 10 * time.Second

// writeFifos writes stdout and stderr to their fifos, concurrently (a
// reader may drain them in any order), and closes them.
func writeFifos(ctx context.Context, io stdio, stdout, stderr []byte) {
	ctx, cancel := context.WithTimeout(ctx, fifoTimeout)
	defer cancel()
	var wg sync.WaitGroup
	for _, o := range []struct {
		path string
		data []byte
	}{{io.stdout, stdout}, {io.stderr, stderr}} {
		if o.path == "" {
			continue
		}
		wg.Go(func() {
			if err := writeFifo(ctx, o.path, o.data); err != nil {
				log.G(ctx).WithError(err).WithField("fifo", o.path).Warn("exec output dropped")
			}
		})
	}
	wg.Wait()
}

// writeFifo opens a fifo for writing once a reader is there, writes data
// and closes it; ctx bounds the whole.
func writeFifo(ctx context.Context, path string, data []byte) error {
	f, err := fifo.OpenFifo(ctx, path, syscall.O_WRONLY, 0)
	if err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { f.Close() })
	defer stop()
	defer f.Close()
	_, err = f.Write(data)
	return err
}
