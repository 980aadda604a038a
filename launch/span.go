package launch

import (
	"fmt"
	"time"

	"github.com/containerd/log"
)

// spanMessage is the message of a span's log line, which `make bench`
// looks for.
const spanMessage = "span"

// Span logs at debug level that the step of a Create or a Start that
// began at begin is over: the message "span", the step and how long it
// took in milliseconds.
func Span(logger *log.Entry, step string, begin time.Time) {
	if !logger.Logger.IsLevelEnabled(log.DebugLevel) {
		return
	}
	ms := float64(time.Since(begin).Nanoseconds()) / 1e6
	logger.WithFields(log.Fields{"step": step, "ms": fmt.Sprintf("%.3f", ms)}).Debug(spanMessage)
}
