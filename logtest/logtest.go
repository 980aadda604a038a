// Package logtest gives tests a logger that prints nothing and keeps the
// warnings and errors logged through it, so a test can check what a
// package said without reading its output.
package logtest

import (
	"context"
	"fmt"
	"io"
	"sync"

	"github.com/containerd/log"
	"github.com/sirupsen/logrus"
)

// New returns a context whose logger (log.G) prints nothing, since
// goroutines may still log after a test ends, and the recorder of its
// warnings and errors.
func New() (context.Context, *Recorder) {
	l := logrus.New()
	l.SetOutput(io.Discard)
	l.SetLevel(logrus.DebugLevel)
	rec := &Recorder{}
	l.AddHook(rec)
	return log.WithLogger(context.Background(), logrus.NewEntry(l)), rec
}

// Recorder is a logrus hook that keeps warnings and errors.
type Recorder struct {
	mu      sync.Mutex // guards entries
	entries []string
}

// Levels are those the recorder keeps.
func (r *Recorder) Levels() []logrus.Level {
	return []logrus.Level{logrus.PanicLevel, logrus.FatalLevel, logrus.ErrorLevel, logrus.WarnLevel}
}

// Fire keeps an entry's message, with its error if it has one.
func (r *Recorder) Fire(e *logrus.Entry) error {
	msg := e.Message
	if err, ok := e.Data[logrus.ErrorKey]; ok {
		msg = fmt.Sprintf("%s: %v", msg, err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.entries = append(r.entries, msg)
	return nil
}

// Warnings returns the warnings and errors kept so far, oldest first.
func (r *Recorder) Warnings() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.entries...)
}
