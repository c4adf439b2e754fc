package pgcoord

import (
	"errors"
	"fmt"
)

// Error is an error the agent answered: the {code, message, retryable} map
// of proto/PROTOCOL.md. errors.Is(err, ErrTimeout) and the like match on
// the code, so callers need not compare strings.
type Error struct {
	Code      string
	Message   string
	Retryable bool
	Method    string // the call that was answered
}

func (e *Error) Error() string {
	if e.Method != "" {
		return fmt.Sprintf("pgcoord: %s: %s: %s", e.Method, e.Code, e.Message)
	}
	return fmt.Sprintf("pgcoord: %s: %s", e.Code, e.Message)
}

// Is makes the per-code sentinels match any Error of the same code.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Message == "" && t.Code == e.Code
}

func sentinel(code string, retryable bool) *Error {
	return &Error{Code: code, Retryable: retryable}
}

// One sentinel per error code of PROTOCOL.md, for errors.Is.
var (
	ErrInvalidRequest = sentinel("invalid_request", false)
	ErrMethodNotFound = sentinel("method_not_found", false)
	ErrInvalidParams  = sentinel("invalid_params", false)
	ErrUnavailable    = sentinel("unavailable", true)
	ErrTimeout        = sentinel("timeout", true)
	ErrBusy           = sentinel("busy", true)
	ErrNotFound       = sentinel("not_found", false)
	ErrForbidden      = sentinel("forbidden", false)
	ErrNoSession      = sentinel("no_session", false)
	ErrSessionExpired = sentinel("session_expired", false)
	ErrConflict       = sentinel("conflict", false)
	ErrFenced         = sentinel("fenced", false)
	ErrSuperseded     = sentinel("superseded", false)
	ErrShuttingDown   = sentinel("shutting_down", true)
	ErrInternal       = sentinel("internal", false)
	ErrTooLarge       = sentinel("too_large", false)
)

// Errors of this side of the socket.
var (
	// ErrConnection: the connection failed or closed. When it happened
	// after a request was written, the request's outcome is unknown.
	ErrConnection = errors.New("pgcoord: the connection to the agent failed")
	// ErrProtocol: the agent sent something that is not MessagePack-RPC.
	ErrProtocol = errors.New("pgcoord: the agent sent a malformed message")
	// ErrClosed: Close was called on the client.
	ErrClosed = errors.New("pgcoord: the client is closed")
	// ErrOutcomeUnknown: an attempt's outcome was never seen and the call
	// gave up (its context ended); the id was released as PROTOCOL.md's
	// "After an outcome you did not see" requires.
	ErrOutcomeUnknown = errors.New("pgcoord: outcome unknown; the id was released")
	// ErrNotLeader: a leadership ended, or Elect's campaign was lost.
	ErrNotLeader = errors.New("pgcoord: not the leader")
)

// Retryable says whether a call that failed with err may be retried with
// the same ids: the agent said so, or the outcome was not seen
// (connection lost mid-call).
func Retryable(err error) bool {
	var e *Error
	if errors.As(err, &e) {
		return e.Retryable
	}
	return errors.Is(err, ErrConnection)
}

// outcomeUnknown says whether err leaves open that the call committed:
// the database may still commit it (timeout, unavailable) or the reply
// was never read.
func outcomeUnknown(err error) bool {
	var e *Error
	if errors.As(err, &e) {
		return e.Code == "timeout" || e.Code == "unavailable"
	}
	return errors.Is(err, ErrConnection) || errors.Is(err, errAbandoned)
}

// errAbandoned marks a call whose context ended after its request left.
var errAbandoned = errors.New("pgcoord: the call's context ended before the reply")

// abandoned is the error of such a call: errors.Is finds errAbandoned and
// the context's own error (context.DeadlineExceeded, context.Canceled), as
// a caller of any Go API expects.
type abandoned struct {
	method string
	cause  error
}

func (e *abandoned) Error() string {
	return fmt.Sprintf("%v: %s: %v", errAbandoned, e.method, e.cause)
}

func (e *abandoned) Is(target error) bool { return target == errAbandoned }

func (e *abandoned) Unwrap() error { return e.cause }
