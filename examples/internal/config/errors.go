package config

import (
	"errors"
	"sort"
	"strconv"
	"strings"
)

// Sentinel errors carried by [Error.Err]. Test for them with [errors.Is]; they
// work on the [ErrorList] returned by the Parse and Load functions as well.
var (
	// ErrSyntax reports a file that is not well-formed TOML or YAML.
	ErrSyntax = errors.New("syntax error")
	// ErrUnknownKey reports a key the format does not define (often a typo).
	ErrUnknownKey = errors.New("unknown key")
	// ErrType reports a value of the wrong type, such as a string where a
	// number belongs.
	ErrType = errors.New("wrong type")
	// ErrRequired reports a required key that is absent or empty.
	ErrRequired = errors.New("required key missing")
	// ErrInvalid reports a value of the right type that breaks a rule: out of
	// range, malformed, or in conflict with another value.
	ErrInvalid = errors.New("invalid value")
)

// Error is one problem found in a configuration file. It names the file, the
// line and the key so that an operator can go straight to it.
type Error struct {
	// File is the name given to ParseServer/ParseClient or the path given to
	// LoadServer/LoadClient.
	File string
	// Line is the 1-based line the problem is reported at: the line of the
	// key, or of its enclosing table when the key is missing. It is 0 when
	// the position is unknown, for example when [Server.Validate] or
	// [Client.Validate] check a value built in Go, or when the file cannot be
	// read or is too large.
	Line int
	// Key is the dotted path of the offending key, such as
	// "limits.tcp_port_range", "auth.tenants[1].token" or
	// "tunnels.a.health_check.path". It is empty for problems that concern
	// the whole file.
	Key string
	// Msg says what is wrong, in words meant for the operator.
	Msg string
	// Err is one of the sentinel errors of this package, or the underlying
	// error when the file could not be read.
	Err error
}

// Error formats the problem as "file:line: key: message", leaving out the
// parts that are unknown.
func (e *Error) Error() string {
	var b strings.Builder
	if e.File != "" {
		b.WriteString(e.File)
		if e.Line > 0 {
			b.WriteByte(':')
			b.WriteString(strconv.Itoa(e.Line))
		}
		b.WriteString(": ")
	}
	if e.Key != "" {
		b.WriteString(e.Key)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Unwrap returns Err so that errors.Is(err, ErrUnknownKey) and similar work.
func (e *Error) Unwrap() error { return e.Err }

// ErrorList is every problem found in one file, ordered by line. The Parse,
// Load and Validate functions return a non-empty ErrorList (never a nil
// ErrorList inside a non-nil error) when anything is wrong.
type ErrorList []*Error

// Error returns one "file:line: key: message" line per problem.
func (l ErrorList) Error() string {
	parts := make([]string, len(l))
	for i, e := range l {
		parts[i] = e.Error()
	}
	return strings.Join(parts, "\n")
}

// Unwrap returns the problems so that errors.Is and errors.As see each of them.
func (l ErrorList) Unwrap() []error {
	errs := make([]error, len(l))
	for i, e := range l {
		errs[i] = e
	}
	return errs
}

// err returns the list sorted by line as an error, or nil when it is empty.
func (l ErrorList) err() error {
	if len(l) == 0 {
		return nil
	}
	sort.SliceStable(l, func(i, j int) bool { return l[i].Line < l[j].Line })
	return l
}
