package health

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"
)

// Type selects how a probe decides whether the target is healthy.
type Type string

// The probe types.
const (
	// TypeTCP succeeds when a TCP connection to the target is established
	// within the timeout. The connection is closed at once.
	TypeTCP Type = "tcp"
	// TypeHTTP succeeds when "GET <Path> HTTP/1.0" sent to the target is
	// answered with an HTTP status line within the timeout and, unless
	// AnyStatus is set, the status code is in [200, 300).
	TypeHTTP Type = "http"
	// TypeFunc succeeds when the spec's Check function returns nil within
	// the timeout. It suits backends that run in the same process.
	TypeFunc Type = "func"
)

// Defaults applied by [Spec.WithDefaults] to zero fields: a probe every 10 s
// with a 3 s timeout, unhealthy after 3 consecutive failures.
const (
	DefaultInterval  = 10 * time.Second
	DefaultTimeout   = 3 * time.Second
	DefaultMaxFailed = 3
)

// Spec describes one health check. The zero value of every field except
// Type (and Path or Check, where the type needs them) means "use the
// default"; see [Spec.WithDefaults].
type Spec struct {
	// Type is the kind of probe. Required.
	Type Type
	// Path is the request path of a TypeHTTP probe, for example "/healthz".
	// Required for TypeHTTP, where it must start with "/" and contain no
	// spaces or control characters; must be empty for other types.
	Path string
	// Interval is the time between the starts of two probes. 0 means
	// DefaultInterval. A Prober spreads it by its jitter fraction.
	Interval time.Duration
	// Timeout bounds one whole probe (dial, write and read for TCP and
	// HTTP; the Check call for TypeFunc). 0 means DefaultTimeout.
	Timeout time.Duration
	// MaxFailed is the number of consecutive failed probes after which a
	// Prober reports the target unhealthy. 0 means DefaultMaxFailed.
	MaxFailed int
	// AnyStatus makes a TypeHTTP probe succeed on any well-formed status
	// line, whatever the code (the config files' expect_2xx: false); the
	// default (false) expects a 2xx status.
	AnyStatus bool
	// Check is the function a TypeFunc probe calls. Required for TypeFunc,
	// must be nil for other types. It should return promptly once its
	// context is done; see [Prober] for what happens when it does not.
	Check func(ctx context.Context) error
}

// WithDefaults returns a copy of s whose zero Interval, Timeout and
// MaxFailed are replaced by DefaultInterval, DefaultTimeout and
// DefaultMaxFailed. Negative values are kept so that Validate rejects them.
func (s Spec) WithDefaults() Spec {
	if s.Interval == 0 {
		s.Interval = DefaultInterval
	}
	if s.Timeout == 0 {
		s.Timeout = DefaultTimeout
	}
	if s.MaxFailed == 0 {
		s.MaxFailed = DefaultMaxFailed
	}
	return s
}

// Validate reports whether s, after [Spec.WithDefaults], describes a usable
// check. The error wraps [ErrInvalidSpec] and names the offending field.
func (s Spec) Validate() error {
	s = s.WithDefaults()
	switch s.Type {
	case TypeTCP, TypeHTTP, TypeFunc:
	case "":
		return fmt.Errorf("%w: Type is required (%q, %q or %q)", ErrInvalidSpec, TypeTCP, TypeHTTP, TypeFunc)
	default:
		return fmt.Errorf("%w: unknown Type %q (want %q, %q or %q)", ErrInvalidSpec, string(s.Type), TypeTCP, TypeHTTP, TypeFunc)
	}
	if s.Type == TypeHTTP {
		if err := validatePath(s.Path); err != nil {
			return err
		}
	} else if s.Path != "" {
		return fmt.Errorf("%w: Path is only used with Type %q, not %q", ErrInvalidSpec, TypeHTTP, s.Type)
	}
	if s.Type == TypeFunc {
		if s.Check == nil {
			return fmt.Errorf("%w: Check is required for Type %q", ErrInvalidSpec, TypeFunc)
		}
	} else if s.Check != nil {
		return fmt.Errorf("%w: Check is only used with Type %q, not %q", ErrInvalidSpec, TypeFunc, s.Type)
	}
	if s.Interval < 0 {
		return fmt.Errorf("%w: Interval must be positive, got %v", ErrInvalidSpec, s.Interval)
	}
	if s.Timeout < 0 {
		return fmt.Errorf("%w: Timeout must be positive, got %v", ErrInvalidSpec, s.Timeout)
	}
	if s.MaxFailed < 0 {
		return fmt.Errorf("%w: MaxFailed must be positive, got %d", ErrInvalidSpec, s.MaxFailed)
	}
	return nil
}

func validatePath(p string) error {
	if p == "" {
		return fmt.Errorf("%w: Path is required for Type %q", ErrInvalidSpec, TypeHTTP)
	}
	if problem := PathProblem(p); problem != "" {
		return fmt.Errorf("%w: Path %s", ErrInvalidSpec, problem)
	}
	return nil
}

// ValidatePath reports why p cannot be the Path of a TypeHTTP probe (`health: path
// "healthz" must start with "/"`), or returns nil: a path starts with "/" and holds no
// space or control character. Spec.Validate applies it.
func ValidatePath(p string) error {
	if problem := PathProblem(p); problem != "" {
		return errors.New("health: path " + problem)
	}
	return nil
}

// PathProblem is ValidatePath's rule as words that follow the path's name (`"healthz" must
// start with "/"`), for a message that names the path in its own way; "" when p is a valid
// path.
func PathProblem(p string) string {
	if !strings.HasPrefix(p, "/") {
		return fmt.Sprintf("%q must start with \"/\"", p)
	}
	for i := 0; i < len(p); i++ {
		// A space would end the request target and CR/LF would inject
		// headers; neither belongs in a path.
		if c := p[i]; c <= ' ' || c == 0x7f {
			return fmt.Sprintf("%q contains a space or control character (escape it, e.g. %%20)", p)
		}
	}
	return ""
}

// TCPReadiness returns a quick readiness check: a TCP
// connect every 3 s with a 400 ms timeout; ready after one success,
// unhealthy after two consecutive failures.
func TCPReadiness() Spec {
	return Spec{
		Type:      TypeTCP,
		Interval:  3 * time.Second,
		Timeout:   400 * time.Millisecond,
		MaxFailed: 2,
	}
}

// validateTarget checks that target is a "host:port" address for the
// network probe types. The host may be empty (the local system, as with
// net.Dial); the port may not.
func (s Spec) validateTarget(target string) error {
	if s.Type == TypeFunc {
		return nil
	}
	_, port, err := net.SplitHostPort(target)
	if err != nil {
		return fmt.Errorf("%w %q: %w", ErrInvalidTarget, target, err)
	}
	if port == "" {
		return fmt.Errorf("%w %q: missing port", ErrInvalidTarget, target)
	}
	return nil
}
