package diskcache

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// failure is a one-line error (it reaches kubectl describe pod) that wraps
// an errdefs kind and, when there is one, its cause.
type failure struct {
	msg   string
	kind  error
	cause error
}

// Error returns the one-line message.
func (e *failure) Error() string { return e.msg }

// Unwrap returns the kind, for errors.Is, errors.As and errdefs. The cause
// is reached through Is and As instead: a second wrapped error would travel
// over gRPC as a detail of its own (errgrpc), and come out as another line
// of the message.
func (e *failure) Unwrap() error { return e.kind }

// Is reports whether the cause is target.
func (e *failure) Is(target error) bool { return e.cause != nil && errors.Is(e.cause, target) }

// As finds target in the cause's chain.
func (e *failure) As(target any) bool { return e.cause != nil && errors.As(e.cause, target) }

// errorf returns a one-line error of kind (an errdefs sentinel) whose message
// is the formatted text followed by ": " and cause, when cause is not nil.
func errorf(kind, cause error, format string, args ...any) error {
	msg := oneLine(fmt.Sprintf(format, args...))
	if cause != nil {
		msg += ": " + oneLine(causeText(cause))
	}
	return &failure{msg: msg, kind: kind, cause: cause}
}

// causeText is the text of err without the URL that net/http puts in front
// of transport errors: the callers name the URL themselves, redacted.
func causeText(err error) string {
	var uerr *url.Error
	if errors.As(err, &uerr) && uerr.Err != nil {
		return uerr.Err.Error()
	}
	return err.Error()
}

// ctxError returns the error for a context that ended while doing what: it
// wraps ctx.Err() (so errdefs.IsCanceled and IsDeadlineExceeded see it) and
// the context's cause.
func ctxError(ctx context.Context, what string) error {
	cause := context.Cause(ctx)
	if cause == nil {
		cause = ctx.Err()
	}
	return errorf(ctx.Err(), cause, "%s", what)
}

// oneLine folds s to one line of single spaces.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
