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

// Unwrap returns the kind and the cause, for errors.Is and errors.As.
func (e *failure) Unwrap() []error {
	errs := make([]error, 0, 2)
	if e.kind != nil {
		errs = append(errs, e.kind)
	}
	if e.cause != nil {
		errs = append(errs, e.cause)
	}
	return errs
}

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
