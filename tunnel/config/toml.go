package config

import (
	"bytes"
	"errors"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"

	toml "github.com/pelletier/go-toml/v2"
	"github.com/pelletier/go-toml/v2/unstable"
)

// server.toml is decoded by go-toml straight into serverFile; go-toml
// reports syntax errors and values of the wrong type with their position.
// go-toml's own parser (package unstable) maps each position to the full
// key path and gives the line of every key, so that unknown keys and the
// problems validation finds can point at lines too. (The decoder's strict
// mode would report unknown keys as well, but it renders each one against
// the whole document, which costs quadratic time on a large file.)

// serverFile is server.toml as go-toml decodes it. Keys written unlike
// their Go value are read into fields of their own, which shadow the
// fields of the embedded struct.
type serverFile struct {
	Server struct {
		ServerSection
		Bind      *string `toml:"bind"`
		AdminBind *string `toml:"admin_bind"`
	} `toml:"server"`
	TLS    ServerTLS `toml:"tls"`
	Auth   Auth      `toml:"auth"`
	Limits struct {
		Limits
		TCPPortRange []int64  `toml:"tcp_port_range"`
		RouteTTL     *seconds `toml:"route_ttl_secs"`
		DrainTimeout *seconds `toml:"drain_timeout_secs"`

		RequestBodyTimeout      *seconds `toml:"request_body_timeout_secs"`
		RequestBodyMinRateGrace *seconds `toml:"request_body_min_rate_grace_secs"`
		ResponseStallTimeout    *seconds `toml:"response_stall_timeout_secs"`

		HelloTimeout      *seconds `toml:"hello_timeout_secs"`
		AuthFailureWindow *seconds `toml:"auth_failure_window_secs"`
		AuthBlock         *seconds `toml:"auth_block_secs"`
	} `toml:"limits"`
	Endpoints     []Endpoint `toml:"endpoints"`
	LoadBalancing struct {
		LoadBalancing
		AlertMinInterval *seconds `toml:"alert_min_interval_secs"`
	} `toml:"load_balancing"`
	Cluster *clusterFile `toml:"cluster"` // nil without a [cluster] table
}

// clusterFile is the [cluster] table as go-toml decodes it.
type clusterFile struct {
	Cluster
	LeaseTTL *seconds `toml:"lease_secs"`
	Timeout  *seconds `toml:"timeout_secs"`
}

const (
	// maxDecodeBytes bounds the text decoded in all passes of the decoder
	// (one more per value of the wrong type), which take time quadratic in
	// the number of keys of a table.
	maxDecodeBytes = 1 << 20
	// maxPathDepth bounds the key paths tracked. The schema is four parts
	// deep (auth.tenants[0].name); deeper keys are unknown anyway.
	maxPathDepth = 8
)

// decodeTOML decodes data over the defaults in f and reports false when
// it could not be decoded in full.
func decodeTOML(r *reporter, data []byte, f *serverFile) bool {
	x := indexTOML(data)
	r.lines = x.lines
	if err := toml.Unmarshal(data, new(map[string]any)); err != nil {
		var de *toml.DecodeError
		if !errors.As(err, &de) {
			r.at(1, "", ErrSyntax, "invalid TOML: %v", err)
			return false
		}
		n, _ := x.node(de)
		r.at(n.line, n.key(), ErrSyntax, "invalid TOML: %s", strings.TrimPrefix(de.Error(), "toml: "))
		return false
	}
	ok := x.decode(r, data, f)
	x.unknownKeys(r)
	return ok
}

// decode runs go-toml's decoder. It stops at a value of the wrong type,
// which is reported; then the top-level key-value holding it is blanked
// out and the text decoded again, so that every problem of the file is
// found.
func (x *tomlIndex) decode(r *reporter, data []byte, f *serverFile) bool {
	defaults, buf := *f, bytes.Clone(data)
	for decoded := 0; decoded < maxDecodeBytes; decoded += len(buf) + 1 {
		*f = defaults
		err := toml.NewDecoder(bytes.NewReader(buf)).Decode(f)
		var de *toml.DecodeError
		if err == nil {
			return true
		} else if !errors.As(err, &de) {
			r.at(1, "", ErrType, "%v", err)
			return false
		}
		n, ok := x.node(de)
		if t, i := tomlSchema(n.path); ok && i < 0 && n.kind != "" {
			r.fail(n.key(), ErrType, "expected %s, got %s", describeType(t, "a table"), n.kind)
		} else { // go-toml gives no position for an array in an array
			line, found := x.lines[n.key()]
			if ok || !found {
				line = n.line
			}
			msg, _, _ := strings.Cut(strings.TrimPrefix(de.Error(), "toml: "), " into struct field")
			r.at(line, n.key(), ErrType, "holds a value of the wrong type (%s)", msg)
			return false
		}
		if n.end == 0 { // a table header: its keys would move to another table
			return false
		}
		r.bad[n.top] = true // its other keys are blanked out too
		for i := n.start; i < n.end; i++ {
			if buf[i] != '\n' {
				buf[i] = ' '
			}
		}
	}
	return false
}

// tomlIndex maps positions in a TOML document to key paths.
type tomlIndex struct {
	newlines []int            // offsets of the '\n' bytes
	lines    map[string]int   // key path -> line it first appears on
	nodes    map[int]tomlNode // offset of a key or value -> what is there
	keys     []int            // offsets of the keys and headers, in order
}

// tomlNode is a key, a table header or a value of the document.
type tomlNode struct {
	path       []string // key parts; "[i]" selects element i of an array
	kind       string   // the type of a value or header, as tomlKinds names it
	line       int
	start, end int    // the top-level key-value holding it (end 0 for a header)
	top        string // the key of that key-value
}

func (n tomlNode) key() string { return formatPath(n.path) }

// tomlKinds names the types of TOML values.
var tomlKinds = map[unstable.Kind]string{
	unstable.String: "a string", unstable.Integer: "an integer", unstable.Float: "a floating-point number",
	unstable.Bool: "a boolean", unstable.Array: "an array", unstable.InlineTable: "a table", unstable.Table: "a table",
	unstable.ArrayTable: "an array of tables", unstable.LocalDate: "a date", unstable.LocalTime: "a time",
	unstable.LocalDateTime: "a date-time", unstable.DateTime: "a date-time",
}

// indexTOML walks the expressions of data with go-toml's parser. It stops
// quietly at a syntax error, which the decoder reports.
func indexTOML(data []byte) *tomlIndex {
	x := &tomlIndex{lines: map[string]int{"": 1}, nodes: map[int]tomlNode{}}
	for i, b := range data {
		if b == '\n' {
			x.newlines = append(x.newlines, i)
		}
	}
	var p unstable.Parser
	p.Reset(data)
	var table []string
	arrays := map[string]int{} // array of tables -> entries so far
	for p.NextExpression() {
		switch e := p.Expression(); e.Kind {
		case unstable.KeyValue:
			x.keyValue(data, table, e, tomlNode{start: int(e.Raw.Offset), end: int(e.Raw.Offset + e.Raw.Length)})
		case unstable.Table, unstable.ArrayTable:
			// A header steps into the latest entry of each array of tables
			// on its path; [[a.b]] starts a new entry of a.b.
			table = table[:0:0]
			off := int(e.Child().Raw.Offset)
			for it := e.Key(); it.Next() && len(table) < maxPathDepth; {
				table = append(table, string(it.Node().Data))
				key := formatPath(table)
				x.record(key, off)
				if n, ok := arrays[key]; e.Kind == unstable.ArrayTable && it.IsLast() {
					x.nodes[off] = tomlNode{path: slices.Clone(table), kind: tomlKinds[e.Kind]}
					arrays[key] = n + 1
					table = append(table, "["+strconv.Itoa(n)+"]")
				} else if ok {
					table = append(table, "["+strconv.Itoa(n-1)+"]")
				}
				x.record(formatPath(table), off)
			}
			if _, ok := x.nodes[off]; !ok {
				x.nodes[off] = tomlNode{path: slices.Clone(table), kind: tomlKinds[e.Kind]}
			}
			x.keys = append(x.keys, off)
		}
	}
	for off, n := range x.nodes {
		n.line = x.line(off)
		x.nodes[off] = n
	}
	return x
}

// keyValue indexes a key-value under the table at base; top locates the
// top-level key-value that holds it.
func (x *tomlIndex) keyValue(data []byte, base []string, kv *unstable.Node, top tomlNode) {
	path := slices.Clone(base)
	first, end := -1, 0
	for it := kv.Key(); it.Next(); {
		k := it.Node()
		if first < 0 {
			first = int(k.Raw.Offset)
		}
		end = int(k.Raw.Offset + k.Raw.Length)
		if len(path) < maxPathDepth {
			path = append(path, string(k.Data))
			x.record(formatPath(path), first)
		}
	}
	if top.top == "" {
		top.top = formatPath(path)
	}
	x.nodes[first] = tomlNode{path: path, start: top.start, end: top.end, top: top.top}
	x.keys = append(x.keys, first)
	if len(path) >= maxPathDepth {
		return
	}
	// An array has no position of its own: it starts after "=" and blanks.
	rest := bytes.TrimLeft(data[end:], " \t")
	rest = bytes.TrimLeft(rest[min(1, len(rest)):], " \t")
	x.value(data, path, kv.Value(), len(data)-len(rest), top)
}

// value indexes the value at off (-1 when unknown) and its elements.
func (x *tomlIndex) value(data []byte, path []string, v *unstable.Node, off int, top tomlNode) {
	if off >= 0 {
		x.nodes[off] = tomlNode{path: path, kind: tomlKinds[v.Kind], start: top.start, end: top.end, top: top.top}
		x.record(formatPath(path), off)
	}
	for i, it := 0, v.Children(); it.Next() && len(path) < maxPathDepth; {
		switch c := it.Node(); {
		case v.Kind == unstable.InlineTable && c.Kind == unstable.KeyValue:
			x.keyValue(data, path, c, top)
		case v.Kind == unstable.Array && c.Kind != unstable.Comment:
			off := -1
			if c.Raw.Length > 0 {
				off = int(c.Raw.Offset)
			}
			x.value(data, append(slices.Clip(path), "["+strconv.Itoa(i)+"]"), c, off, top)
			i++
		}
	}
}

// line returns the line of the byte at off.
func (x *tomlIndex) line(off int) int { return sort.SearchInts(x.newlines, off) + 1 }

// record remembers the first line key appears on.
func (x *tomlIndex) record(key string, off int) {
	if _, ok := x.lines[key]; !ok {
		x.lines[key] = x.line(off)
	}
}

// node returns what is at the position of a go-toml error, or a node made
// of the error's own line and key.
func (x *tomlIndex) node(e *toml.DecodeError) (tomlNode, bool) {
	line, col := e.Position()
	off := col - 1
	if line > 1 && line-2 < len(x.newlines) {
		off += x.newlines[line-2] + 1
	}
	if n, ok := x.nodes[off]; ok {
		return n, true
	}
	return tomlNode{path: e.Key(), line: max(line, 1)}, false
}

// unknownKeys reports the keys of the document that no field of serverFile
// reads, naming the first unknown part of each and the keys valid there.
func (x *tomlIndex) unknownKeys(r *reporter) {
	for _, off := range x.keys {
		n := x.nodes[off]
		// A nil type is a key inside a value of another type, which the
		// decoder reports.
		if t, i := tomlSchema(n.path); i >= 0 && t != nil {
			if key := formatPath(n.path[:i+1]); !r.bad[key] {
				r.at(n.line, key, ErrUnknownKey, "%s", unknownKeyMessage(n.path[i], keysOf(t, "toml")))
				r.bad[key] = true
			}
		}
	}
}

// tomlSchema follows path through the fields of serverFile. It returns the
// type at the end of path, or the type holding the first part that no field
// reads and the index of that part (with a nil type when it is not a table).
func tomlSchema(path []string) (reflect.Type, int) {
	t := reflect.TypeFor[serverFile]()
	for i, part := range path {
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		if strings.HasPrefix(part, "[") && t.Kind() == reflect.Slice {
			t = t.Elem()
			continue
		}
		if t.Kind() != reflect.Struct {
			return nil, i
		}
		f, ok := fieldOf(t, "toml", part)
		if !ok {
			return t, i
		}
		t = f.Type
	}
	return t, -1
}

// formatPath joins key parts into a dotted path.
func formatPath(parts []string) string {
	key := ""
	for _, p := range parts {
		if strings.HasPrefix(p, "[") && strings.HasSuffix(p, "]") {
			key += p
		} else {
			key = joinKey(key, p)
		}
	}
	return key
}
