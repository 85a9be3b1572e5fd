package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
)

// config.yml is parsed by yaml.v3 into a yaml.Node tree, which keeps the
// line of every key. The mappings of that tree are walked against the yaml
// tags of the target structs, so that unknown and duplicate keys are
// reported with their line and full path; each scalar is decoded by yaml.v3
// (Node.Decode) once its resolved tag shows it has the expected type, so
// that "8080" is an integer and "'8080'" a string, as YAML defines.

// parseYAML parses data as one YAML document and returns its root node,
// nil for an empty document.
func parseYAML(file string, data []byte) (root *yaml.Node, _ *Error) {
	if e := checkYAMLText(file, data); e != nil {
		return nil, e
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for i := 0; ; i++ {
		var doc yaml.Node
		switch err := dec.Decode(&doc); {
		case errors.Is(err, io.EOF):
			return root, nil
		case err != nil:
			return nil, yamlSyntaxError(file, err)
		case i == 0 && len(doc.Content) > 0:
			root = doc.Content[0]
		case i > 0 && !isNull(&doc): // a bare "---" is harmless
			return nil, &Error{File: file, Line: max(doc.Line, 1),
				Msg: "the file holds more than one YAML document; keep exactly one", Err: ErrSyntax}
		}
	}
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

// yamlLineRE extracts the line yaml.v3 puts in its syntax errors.
var yamlLineRE = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// yamlSyntaxError turns a yaml.v3 parse error into an *Error. yaml.v3 leaves
// the line out for problems on the first line.
func yamlSyntaxError(file string, err error) *Error {
	msg, line := strings.TrimPrefix(err.Error(), "yaml: "), 1
	if m := yamlLineRE.FindStringSubmatch(err.Error()); m != nil {
		line, _ = strconv.Atoi(m[1])
		msg = m[2]
	}
	return &Error{File: file, Line: max(line, 1), Msg: "invalid YAML: " + msg, Err: ErrSyntax}
}

// yamlPair is one key of a mapping and its value.
type yamlPair struct{ key, val *yaml.Node }

// yamlMapping returns the pairs of the mapping n. Null is an empty mapping;
// ok is false when n is not a mapping.
func (r *reporter) yamlMapping(n *yaml.Node, path string) (pairs []yamlPair, ok bool) {
	if n = deref(n); isNull(n) {
		return nil, true
	}
	if n.Kind != yaml.MappingNode {
		r.fail(path, ErrType, "expected a mapping, got %s", yamlKindName(n))
		return nil, false
	}
	r.yamlPairs(n, path, map[string]int{}, map[*yaml.Node]bool{}, &pairs)
	return pairs, true
}

// yamlPairs appends the pairs of the mapping n whose keys are not yet
// seen: its own keys in order, then those its merge keys ("<<: *defaults")
// bring in, so that explicit keys win over merged ones and earlier merges
// over later ones. Duplicate and non-scalar keys are reported where the
// mapping is written, not where it is merged; merging each mapping once
// keeps alias bombs cheap.
func (r *reporter) yamlPairs(n *yaml.Node, path string, seen map[string]int, merged map[*yaml.Node]bool, pairs *[]yamlPair) {
	own := len(merged) == 0
	merged[n] = true
	var merges []*yaml.Node
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		switch first, dup := seen[k.Value]; {
		case k.Kind == yaml.ScalarNode && k.ShortTag() == "!!merge":
			if v = deref(v); v.Kind == yaml.SequenceNode {
				merges = append(merges, v.Content...)
			} else {
				merges = append(merges, v)
			}
		case k.Kind != yaml.ScalarNode:
			if own {
				r.at(k.Line, path, ErrSyntax, "invalid YAML: a key must be a plain string, not %s", yamlKindName(k))
			}
		case dup:
			if own {
				r.at(k.Line, joinKey(path, k.Value), ErrSyntax, "invalid YAML: duplicate key (first defined on line %d)", first)
			}
		default:
			seen[k.Value] = k.Line
			*pairs = append(*pairs, yamlPair{k, v})
		}
	}
	for _, m := range merges {
		if m = deref(m); m.Kind != yaml.MappingNode {
			r.at(m.Line, path, ErrSyntax, "invalid YAML: a merge key (<<) needs a mapping or a sequence of mappings")
		} else if !merged[m] {
			r.yamlPairs(m, path, seen, merged, pairs)
		}
	}
}

// yamlFields decodes the mapping n into the struct dst points to. Every key
// must be read by a field, named by its yaml tag. Scalar fields are decoded
// in place; the values of struct, pointer and slice fields are returned by
// key for the caller to decode. Null values count as absent.
func (r *reporter) yamlFields(n *yaml.Node, path string, dst any) map[string]*yaml.Node {
	pairs, _ := r.yamlMapping(n, path)
	v := reflect.ValueOf(dst).Elem()
	nested := map[string]*yaml.Node{}
	for _, p := range pairs {
		key, val := joinKey(path, p.key.Value), deref(p.val)
		r.lines[key] = p.key.Line
		f, ok := fieldOf(v.Type(), "yaml", p.key.Value)
		if !ok {
			r.fail(key, ErrUnknownKey, "%s", unknownKeyMessage(p.key.Value, keysOf(v.Type(), "yaml")))
			continue
		}
		switch kind := f.Type.Kind(); {
		case isNull(val):
		case kind == reflect.Struct || kind == reflect.Pointer || kind == reflect.Slice:
			nested[p.key.Value] = val
		default:
			r.yamlScalar(val, key, v.FieldByIndex(f.Index))
		}
	}
	return nested
}

// yamlScalarTags are the resolved tags each kind of scalar field accepts.
var yamlScalarTags = map[reflect.Kind]string{reflect.String: "!!str", reflect.Int: "!!int", reflect.Bool: "!!bool"}

// yamlScalar decodes the scalar n into dst when n has the type dst needs.
// A time.Duration is written as a number of seconds.
func (r *reporter) yamlScalar(n *yaml.Node, key string, dst reflect.Value) {
	tag, got := n.ShortTag(), yamlKindName(n)
	var err error
	switch {
	case n.Kind != yaml.ScalarNode:
	case dst.Type() == durationType:
		if tag == "!!int" || tag == "!!float" {
			var secs float64
			if err = n.Decode(&secs); err == nil {
				r.duration(key, secs, dst.Addr().Interface().(*time.Duration))
				return
			}
		}
	case tag == yamlScalarTags[dst.Kind()]:
		if err = n.Decode(dst.Addr().Interface()); err == nil {
			return
		}
	}
	if name := map[string]string{"!!int": "an integer outside the 64-bit range", "!!float": "an invalid number"}[tag]; err != nil && name != "" {
		got = name
	}
	msg := fmt.Sprintf("expected %s, got %s", describeType(dst.Type(), "a mapping"), got)
	if dst.Kind() == reflect.String && (tag == "!!int" || tag == "!!float" || tag == "!!bool") {
		msg += " (put the value in quotes to use it as a string)"
	}
	r.fail(key, ErrType, "%s", msg)
}

// yamlTagNames name the resolved tags of scalars for messages.
var yamlTagNames = map[string]string{
	"!!str": "a string", "!!int": "an integer", "!!float": "a floating-point number", "!!bool": "a boolean",
	"!!null": "null", "!!timestamp": "a timestamp", "!!binary": "binary data",
}

// yamlKindName names the type of n for a message.
func yamlKindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a sequence"
	case yaml.AliasNode:
		return "an alias"
	}
	if name, ok := yamlTagNames[n.ShortTag()]; ok {
		return name
	}
	return fmt.Sprintf("a value tagged %q", n.ShortTag())
}

// deref returns the node an alias stands for.
func deref(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	return n
}

// isNull reports whether n is absent, null or an empty document.
func isNull(n *yaml.Node) bool {
	for n != nil && n.Kind == yaml.DocumentNode {
		if len(n.Content) == 0 {
			return true
		}
		n = n.Content[0]
	}
	return n == nil || n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

// yamlStrings decodes a sequence of strings (nil for an absent or null value).
func (r *reporter) yamlStrings(n *yaml.Node, path string) []string {
	if n == nil || isNull(n) {
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		r.fail(path, ErrType, "expected a list of strings, got %s", yamlKindName(n))
		return nil
	}
	out := make([]string, len(n.Content))
	for i, item := range n.Content {
		key := indexKey(path, i)
		if r.lines != nil {
			r.lines[key] = item.Line
		}
		r.yamlScalar(deref(item), key, reflect.ValueOf(&out[i]).Elem())
	}
	return out
}
