package shim

import (
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// pollMin and pollMax bound the interval between the polls of a guest
// program's status: the first comes after pollMin, each next one after
// twice the last, at most pollMax.
const (
	pollMin = 20 * time.Millisecond
	pollMax = 500 * time.Millisecond
)

// statusPolls is the interval between the polls of a guest program's
// status, for wait's DelayFunc.Until.
func statusPolls() wait.DelayFunc {
	return wait.Backoff{Duration: pollMin, Factor: 2, Cap: pollMax, Steps: 8}.DelayFunc()
}
