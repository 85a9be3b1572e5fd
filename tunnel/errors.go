package tunnel

import (
	"errors"
	"fmt"
	"strings"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/internal/wire"
)

// Errors. The rejections an edge sends travel as codes on the wire and come back as these
// sentinels on the connector, so errors.Is works on both sides.
var (
	// ErrServerClosed is returned by the Server's Serve methods after Shutdown or Close.
	ErrServerClosed = errors.New("tunnel: server closed")
	// ErrSessionClosed is returned by Session methods after Close.
	ErrSessionClosed = errors.New("tunnel: session closed")
	// ErrTunnelClosed is returned by a tunnel's Accept after Close.
	ErrTunnelClosed = errors.New("tunnel: tunnel closed")
	// ErrUnauthorized: the edge refused the connector's token. Permanent: not retried.
	ErrUnauthorized = errors.New("tunnel: invalid auth token")
	// ErrUnsupportedVersion: the two sides speak different protocol versions. Permanent.
	ErrUnsupportedVersion = errors.New("tunnel: unsupported protocol version")
	// ErrProtocol: a peer broke the protocol (malformed or out-of-order frames).
	ErrProtocol = errors.New("tunnel: protocol error")
	// ErrRejected is the generic registration rejection; the specific ones below wrap it.
	ErrRejected = errors.New("tunnel: tunnel rejected")
	// ErrLimit: the session reached max_tunnels_per_session, or registered too fast.
	ErrLimit = errors.New("tunnel: tunnel limit reached")

	// ErrKeyMismatch: the route belongs to a pool with another group key (or to a solo tunnel).
	ErrKeyMismatch = group.ErrKeyMismatch
	// ErrInUse: the subdomain is owned by another identity.
	ErrInUse = group.ErrInUse
	// ErrProtoMismatch: the pool's members serve another protocol (http vs https).
	ErrProtoMismatch = group.ErrProtoMismatch
	// ErrNoPorts: the edge's TCP port range is exhausted.
	ErrNoPorts = group.ErrNoPorts
	// ErrInvalid: the registration is malformed (bad subdomain, bad alert URL, ...).
	ErrInvalid = group.ErrInvalid
	// ErrOwned: the route belongs to another tenant ("subdomain 'pool' belongs to another
	// tenant"), by its first claim or a reserved endpoint, until its claim lapses.
	ErrOwned = errors.New("tunnel: route belongs to another tenant")
	// ErrUnavailable: the edge cannot serve the request now (e.g. it cannot write its route
	// store); retried.
	ErrUnavailable = errors.New("tunnel: edge unavailable")
)

// RejectedError is a registration the edge refused. Message is the edge's sentence verbatim;
// Error returns "tunnel: " and it.
type RejectedError struct {
	// Code is the wire code, e.g. "group_key_mismatch".
	Code string
	// Message is the edge's sentence, e.g. "group key does not match for subdomain 'pool'".
	Message string
}

// Error returns "tunnel: " and the edge's message verbatim.
func (e *RejectedError) Error() string { return "tunnel: " + e.Message }

// Unwrap returns the sentinel for Code and ErrRejected, so that both errors.Is(err,
// ErrKeyMismatch) and errors.Is(err, ErrRejected) hold.
func (e *RejectedError) Unwrap() []error {
	if s := sentinelFor(e.Code); s != nil {
		return []error{s, ErrRejected}
	}
	return []error{ErrRejected}
}

// wireCodes pairs each wire code with its sentinel. An error may wrap more than one
// sentinel (ErrUnavailable and ErrLimit, say): codeFor takes the first of this list that it
// wraps, so the code a connector is sent does not depend on map order. The order is from the
// most specific answer to the most general: why this route is refused, then why the
// registration cannot go ahead now, then what is wrong with the session.
var wireCodes = []struct {
	code     string
	sentinel error
}{
	{wire.CodeOwned, ErrOwned},
	{wire.CodeKeyMismatch, ErrKeyMismatch},
	{wire.CodeInUse, ErrInUse},
	{wire.CodeProtoMismatch, ErrProtoMismatch},
	{wire.CodeInvalid, ErrInvalid},
	{wire.CodeNoPorts, ErrNoPorts},
	{wire.CodeLimit, ErrLimit},
	{wire.CodeUnavailable, ErrUnavailable},
	{wire.CodeUnauthorized, ErrUnauthorized},
	{wire.CodeUnsupportedVersion, ErrUnsupportedVersion},
	{wire.CodeProtocol, ErrProtocol},
}

func sentinelFor(code string) error {
	for _, c := range wireCodes {
		if c.code == code {
			return c.sentinel
		}
	}
	return nil
}

// codeFor maps an edge-side error to its wire code: the first of wireCodes it wraps, or
// CodeInternal.
func codeFor(err error) string {
	for _, c := range wireCodes {
		if errors.Is(err, c.sentinel) {
			return c.code
		}
	}
	return wire.CodeInternal
}

// sessionError is a fatal error the edge sent (wire.Error): msg is its sentence, with no
// prefix.
type sessionError struct {
	code, msg string
}

func (e *sessionError) Error() string { return "tunnel: the edge ended the session: " + e.msg }

func (e *sessionError) Unwrap() error { return sentinelFor(e.code) }

// wireText is the message of an edge's error as it is sent to a connector (wire.Rejected,
// wire.Error): without the prefix of the package that made it ("tunnel: ", "group: ",
// "throttle: "), since the connector's error puts its own in front (RejectedError: "tunnel:
// " and this text verbatim). A group.Error's text is its Msg.
func wireText(err error) string {
	msg := err.Error()
	for _, p := range []string{"tunnel: ", "group: ", "throttle: "} {
		if rest, ok := strings.CutPrefix(msg, p); ok {
			return rest
		}
	}
	return msg
}

// permanent reports whether a connect error must not be retried: the edge refused the token
// or the protocol version, or the dialer answered that the edge is gone for good
// (ErrServerClosed, as an in-memory edge's Server.DialContext does once it was closed).
func permanent(err error) bool {
	return errors.Is(err, ErrUnauthorized) || errors.Is(err, ErrUnsupportedVersion) || errors.Is(err, ErrServerClosed)
}

// ErrRequired is wrapped by the FieldError of a setting that must be given and is not
// (its message reads "required: …").
var ErrRequired = errors.New("required")

// FieldError is a setting that a check of a configuration refuses: ServerConfig.Validate
// (and NewServer and Reload, which run it), TunnelSpec.Validate (and Forward and Listen),
// cluster.Config.Validate. A check that finds several returns them joined (errors.Join);
// errors.As finds each. Package tunnel/config maps Field to the file key that set it.
type FieldError struct {
	// Field names the setting by its path in the value checked: "TCP.Ports",
	// "Endpoints[2].Group", "Weight", "EdgeID".
	Field string
	// Err says what is wrong with the setting, in words that follow its name ("low port
	// 30000 is above high port 20000"). It never holds a secret's value.
	Err error
}

// Error returns "tunnel: Field: what is wrong".
func (e *FieldError) Error() string { return "tunnel: " + e.Field + ": " + e.Err.Error() }

// Unwrap returns Err.
func (e *FieldError) Unwrap() error { return e.Err }

// fieldErr returns a FieldError for field with a formatted message.
func fieldErr(field, format string, args ...any) *FieldError {
	return &FieldError{Field: field, Err: fmt.Errorf(format, args...)}
}

// under returns err with each FieldError in it named under prefix ("Endpoints[2]" +
// "Group"), the errors of a join one by one; other errors are left as they are.
func under(prefix string, err error) error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var errs []error
		for _, e := range j.Unwrap() {
			errs = append(errs, under(prefix, e))
		}
		return errors.Join(errs...)
	}
	if fe, ok := err.(*FieldError); ok {
		return &FieldError{Field: prefix + "." + fe.Field, Err: fe.Err}
	}
	return err
}
