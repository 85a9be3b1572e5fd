package config

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"unicode"
)

// Sentinel errors carried by [Error.Err]. Test for them with [errors.Is]; they
// work on the [ErrorList] returned by the Parse and Load functions as well.
var (
	// ErrSyntax reports a file that is not well-formed TOML or YAML.
	ErrSyntax = errors.New("config: syntax error")
	// ErrUnknownKey reports a key the format does not define (often a typo).
	ErrUnknownKey = errors.New("config: unknown key")
	// ErrType reports a value of the wrong type, such as a string where a
	// number belongs.
	ErrType = errors.New("config: wrong type")
	// ErrRequired reports a required key that is absent or empty.
	ErrRequired = errors.New("config: required key missing")
	// ErrInvalid reports a value of the right type that breaks a rule: out of
	// range, malformed, or in conflict with another value.
	ErrInvalid = errors.New("config: invalid value")
)

// Error is one problem found in a configuration file. It names the file, the
// line and the key so that an operator can go straight to it.
type Error struct {
	// File is the name given to ParseServer/ParseConnector or the path given to
	// LoadServer/LoadConnector.
	File string
	// Line is the 1-based line the problem is reported at: the line of the
	// key, or of its enclosing table when the key is missing. It is 0 when
	// the position is unknown, for example when [Server.Validate] or
	// [Connector.Validate] check a value built in Go, or when the file cannot be
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
			b.WriteString(":" + strconv.Itoa(e.Line))
		}
		b.WriteString(": ")
	}
	if e.Key != "" {
		b.WriteString(e.Key + ": ")
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

// reporter collects the problems of one file. It knows the line of every
// key of the file, so that a problem points at the line of its key or, for
// a missing key, of the enclosing table.
type reporter struct {
	file  string
	lines map[string]int  // key path -> line; nil when checking a value built in Go
	bad   map[string]bool // keys whose value could not be decoded
	errs  ErrorList
}

func newReporter(file string) *reporter {
	return &reporter{file: file, lines: map[string]int{"": 1}, bad: map[string]bool{}}
}

// at records a problem at an explicit line.
func (r *reporter) at(line int, key string, sentinel error, format string, args ...any) {
	r.errs = append(r.errs, &Error{File: r.file, Line: line, Key: key, Msg: fmt.Sprintf(format, args...), Err: sentinel})
}

// add records a problem with key unless key or an enclosing key could not be
// decoded, which would make this problem a consequence of that one.
func (r *reporter) add(key string, sentinel error, format string, args ...any) {
	for k := key; !r.bad[k]; k = parentKey(k) {
		if k == "" {
			r.at(r.lineOf(key), key, sentinel, format, args...)
			return
		}
	}
}

// invalid records problem, unless it is "", as an invalid value of key.
func (r *reporter) invalid(key, problem string) {
	if problem != "" {
		r.add(key, ErrInvalid, "%s", problem)
	}
}

// fail records a problem with key and suppresses later ones about it.
func (r *reporter) fail(key string, sentinel error, format string, args ...any) {
	r.add(key, sentinel, format, args...)
	r.bad[key] = true
}

// lineOf returns the line of key or of its closest enclosing key in the
// file, or 0 when there is no file.
func (r *reporter) lineOf(key string) int {
	if r.lines == nil {
		return 0
	}
	for k := key; k != ""; k = parentKey(k) {
		if l, ok := r.lines[k]; ok {
			return l
		}
	}
	return 1
}

// missing reports whether key is known to be absent from the file.
func (r *reporter) missing(key string) bool {
	_, ok := r.lines[key]
	return r.lines != nil && !ok
}

// lineNote returns " (line N)" for key, or "" when lines are unknown.
func (r *reporter) lineNote(key string) string {
	if l := r.lineOf(key); l > 0 {
		return fmt.Sprintf(" (line %d)", l)
	}
	return ""
}

// err returns the problems sorted by line, or nil when there are none.
func (r *reporter) err() error {
	if len(r.errs) == 0 {
		return nil
	}
	sort.SliceStable(r.errs, func(i, j int) bool { return r.errs[i].Line < r.errs[j].Line })
	return r.errs
}

// bareKey matches keys that need no quoting in a dotted path.
var bareKey = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// joinKey appends name to the dotted path parent, quoting names that are not
// bare keys so that the path stays unambiguous.
func joinKey(parent, name string) string {
	if !bareKey.MatchString(name) {
		name = strconv.Quote(name)
	}
	if parent == "" {
		return name
	}
	return parent + "." + name
}

// indexKey returns the path of element i of the array at path.
func indexKey(path string, i int) string {
	return path + "[" + strconv.Itoa(i) + "]"
}

// parentKey drops the last part of a path: "a.b[2]" -> "a.b" -> "a" -> "".
// A quoted part holding "." or "[" takes more than one step.
func parentKey(key string) string {
	return key[:max(strings.LastIndexAny(key, ".["), 0)]
}

// tagName returns the key a struct field reads by its tag (toml or yaml),
// or "" for none.
func tagName(f reflect.StructField, tag string) string {
	name, _, _ := strings.Cut(f.Tag.Get(tag), ",")
	if name == "-" {
		return ""
	}
	return name
}

// keysOf lists the keys that struct type t reads, its embedded structs
// included.
func keysOf(t reflect.Type, tag string) []string {
	var keys []string
	for _, f := range reflect.VisibleFields(t) {
		if name := tagName(f, tag); name != "" {
			keys = append(keys, name)
		}
	}
	return keys
}

// fieldOf returns the field of struct type t that reads key.
func fieldOf(t reflect.Type, tag, key string) (reflect.StructField, bool) {
	for _, f := range reflect.VisibleFields(t) {
		if key != "" && tagName(f, tag) == key {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

// unknownKeyMessage says a key is unknown and suggests the closest valid
// one (catching typos and camelCase spellings from other tools), or lists
// the valid keys.
func unknownKeyMessage(name string, valid []string) string {
	snake := toSnake(name)
	best, bestDist := "", 3
	for _, v := range valid {
		if d := editDistance(snake, v); d < bestDist && d < len(v)/2+1 {
			best, bestDist = v, d
		}
	}
	if best != "" {
		return fmt.Sprintf("unknown key; did you mean %q?", best)
	}
	sorted := append([]string(nil), valid...)
	sort.Strings(sorted)
	return "unknown key; expected one of: " + strings.Join(sorted, ", ")
}

// toSnake lower-cases name and turns camelCase and dashes into snake_case.
func toSnake(name string) string {
	var b strings.Builder
	for i, r := range name {
		switch {
		case unicode.IsUpper(r) && i > 0:
			b.WriteByte('_')
			b.WriteRune(unicode.ToLower(r))
		case r == '-':
			b.WriteByte('_')
		default:
			b.WriteRune(unicode.ToLower(r))
		}
	}
	return b.String()
}

// editDistance is the Levenshtein distance between two short strings.
func editDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return math.MaxInt
	}
	prev, cur := make([]int, len(b)+1), make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
