package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	toml "github.com/pelletier/go-toml/v2"
	"github.com/pelletier/go-toml/v2/unstable"
	"go.yaml.in/yaml/v3"
)

// This file turns a TOML or YAML document into one small tree of values in
// which every key carries its line. The schema code in decode.go reads that
// tree, so both formats get the same unknown-key, type and range checks and
// the same wording.

// kind is the type of a value in the tree.
type kind int

const (
	kindNull kind = iota
	kindString
	kindInteger
	kindFloat
	kindBool
	kindTable
	kindArray
	kindOther // dates, times, binary data, custom YAML tags
)

// value is one node of the document.
type value struct {
	kind   kind
	line   int
	str    string
	num    int64
	flt    float64
	flag   bool
	fields []field  // kindTable, in document order
	items  []*value // kindArray
	other  string   // kindOther: how to name it in a message
}

// field is one key of a table with the line the key is written on.
type field struct {
	name string
	line int
	val  *value
}

// describe names the type of v for a message, in the words of the format.
func (v *value) describe(yamlWords bool) string {
	switch v.kind {
	case kindNull:
		return "null"
	case kindString:
		return "a string"
	case kindInteger:
		return "an integer"
	case kindFloat:
		return "a floating-point number"
	case kindBool:
		return "a boolean"
	case kindTable:
		if yamlWords {
			return "a mapping"
		}
		return "a table"
	case kindArray:
		if yamlWords {
			return "a sequence"
		}
		return "an array"
	default:
		return v.other
	}
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

// ---------------------------------------------------------------- TOML

// parseTOML decodes data with go-toml (which enforces the TOML grammar and
// its rules on duplicate keys and tables) and attaches the line of every key,
// found with go-toml's unstable AST parser.
func parseTOML(file string, data []byte) (*value, *Error) {
	var doc map[string]any
	if err := toml.Unmarshal(data, &doc); err != nil {
		return nil, tomlError(file, data, err)
	}
	lines, _ := tomlLines(data)
	return tomlValue(doc, "", 0, 1, lines), nil
}

// tomlError turns a go-toml error into an *Error with a line and, when it
// can be found, the full path of the key on that line.
func tomlError(file string, data []byte, err error) *Error {
	var de *toml.DecodeError
	if !errors.As(err, &de) {
		return &Error{File: file, Line: 1, Msg: "invalid TOML: " + err.Error(), Err: ErrSyntax}
	}
	line, _ := de.Position()
	if line < 1 {
		line = 1
	}
	_, onLine := tomlLines(data)
	key := onLine[line]
	if key == "" {
		for _, k := range de.Key() {
			key = joinKey(key, k)
		}
	}
	msg := strings.TrimPrefix(de.Error(), "toml: ")
	return &Error{File: file, Line: line, Key: key, Msg: "invalid TOML: " + msg, Err: ErrSyntax}
}

// maxPathDepth bounds how many key parts the TOML code tracks. The schema
// is at most four parts deep (auth.tenants[0].name); deeper keys are unknown
// anyway, and tracking them would cost time quadratic in their depth.
const maxPathDepth = 8

// tomlLines walks the TOML AST and returns the line of every key path
// (tables, array-table entries, keys and array elements, up to maxPathDepth
// parts) and, for each line, the last key path written on it. It stops
// quietly at a syntax error.
func tomlLines(data []byte) (lines map[string]int, onLine map[int]string) {
	w := tomlWalker{
		lines:  map[string]int{"": 1},
		onLine: map[int]string{},
		arrays: map[string]int{},
	}
	for i, b := range data {
		if b == '\n' {
			w.newlines = append(w.newlines, i)
		}
	}
	w.p.Reset(data)
	cur, curDepth := "", 0
	for w.p.NextExpression() {
		e := w.p.Expression()
		switch e.Kind {
		case unstable.Table, unstable.ArrayTable:
			parts, line := w.keyParts(e)
			if len(parts) == 0 || len(parts) > maxPathDepth {
				cur, curDepth = "", maxPathDepth+1 // too deep: not tracked
				continue
			}
			prefix := w.resolve(parts[:len(parts)-1], line)
			cur, curDepth = joinKey(prefix, parts[len(parts)-1]), len(parts)
			w.record(cur, line)
			if e.Kind == unstable.ArrayTable {
				n := w.arrays[cur]
				w.arrays[cur] = n + 1
				cur = indexKey(cur, n)
				curDepth++
				w.lines[cur] = line
			}
			w.onLine[line] = cur
		case unstable.KeyValue:
			w.keyValue(cur, curDepth, e)
		}
	}
	return w.lines, w.onLine
}

type tomlWalker struct {
	p        unstable.Parser
	newlines []int // offsets of the '\n' bytes of the document
	lines    map[string]int
	onLine   map[int]string
	arrays   map[string]int // array-of-tables path -> entries so far
}

// line returns the line an AST node starts on. (Parser.Shape would scan
// the document from the start on every call.)
func (w *tomlWalker) line(n *unstable.Node) int {
	return sort.SearchInts(w.newlines, int(n.Raw.Offset)) + 1
}

// keyParts returns the parts of the key of a table header or key-value
// (at most maxPathDepth+1 of them) and the line of its first part.
func (w *tomlWalker) keyParts(n *unstable.Node) ([]string, int) {
	var parts []string
	line := 0
	it := n.Key()
	for it.Next() && len(parts) <= maxPathDepth {
		k := it.Node()
		if line == 0 {
			line = w.line(k)
		}
		parts = append(parts, string(k.Data))
	}
	return parts, line
}

// record remembers the first line a path appears on.
func (w *tomlWalker) record(path string, line int) {
	if _, ok := w.lines[path]; !ok {
		w.lines[path] = line
	}
}

// resolve turns table-header parts into a path, stepping into the latest
// entry of any array of tables on the way, as TOML does.
func (w *tomlWalker) resolve(parts []string, line int) string {
	path := ""
	for _, p := range parts {
		path = joinKey(path, p)
		if n, ok := w.arrays[path]; ok && n > 0 {
			path = indexKey(path, n-1)
		}
		w.record(path, line)
	}
	return path
}

func (w *tomlWalker) keyValue(base string, depth int, kv *unstable.Node) {
	parts, line := w.keyParts(kv)
	path := base
	for _, p := range parts {
		if depth++; depth > maxPathDepth {
			return
		}
		path = joinKey(path, p)
		w.record(path, line)
	}
	w.lines[path] = line
	w.onLine[line] = path
	w.value(path, depth, kv.Value(), line)
}

func (w *tomlWalker) value(path string, depth int, v *unstable.Node, line int) {
	if depth >= maxPathDepth {
		return
	}
	switch v.Kind {
	case unstable.Array:
		i := 0
		it := v.Children()
		for it.Next() {
			el := it.Node()
			elLine := line
			if el.Raw.Length > 0 {
				elLine = w.line(el)
			}
			ep := indexKey(path, i)
			w.lines[ep] = elLine
			w.value(ep, depth+1, el, elLine)
			i++
		}
	case unstable.InlineTable:
		it := v.Children()
		for it.Next() {
			if kv := it.Node(); kv.Kind == unstable.KeyValue {
				w.keyValue(path, depth, kv)
			}
		}
	}
}

// tomlValue converts what go-toml decoded into the tree. Lines come from
// the AST walk; a path it missed falls back to the enclosing line. Below
// maxPathDepth only the kind of a value is kept.
func tomlValue(x any, path string, depth, line int, lines map[string]int) *value {
	lineOf := func(p string) int {
		if l, ok := lines[p]; ok {
			return l
		}
		return line
	}
	switch t := x.(type) {
	case map[string]any:
		v := &value{kind: kindTable, line: line}
		if depth >= maxPathDepth {
			return v
		}
		for name, child := range t {
			p := joinKey(path, name)
			l := lineOf(p)
			v.fields = append(v.fields, field{name: name, line: l, val: tomlValue(child, p, depth+1, l, lines)})
		}
		sort.Slice(v.fields, func(i, j int) bool {
			if v.fields[i].line != v.fields[j].line {
				return v.fields[i].line < v.fields[j].line
			}
			return v.fields[i].name < v.fields[j].name
		})
		return v
	case []any:
		v := &value{kind: kindArray, line: line}
		if depth >= maxPathDepth {
			return v
		}
		for i, child := range t {
			p := indexKey(path, i)
			v.items = append(v.items, tomlValue(child, p, depth+1, lineOf(p), lines))
		}
		return v
	case string:
		return &value{kind: kindString, line: line, str: t}
	case int64:
		return &value{kind: kindInteger, line: line, num: t}
	case float64:
		return &value{kind: kindFloat, line: line, flt: t}
	case bool:
		return &value{kind: kindBool, line: line, flag: t}
	case time.Time, toml.LocalDateTime:
		return &value{kind: kindOther, line: line, other: "a date-time"}
	case toml.LocalDate:
		return &value{kind: kindOther, line: line, other: "a date"}
	case toml.LocalTime:
		return &value{kind: kindOther, line: line, other: "a time"}
	default:
		return &value{kind: kindOther, line: line, other: fmt.Sprintf("a %T", x)}
	}
}

// ---------------------------------------------------------------- YAML

// Limits on what alias expansion may cost. Configuration files are a few
// dozen keys; these bounds only stop documents built to explode ("billion
// laughs") or to loop (an anchor that contains its own alias).
const (
	yamlMaxDepth = 64
	yamlMaxNodes = 100_000
)

// yamlLineRE extracts the line yaml.v3 puts in its syntax errors.
var yamlLineRE = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// parseYAML parses data as exactly one YAML document and converts it into
// the tree. Structural problems (duplicate keys, keys that are not scalars)
// are appended to errs; a syntax error stops parsing and is returned.
func parseYAML(file string, data []byte, errs *ErrorList) (*value, *Error) {
	if e := checkYAMLText(file, data); e != nil {
		return nil, e
	}
	// Decoding into a yaml.Node keeps every key's line. KnownFields has no
	// effect on a Node, so unknown keys are found by the schema code.
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return &value{kind: kindTable, line: 1}, nil // empty file
		}
		return nil, yamlSyntaxError(file, err)
	}
	for {
		var extra yaml.Node
		err := dec.Decode(&extra)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, yamlSyntaxError(file, err)
		}
		if !emptyDocument(&extra) { // a bare "---" is harmless
			return nil, &Error{File: file, Line: max(extra.Line, 1),
				Msg: "the file holds more than one YAML document; keep exactly one", Err: ErrSyntax}
		}
	}
	c := yamlConverter{file: file, errs: errs}
	root := &doc
	if root.Kind == yaml.DocumentNode {
		if len(root.Content) == 0 {
			return &value{kind: kindTable, line: 1}, nil
		}
		root = root.Content[0]
	}
	v, err := c.convert(root, "", 0, nil)
	if err != nil {
		return nil, err
	}
	if v.kind == kindNull {
		return &value{kind: kindTable, line: 1}, nil // only comments
	}
	return v, nil
}

// emptyDocument reports whether a YAML document holds nothing but null.
func emptyDocument(doc *yaml.Node) bool {
	for _, n := range doc.Content {
		if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!null" {
			return false
		}
	}
	return true
}

// checkYAMLText reports text yaml.v3 would reject without saying where:
// invalid UTF-8 and control characters. Lines are counted as YAML does: CR,
// LF, CR LF, NEL, LS and PS each end a line.
func checkYAMLText(file string, data []byte) *Error {
	line := 1
	for i := 0; i < len(data); {
		r, size := utf8.DecodeRune(data[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			return &Error{File: file, Line: line, Msg: fmt.Sprintf("invalid YAML: byte 0x%02x is not valid UTF-8", data[i]), Err: ErrSyntax}
		case r == '\r' && i+1 < len(data) && data[i+1] == '\n':
			// counted at the '\n'
		case r == '\n', r == '\r', r == 0x85, r == 0x2028, r == 0x2029:
			line++
		case r == '\t', r == 0xFEFF && i == 0:
		case r < 0x20, r >= 0x7F && r < 0xA0, r >= 0xD800 && r <= 0xDFFF, r == 0xFEFF, r == 0xFFFE, r == 0xFFFF:
			return &Error{File: file, Line: line, Msg: fmt.Sprintf("invalid YAML: control character %U is not allowed", r), Err: ErrSyntax}
		}
		i += size
	}
	return nil
}

// yamlSyntaxError turns a yaml.v3 parse error into an *Error. yaml.v3 leaves
// the line out for problems on the first line.
func yamlSyntaxError(file string, err error) *Error {
	msg := err.Error()
	line := 1
	if m := yamlLineRE.FindStringSubmatch(msg); m != nil {
		if n, convErr := strconv.Atoi(m[1]); convErr == nil && n > 0 {
			line = n
		}
		msg = m[2]
	} else {
		msg = strings.TrimPrefix(msg, "yaml: ")
	}
	return &Error{File: file, Line: line, Msg: "invalid YAML: " + msg, Err: ErrSyntax}
}

type yamlConverter struct {
	file  string
	errs  *ErrorList
	nodes int
}

func (c *yamlConverter) problem(path string, line int, format string, args ...any) {
	*c.errs = append(*c.errs, &Error{File: c.file, Line: line, Key: path, Msg: fmt.Sprintf(format, args...), Err: ErrSyntax})
}

// aliasUse is where the outermost alias being expanded is written; limit
// errors point there rather than deep inside the expansion.
type aliasUse struct {
	path string
	line int
}

func (c *yamlConverter) convert(n *yaml.Node, path string, depth int, alias *aliasUse) (*value, *Error) {
	c.nodes++
	if depth > yamlMaxDepth || c.nodes > yamlMaxNodes {
		if alias == nil {
			return nil, &Error{File: c.file, Line: n.Line, Key: path,
				Msg: fmt.Sprintf("invalid YAML: values nest more than %d levels deep", yamlMaxDepth), Err: ErrSyntax}
		}
		return nil, &Error{File: c.file, Line: alias.line, Key: alias.path,
			Msg: "invalid YAML: aliases nest too deep or expand to too many values", Err: ErrSyntax}
	}
	switch n.Kind {
	case yaml.AliasNode:
		if n.Alias == nil {
			return &value{kind: kindNull, line: n.Line}, nil
		}
		if alias == nil {
			alias = &aliasUse{path: path, line: n.Line}
		}
		v, err := c.convert(n.Alias, path, depth+1, alias)
		if err != nil {
			return nil, err
		}
		cp := *v
		cp.line = n.Line
		return &cp, nil
	case yaml.MappingNode:
		return c.mapping(n, path, depth, alias)
	case yaml.SequenceNode:
		v := &value{kind: kindArray, line: n.Line}
		for i, item := range n.Content {
			iv, err := c.convert(item, indexKey(path, i), depth+1, alias)
			if err != nil {
				return nil, err
			}
			v.items = append(v.items, iv)
		}
		return v, nil
	case yaml.ScalarNode:
		return c.scalar(n), nil
	default:
		return &value{kind: kindNull, line: n.Line}, nil
	}
}

// scalar converts a scalar by its resolved tag, so that "8080" is an
// integer and "'8080'" is a string, as YAML defines.
func (c *yamlConverter) scalar(n *yaml.Node) *value {
	v := &value{line: n.Line}
	switch tag := n.ShortTag(); tag {
	case "!!str":
		v.kind, v.str = kindString, n.Value
	case "!!null":
		v.kind = kindNull
	case "!!bool":
		v.kind = kindBool
		if n.Decode(&v.flag) != nil {
			v.kind, v.other = kindOther, "an invalid boolean"
		}
	case "!!int":
		v.kind = kindInteger
		if n.Decode(&v.num) != nil {
			v.kind, v.other = kindOther, "an integer outside the 64-bit range"
		}
	case "!!float":
		v.kind = kindFloat
		if n.Decode(&v.flt) != nil {
			v.kind, v.other = kindOther, "an invalid number"
		}
	case "!!timestamp":
		v.kind, v.other = kindOther, "a timestamp"
	case "!!binary":
		v.kind, v.other = kindOther, "binary data"
	default:
		v.kind, v.other = kindOther, "a value tagged "+strconv.Quote(tag)
	}
	return v
}

// mapping converts a mapping, rejecting duplicate and non-scalar keys and
// applying merge keys ("<<: *defaults"): explicit keys win over merged ones,
// earlier merges over later ones.
func (c *yamlConverter) mapping(n *yaml.Node, path string, depth int, alias *aliasUse) (*value, *Error) {
	v := &value{kind: kindTable, line: n.Line}
	firstLine := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := n.Content[i]
		if k.Kind == yaml.ScalarNode && k.ShortTag() != "!!merge" {
			if _, dup := firstLine[k.Value]; !dup {
				firstLine[k.Value] = k.Line
			}
		}
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		if k.Kind == yaml.ScalarNode && k.ShortTag() == "!!merge" {
			merged, err := c.merge(val, path, depth, alias)
			if err != nil {
				return nil, err
			}
			for _, f := range merged {
				if _, explicit := firstLine[f.name]; explicit || seen[f.name] {
					continue
				}
				seen[f.name] = true
				v.fields = append(v.fields, f)
			}
			continue
		}
		if k.Kind != yaml.ScalarNode {
			c.problem(path, k.Line, "invalid YAML: a key must be a plain string, not %s", yamlKindName(k.Kind))
			continue
		}
		p := joinKey(path, k.Value)
		if seen[k.Value] {
			c.problem(p, k.Line, "invalid YAML: duplicate key (first defined on line %d)", firstLine[k.Value])
			continue
		}
		seen[k.Value] = true
		fv, err := c.convert(val, p, depth+1, alias)
		if err != nil {
			return nil, err
		}
		v.fields = append(v.fields, field{name: k.Value, line: k.Line, val: fv})
	}
	return v, nil
}

// merge returns the fields a "<<" key brings in.
func (c *yamlConverter) merge(val *yaml.Node, path string, depth int, alias *aliasUse) ([]field, *Error) {
	mv, err := c.convert(val, path, depth+1, alias)
	if err != nil {
		return nil, err
	}
	var sources []*value
	switch mv.kind {
	case kindTable:
		sources = []*value{mv}
	case kindArray:
		sources = mv.items
	}
	var out []field
	for _, s := range sources {
		if s.kind != kindTable {
			c.problem(path, val.Line, "invalid YAML: a merge key (<<) needs a mapping or a sequence of mappings")
			return nil, nil
		}
		out = append(out, s.fields...)
	}
	if len(sources) == 0 {
		c.problem(path, val.Line, "invalid YAML: a merge key (<<) needs a mapping or a sequence of mappings")
	}
	return out, nil
}

func yamlKindName(k yaml.Kind) string {
	switch k {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a sequence"
	case yaml.AliasNode:
		return "an alias"
	default:
		return "a complex value"
	}
}

// finite reports whether f is a usable number (not NaN or ±Inf).
func finite(f float64) bool { return !math.IsNaN(f) && !math.IsInf(f, 0) }
