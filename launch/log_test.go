package launch

import (
	"context"
	"testing"
	"time"

	"github.com/vmshim/vmshim/logtest"
)

// waitTimeout bounds every wait in these tests; nothing should come close.
const waitTimeout = 5 * time.Second

// testLogger returns a context whose logger prints nothing and the
// recorder of its warnings and errors.
func testLogger(t *testing.T) (context.Context, *logtest.Recorder) {
	t.Helper()
	return logtest.New()
}
