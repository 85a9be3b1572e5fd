package group

import (
	"errors"
	"fmt"
)

// Sentinel errors for the documented rejections. Join returns them wrapped in an *Error whose
// message is the user-facing sentence; test with errors.Is.
var (
	// ErrKeyMismatch: the route belongs to a pool with another key, or to a solo tunnel.
	ErrKeyMismatch = errors.New("group: group key does not match")
	// ErrInUse: the subdomain is owned by another identity.
	ErrInUse = errors.New("group: already in use")
	// ErrProtoMismatch: the pool's members speak another protocol (http vs https).
	ErrProtoMismatch = errors.New("group: protocol mismatch")
	// ErrNoPorts: the TCP port range has no free port.
	ErrNoPorts = errors.New("group: no TCP ports available")
	// ErrInvalid: the join request itself is malformed (empty label, unknown protocol).
	ErrInvalid = errors.New("group: invalid registration")
	// ErrPortUnavailable is returned by a Config.OnCreate hook when the port it was given cannot
	// be used (bound by another process); Join then tries the next port.
	ErrPortUnavailable = errors.New("group: port unavailable")
)

// Error is a rejection: Msg is the sentence shown to the user, Err the sentinel it is an
// instance of. Msg carries no "group: " prefix: an edge sends it to the connector as it is.
type Error struct {
	Err error
	Msg string
}

// Error returns "group: " and the user-facing message.
func (e *Error) Error() string { return "group: " + e.Msg }

// Unwrap returns the sentinel.
func (e *Error) Unwrap() error { return e.Err }

func reject(sentinel error, msg string) error { return &Error{Err: sentinel, Msg: msg} }

// KeyMismatch is the refusal of a registration whose group key the pool of a route does not
// admit: the route is subdomain label, or with tcp the TCP group label.
func KeyMismatch(tcp bool, label string) error {
	if tcp {
		return reject(ErrKeyMismatch, fmt.Sprintf("group key does not match for group '%s'", label))
	}
	return reject(ErrKeyMismatch, fmt.Sprintf("group key does not match for subdomain '%s'", label))
}
