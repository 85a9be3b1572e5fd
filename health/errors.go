package health

import "errors"

// Sentinel errors. Errors returned by this package wrap one of these (with
// more detail) where the condition is one a caller may want to test for with
// [errors.Is].
var (
	// ErrInvalidSpec is wrapped by every error from [Spec.Validate].
	ErrInvalidSpec = errors.New("health: invalid spec")

	// ErrInvalidTarget is returned when a TCP or HTTP target is not a
	// "host:port" address.
	ErrInvalidTarget = errors.New("health: invalid target")

	// ErrInvalidOption is returned by [NewProber] for an out-of-range option,
	// such as a jitter fraction outside [0, 1).
	ErrInvalidOption = errors.New("health: invalid option")

	// ErrHTTPStatus is wrapped by the error of an HTTP probe whose status
	// code is outside [200, 300) when the spec expects 2xx. Its message reads
	// "http status 500".
	ErrHTTPStatus = errors.New("health: http status")

	// ErrMalformedStatusLine is wrapped by the error of an HTTP probe whose
	// peer answered with something that is not an HTTP status line, or with a
	// line longer than [MaxStatusLine] bytes.
	ErrMalformedStatusLine = errors.New("health: malformed status line")

	// ErrNoStatusLine is wrapped by the error of an HTTP probe whose peer
	// closed the connection, or did not answer within the timeout, before
	// sending a status line.
	ErrNoStatusLine = errors.New("health: no status line")

	// ErrCheckStillRunning is the failure recorded by a [Prober] when the
	// previous call of a [TypeFunc] check has not returned yet (it ignored
	// its context). The Prober never runs two calls of one check at once.
	ErrCheckStillRunning = errors.New("health: previous check has not returned")

	// ErrRunning is returned by [Prober.Run] when another call of Run on the
	// same Prober is still in progress.
	ErrRunning = errors.New("health: prober is already running")
)
