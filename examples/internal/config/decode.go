package config

import (
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"
)

// reporter collects problems for one file and knows the line of every key
// that was read, so validation can point at the line of the key at fault
// or, for a missing key, at its enclosing table.
type reporter struct {
	file  string
	yaml  bool           // word messages for YAML ("mapping") rather than TOML ("table")
	lines map[string]int // key path -> line; nil when validating a value built in Go
	bad   map[string]bool
	errs  ErrorList
}

func newReporter(file string, yamlWords bool) *reporter {
	return &reporter{file: file, yaml: yamlWords, lines: map[string]int{"": 1}, bad: map[string]bool{}}
}

// add records a problem with key unless key (or an enclosing key) already
// has a type problem, which would make this one a consequence of it.
func (r *reporter) add(key string, sentinel error, format string, args ...any) {
	if r.suppressed(key) {
		return
	}
	r.errs = append(r.errs, &Error{
		File: r.file,
		Line: r.lineOf(key),
		Key:  key,
		Msg:  fmt.Sprintf(format, args...),
		Err:  sentinel,
	})
}

// fail records a problem with key and suppresses later ones about it.
func (r *reporter) fail(key string, sentinel error, format string, args ...any) {
	r.add(key, sentinel, format, args...)
	r.bad[key] = true
}

func (r *reporter) suppressed(key string) bool {
	for k := key; ; k = parentKey(k) {
		if r.bad[k] {
			return true
		}
		if k == "" {
			return false
		}
	}
}

// lineOf returns the line of key, of its closest enclosing key that is in
// the file, or 0 when there is no file.
func (r *reporter) lineOf(key string) int {
	if r.lines == nil {
		return 0
	}
	for k := key; ; k = parentKey(k) {
		if l, ok := r.lines[k]; ok {
			return l
		}
		if k == "" {
			return 1
		}
	}
}

// missing reports whether key is known to be absent from the file.
func (r *reporter) missing(key string) bool {
	if r.lines == nil {
		return false
	}
	_, ok := r.lines[key]
	return !ok
}

// lineNote returns " (line N)" for key, or "" when lines are unknown.
func (r *reporter) lineNote(key string) string {
	if l := r.lineOf(key); l > 0 {
		return fmt.Sprintf(" (line %d)", l)
	}
	return ""
}

// parentKey drops the last part of a dotted key path: "a.b[2]" -> "a.b",
// `a."x.y"` -> "a".
func parentKey(key string) string {
	parts := splitKey(key)
	if len(parts) <= 1 {
		return ""
	}
	var b strings.Builder
	for _, p := range parts[:len(parts)-1] {
		if b.Len() > 0 && !strings.HasPrefix(p, "[") {
			b.WriteByte('.')
		}
		b.WriteString(p)
	}
	return b.String()
}

// splitKey splits a path built by joinKey and indexKey into its parts.
func splitKey(key string) []string {
	var parts []string
	for s := key; s != ""; {
		switch {
		case s[0] == '.':
			s = s[1:]
		case s[0] == '[':
			end := strings.IndexByte(s, ']')
			if end < 0 {
				return append(parts, s)
			}
			parts = append(parts, s[:end+1])
			s = s[end+1:]
		case s[0] == '"':
			q, err := strconv.QuotedPrefix(s)
			if err != nil {
				return append(parts, s)
			}
			parts = append(parts, q)
			s = s[len(q):]
		default:
			end := strings.IndexAny(s, ".[")
			if end < 0 {
				end = len(s)
			}
			parts = append(parts, s[:end])
			s = s[end:]
		}
	}
	return parts
}

// typeError reports a value of the wrong type.
func (r *reporter) typeError(key string, v *value, want string) {
	msg := fmt.Sprintf("expected %s, got %s", want, v.describe(r.yaml))
	if r.yaml && want == "a string" && (v.kind == kindInteger || v.kind == kindFloat || v.kind == kindBool) {
		msg += " (put the value in quotes to use it as a string)"
	}
	r.fail(key, ErrType, "%s", msg)
}

// table reads the keys of one table of the file.
type table struct {
	r      *reporter
	path   string
	found  bool
	fields map[string]field
	order  []field
}

// openTable checks that v is a table whose keys are all in keys (any key
// when keys is nil) and records the line of each key. A nil or null v gives
// an empty table that was not found.
func (r *reporter) openTable(path string, v *value, keys []string) *table {
	t := &table{r: r, path: path, fields: map[string]field{}}
	if v == nil || v.kind == kindNull {
		return t
	}
	if v.kind != kindTable {
		r.typeError(path, v, r.tableWord())
		return t
	}
	t.found = true
	for _, f := range v.fields {
		p := joinKey(path, f.name)
		r.lines[p] = f.line
		if keys != nil && !contains(keys, f.name) {
			r.fail(p, ErrUnknownKey, "%s", unknownKeyMessage(f.name, keys))
			continue
		}
		t.fields[f.name] = f
		t.order = append(t.order, f)
	}
	return t
}

// tableWord names the table type in the words of the format.
func (r *reporter) tableWord() string {
	if r.yaml {
		return "a mapping"
	}
	return "a table"
}

// get returns the value of key, or nil when it is absent or null, and the
// key's path.
func (t *table) get(key string) (*value, string) {
	p := joinKey(t.path, key)
	f, ok := t.fields[key]
	if !ok || f.val.kind == kindNull {
		return nil, p
	}
	return f.val, p
}

// sub opens the table stored under key.
func (t *table) sub(key string, keys []string) *table {
	v, p := t.get(key)
	return t.r.openTable(p, v, keys)
}

// str reads a string into dst and reports whether it did.
func (t *table) str(key string, dst *string) bool {
	v, p := t.get(key)
	if v == nil {
		return false
	}
	if v.kind != kindString {
		t.r.typeError(p, v, "a string")
		return false
	}
	*dst = v.str
	return true
}

func (t *table) boolean(key string, dst *bool) {
	v, p := t.get(key)
	if v == nil {
		return
	}
	if v.kind != kindBool {
		t.r.typeError(p, v, "a boolean (true or false)")
		return
	}
	*dst = v.flag
}

func (t *table) int64(key string, dst *int64) {
	v, p := t.get(key)
	if v == nil {
		return
	}
	t.r.intValue(p, v, dst)
}

func (t *table) integer(key string, dst *int) {
	var n int64
	v, p := t.get(key)
	if v == nil || !t.r.intValue(p, v, &n) {
		return
	}
	if int64(int(n)) != n {
		t.r.fail(p, ErrInvalid, "%d is out of range", n)
		return
	}
	*dst = int(n)
}

func (r *reporter) intValue(p string, v *value, dst *int64) bool {
	if v.kind != kindInteger {
		r.typeError(p, v, "an integer")
		return false
	}
	*dst = v.num
	return true
}

// maxSeconds is the longest duration a *_secs key may hold.
const maxSeconds = float64(math.MaxInt64 / int64(time.Second))

// seconds reads a number of seconds (an integer or a fraction) as a
// duration. The sign is checked by validation.
func (t *table) seconds(key string, dst *time.Duration) {
	v, p := t.get(key)
	if v == nil {
		return
	}
	var secs float64
	switch v.kind {
	case kindInteger:
		secs = float64(v.num)
	case kindFloat:
		secs = v.flt
	default:
		t.r.typeError(p, v, "a number of seconds")
		return
	}
	switch {
	case !finite(secs):
		t.r.fail(p, ErrInvalid, "must be a finite number of seconds, got %s", formatSeconds(secs))
	case math.Abs(secs) > maxSeconds:
		t.r.fail(p, ErrInvalid, "%s seconds is too long", formatSeconds(secs))
	default:
		d := time.Duration(math.Round(secs * float64(time.Second)))
		if d == 0 && secs != 0 {
			t.r.fail(p, ErrInvalid, "%s seconds is below the 1ns resolution", formatSeconds(secs))
			return
		}
		*dst = d
	}
}

// strings reads an array of strings, recording the line of each element.
func (t *table) strings(key string, dst *[]string) {
	v, p := t.get(key)
	if v == nil {
		return
	}
	if v.kind != kindArray {
		t.r.typeError(p, v, "an array of strings")
		return
	}
	out := make([]string, 0, len(v.items))
	ok := true
	for i, item := range v.items {
		ip := indexKey(p, i)
		t.r.lines[ip] = item.line
		if item.kind != kindString {
			t.r.typeError(ip, item, "a string")
			ok = false
			continue
		}
		out = append(out, item.str)
	}
	if ok {
		*dst = out
	}
}

// items reads an array, recording the line of each element. ok is false
// when the key is absent or not an array.
func (t *table) items(key string) (items []*value, path string, ok bool) {
	v, p := t.get(key)
	if v == nil {
		return nil, p, false
	}
	if v.kind != kindArray {
		t.r.typeError(p, v, "an array")
		return nil, p, false
	}
	for i, item := range v.items {
		t.r.lines[indexKey(p, i)] = item.line
	}
	return v.items, p, true
}

func formatSeconds(s float64) string {
	return strconv.FormatFloat(s, 'g', -1, 64)
}

func formatDuration(d time.Duration) string {
	return formatSeconds(d.Seconds())
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// unknownKeyMessage says a key is unknown and suggests the closest valid
// one (catching typos and camelCase spellings from other tools), or lists
// the valid keys.
func unknownKeyMessage(name string, valid []string) string {
	snake := toSnake(name)
	best, bestDist := "", 3
	for _, v := range valid {
		if v == snake {
			best, bestDist = v, 0
			break
		}
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
	if len(name) > 64 {
		return name
	}
	var b strings.Builder
	for i, r := range name {
		switch {
		case unicode.IsUpper(r):
			if i > 0 {
				b.WriteByte('_')
			}
			b.WriteRune(unicode.ToLower(r))
		case r == '-':
			b.WriteByte('_')
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// editDistance is the Levenshtein distance between two short strings.
func editDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return math.MaxInt
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
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

// resolvePath makes a relative path relative to dir (the directory of the
// configuration file); dir "" leaves it relative to the working directory.
func resolvePath(dir, p string) string {
	if p == "" || dir == "" || filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(dir, p)
}

// checkFile reports why path cannot be used as a file, or "".
func checkFile(path string) string {
	fi, err := os.Stat(path)
	switch {
	case err != nil:
		return fmt.Sprintf("cannot use %q: %v", path, unwrapPathError(err))
	case fi.IsDir():
		return fmt.Sprintf("%q is a directory, not a file", path)
	default:
		return ""
	}
}

func unwrapPathError(err error) error {
	if pe, ok := err.(*os.PathError); ok {
		return pe.Err
	}
	return err
}

// maxFileSize bounds the configuration text accepted. Real files are a few
// kilobytes; the bound keeps a wrong path (a log, a binary) or a hostile
// document from costing much time, since go-toml checks duplicate keys in
// time quadratic in the number of keys of a table.
const maxFileSize = 256 << 10

// sizeError reports text larger than maxFileSize, or returns nil.
func sizeError(file string, n int) error {
	if n <= maxFileSize {
		return nil
	}
	return ErrorList{{File: file, Msg: fmt.Sprintf("the file is larger than %d bytes; is this the right file?", maxFileSize), Err: ErrInvalid}}
}

// readFile reads a configuration file of at most maxFileSize bytes.
func readFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, ErrorList{{File: path, Msg: "cannot read the configuration file: " + unwrapPathError(err).Error(), Err: err}}
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxFileSize+1))
	if err != nil {
		return nil, ErrorList{{File: path, Msg: "cannot read the configuration file: " + unwrapPathError(err).Error(), Err: err}}
	}
	if err := sizeError(path, len(data)); err != nil {
		return nil, err
	}
	return data, nil
}
