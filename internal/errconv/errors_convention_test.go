// Package errconv checks the convention of the library's error messages, over the source
// of every package of the module (its root is two directories up).
package errconv

import (
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warren-tunnel/warren/dispatch"
	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/health"
	"github.com/warren-tunnel/warren/tunnel"
	"github.com/warren-tunnel/warren/webhook"
)

// TestErrorMessagesStartWithPackage checks the library's convention for error messages:
// every error a package of the library creates begins with the package's name and ": ",
// so that a message says where it came from.
//
//   - errors.New and fmt.Errorf take a literal text that begins with the prefix: "tunnel: ",
//     "group: ", "health: ", "dispatch: ", "webhook: ", "admin: ", "cluster: ", "config: ",
//     "wire: ", "proxy: ", "mux: ", "throttle: ", "policy: " and so on; "store: " for package
//     store and its implementations boltstore and natsstore. Context wrapped around another
//     error keeps the outer prefix once: fmt.Errorf("tunnel: dial %s: %w", addr, err).
//   - A format may begin with %w only when the error it wraps first is a sentinel of the
//     same package that carries the prefix: fmt.Errorf("%w: envelope version %d",
//     ErrMalformed, v) with ErrMalformed = errors.New("wire: malformed message"). The
//     prefix followed by such a sentinel ("tunnel: %w", ErrProtocol) would double it, and
//     is refused.
//   - The Error method of a package's error type returns a text that begins with the prefix
//     (a literal, a literal + ..., or fmt.Sprintf of a literal format).
//   - Fragments, words meant to follow something else, do not leave their package as errors
//     of their own: a rule that other packages compose into their sentences returns a plain
//     string (group.SubdomainProblem, tunnel.TokenProblem, health.PathProblem), and its
//     error form is a whole sentence (group.ValidateSubdomain: "group: subdomain ...").
//     The checker recognises the errors that are the cause of a prefixed one: the Err of a
//     tunnel.FieldError, the words that follow the field's name, which FieldError.Error
//     prefixes ("tunnel: TCP.Ports: low port 30000 is above high port 20000"); the err of
//     internal/proxy's openError; the cause given to the stores' corruptError, corrupt and
//     opError (fragmentHolders, fragmentCauses). Package-private functions whose errors are
//     all such causes are listed as exceptions, with the function that wraps them.
//   - Text sent to another party is a sentence with no prefix: what an edge puts on the wire
//     (wire.Rejected, wire.Error: tunnel's wireText strips the prefix), the admin API's
//     answers and the edge's answers to public clients (a 408 "request body too slow: ...").
//     The receiving side's error puts its own prefix in front.
//
// The exceptions (errorConventionExceptions lists the sites, by package and function):
//
//  1. tunnel/config: the problems of a file (config.Error, one line of an ErrorList) begin
//     with the file's name and line, as a compiler's do ("server.toml:12:
//     limits.drain_timeout_secs: ..."), so that editors and the users of the example mains
//     jump to them, and keep the quality they have (key path, "did you mean"). The errors
//     of a load that name a file begin with it too (a format "%s: ..." whose first
//     argument is a .File: "server.toml: cluster: tls: reading ca_path: ..."), and so do the
//     errors of a file's tables that begin with their key (ConnectorTLS.Config's
//     "tls.ca_path: ...", (*Cluster).config's "tls: ..."), which DialOptions and Edge put
//     the file's name in front of.
//  2. The registration refusals an edge sends over the wire: tunnel.RejectedError.Message is
//     the edge's sentence verbatim ("subdomain 'pool' is already in use", "group key does
//     not match for subdomain 'pool'"), as the product document requires it shown to the
//     user; its Error is "tunnel: " and that sentence. On the edge, what goes on the wire is
//     the sentence without the "tunnel: " or "group: " prefix of the edge's error. A
//     field is no call the checker can see: TestLibraryErrorsAtRuntime and package tunnel's
//     TestRegistrationRejectionsReachTheConnector check it.
//  3. tunnel.ErrRequired stays "required": it is only ever the first word of a FieldError's
//     Err ("NATSURLs: required: the NATS servers the edges share"), behind the field's name
//     and FieldError's prefix, and tunnel/config shows it behind a file's key.
//  4. Package-private helpers whose every error is a cause that one caller wraps in a
//     prefixed error before it leaves the package: tunnel/config's parsePort ("port " and
//     its words, in a problem of a key), boltstore's page validator (Open gives its findings
//     to corruptError: "store: <path> is corrupt: page 7: referenced twice (move it aside
//     ...)") and natsstore's storeKey (given to (*Store).corrupt).
//
// Messages that the example mains print are not doubled either: no main prints a library's
// prefix in front of a library error (TestExampleMainsDoNotDoubleAPrefix), and real errors,
// among them those that cross the wire, begin with one prefix (TestLibraryErrorsAtRuntime).
func TestErrorMessagesStartWithPackage(t *testing.T) {
	fset := token.NewFileSet()
	pkgs := parseNonTestFiles(t, fset, moduleRoot, "examples")
	if len(pkgs) < 15 {
		t.Fatalf("found %d packages; the walk is broken", len(pkgs))
	}
	used := map[string]bool{}
	var problems []string
	for dir, files := range pkgs {
		problems = append(problems, checkErrorMessages(fset, dir, files, errorConventionExceptions, used)...)
	}
	for key := range errorConventionExceptions {
		if !used[key] {
			problems = append(problems, "exception "+key+" matches nothing: remove it")
		}
	}
	sort.Strings(problems)
	for _, p := range problems {
		t.Error(p)
	}
}

// moduleRoot is the module's root, from this package's directory.
const moduleRoot = "../.."

// parseNonTestFiles parses the non-test .go files under root, by directory (slash-separated,
// relative to the module's root), leaving out testdata, docs, hidden directories and skip.
func parseNonTestFiles(t *testing.T, fset *token.FileSet, root, skip string) map[string][]*ast.File {
	t.Helper()
	pkgs := map[string][]*ast.File{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != root && (name == skip || name == "testdata" || name == "docs" || strings.HasPrefix(name, ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, filepath.Dir(path))
		if err != nil {
			return err
		}
		dir := filepath.ToSlash(rel)
		pkgs[dir] = append(pkgs[dir], f)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return pkgs
}

// TestExampleMainsDoNotDoubleAPrefix checks that no program under examples/ prints or wraps a
// value behind one of the library's prefixes ("tunnel: %v", "config:", err): the library's
// errors carry their own, and "tunnel: tunnel: ..." would follow. A prefix of the program's
// own ("edge: %v", "connector:") is fine.
func TestExampleMainsDoNotDoubleAPrefix(t *testing.T) {
	fset := token.NewFileSet()
	prefixes := map[string]bool{"store": true}
	for _, files := range parseNonTestFiles(t, fset, moduleRoot, "examples") {
		prefixes[files[0].Name.Name] = true
	}
	verb := regexp.MustCompile(`^([a-z]+): ?(%[-+# 0-9.]*[vsw]|$)`)
	var problems []string
	for _, files := range parseNonTestFiles(t, fset, filepath.Join(moduleRoot, "examples"), "") {
		for _, f := range files {
			ast.Inspect(f, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				sel, ok := call.Fun.(*ast.SelectorExpr)
				if !ok || !strings.Contains("Errorf Printf Sprintf Fprintf Println Fprintln Print Fprint Fatal Fatalf", sel.Sel.Name) {
					return true
				}
				for _, a := range call.Args {
					if lit, ok := leadingLiteral(a); ok {
						if m := verb.FindStringSubmatch(lit); m != nil && prefixes[m[1]] {
							problems = append(problems, fmt.Sprintf("%s: %q puts the library's prefix %q in front of a value",
								fset.Position(a.Pos()), lit, m[1]+": "))
						}
					}
				}
				return true
			})
		}
	}
	if len(prefixes) < 15 {
		t.Fatalf("found %d library prefixes; the walk is broken", len(prefixes))
	}
	for _, p := range problems {
		t.Error(p)
	}
}

// errorConventionExceptions are the sites the convention leaves alone, by package
// directory and function, method ("(*T).M") or package-level variable, with the reason.
var errorConventionExceptions = map[string]string{
	"tunnel/config.(*Error).Error": "exception 1: a problem of a file begins with the file and line, as a compiler's: " +
		"\"server.toml:12: limits.drain_timeout_secs: ...\"",
	"tunnel/config.ErrorList.Error": "exception 1: one \"file:line: key: message\" line per problem",
	"tunnel/config.ConnectorTLS.Config": "exception 1: the connector file's tls table, whose errors begin with " +
		"the key, as a problem of the file does (\"tls.ca_path: ...\"); DialOptions puts the file's name in front",
	"tunnel/config.(*Cluster).config": "exception 1: the [cluster] table's TLS files, whose errors begin with " +
		"the key (\"tls: reading ca_path: ...\"); Edge, its caller, puts \"<file>: cluster: \" in front",
	"tunnel/config.parsePort": "exception 4: its words follow \"port\" in the problem of a key (\"server.control_addr: port " +
		"\\\"x\\\" is not a port number (1-65535)\"); it never leaves the package",
	"tunnel/store/boltstore.(*pageValidator).page": "exception 4: the page validator's findings are fragments (\"page 7: referenced " +
		"twice\"): its one caller, Open, gives them to corruptError (\"store: <path> is corrupt: page 7: ...\")",
	"tunnel/store/boltstore.(*pageValidator).nodePage": "as (*pageValidator).page",
	"tunnel/store/natsstore.storeKey": "exception 4: its errors are fragments: its one caller gives them to (*Store).corrupt " +
		"(\"store: NATS bucket b is corrupt: key \"x\" is not a route key: ...\")",
	"tunnel.dialProxied": "exception 4: what went wrong talking to a proxy, a fragment its one caller, " +
		"(*Session).dialEdge, wraps as \"tunnel: proxy http://host:port: ...\"",
	"tunnel.socksConnect": "exception 4: a fragment wrapped by dialEdge through dialProxied",
	"tunnel.httpConnect":  "exception 4: a fragment wrapped by dialEdge through dialProxied",
	"tunnel.connectRefused": "exception 4: the proxy's refusal, a fragment wrapped by dialEdge through " +
		"httpConnect and dialProxied (\"tunnel: proxy ...: refused CONNECT ...\")",
	"tunnel.ErrRequired": "exception 3: the first word of the Err of a FieldError (\"required: the pool's name\"), " +
		"which FieldError.Error prefixes with \"tunnel: <Field>: \"; tunnel/config shows it after the file's key",
}

// checkErrorMessages returns the messages of the package in dir (its non-test files) that
// break the convention of TestErrorMessagesStartWithPackage, as "file:line: what".
// It marks the keys of exceptions it used in used.
func checkErrorMessages(fset *token.FileSet, dir string, files []*ast.File, exceptions map[string]string, used map[string]bool) []string {
	if len(files) == 0 {
		return nil
	}
	pkg := files[0].Name.Name
	prefix := pkg + ": "
	switch pkg {
	case "boltstore", "natsstore":
		prefix = "store: "
	}
	excepted := func(name string) bool {
		key := dir + "." + name
		if _, ok := exceptions[key]; ok {
			used[key] = true
			return true
		}
		return false
	}
	// The package's sentinels: package-level errors.New or fmt.Errorf with a literal that
	// carries the prefix.
	sentinels := map[string]bool{}
	for _, f := range files {
		imports := fileImports(f)
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.VAR {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				if len(vs.Values) != len(vs.Names) {
					continue
				}
				for i, v := range vs.Values {
					call, ok := v.(*ast.CallExpr)
					if !ok || !isErrorCall(call, imports) {
						continue
					}
					if lit, ok := leadingLiteral(call.Args[0]); ok && strings.HasPrefix(lit, prefix) {
						sentinels[vs.Names[i].Name] = true
					}
				}
			}
		}
	}
	var problems []string
	report := func(pos token.Pos, format string, args ...any) {
		p := fset.Position(pos)
		problems = append(problems, p.Filename+":"+strconv.Itoa(p.Line)+": "+fmt.Sprintf(format, args...))
	}
	for _, f := range files {
		imports := fileImports(f)
		fragments := causeFragments(f)
		for _, decl := range f.Decls {
			for _, nd := range namedNodes(decl) {
				if fd, ok := nd.node.(*ast.FuncDecl); ok && isErrorMethod(fd) && !excepted(nd.name) {
					checkErrorMethod(fd, prefix, imports, report)
				}
				name := nd.name
				if excepted(name) {
					continue
				}
				ast.Inspect(nd.node, func(n ast.Node) bool {
					call, ok := n.(*ast.CallExpr)
					if !ok || !isErrorCall(call, imports) || fragments[call] {
						return true
					}
					checkErrorCall(call, pkg, prefix, name, imports, sentinels, report)
					return true
				})
			}
		}
	}
	return problems
}

// checkErrorCall checks one errors.New or fmt.Errorf made in the function (or variable)
// name of package pkg.
func checkErrorCall(call *ast.CallExpr, pkg, prefix, name string, imports map[string]string,
	sentinels map[string]bool, report func(token.Pos, string, ...any)) {
	errorf := isCallTo(call, imports, "fmt", "Errorf")
	lit, ok := leadingLiteral(call.Args[0])
	if !ok {
		report(call.Pos(), "the text of this error is not a literal, so it cannot be checked for %q (in %s)", prefix, name)
		return
	}
	firstArg := func() ast.Expr {
		if errorf && len(call.Args) > 1 {
			return call.Args[1]
		}
		return nil
	}
	ownSentinel := func(e ast.Expr) bool {
		id, ok := e.(*ast.Ident)
		return ok && sentinels[id.Name]
	}
	switch {
	case strings.HasPrefix(lit, prefix+prefix) ||
		(strings.HasPrefix(lit, prefix+"%w") && ownSentinel(firstArg())):
		report(call.Pos(), "%q doubles the prefix %q", lit, prefix)
	case strings.HasPrefix(lit, prefix):
	case strings.HasPrefix(lit, "%w") && ownSentinel(firstArg()):
	case pkg == "config" && strings.HasPrefix(lit, "%s: ") && isFileField(firstArg()):
		// Exception 1: an error about a file begins with the file's name.
	case strings.HasPrefix(lit, "%w"):
		report(call.Pos(), "%q wraps first an error that is not a sentinel of package %s with the prefix %q", lit, pkg, prefix)
	default:
		report(call.Pos(), "%q does not begin with %q", lit, prefix)
	}
}

// checkErrorMethod checks that each return of an Error method begins with prefix.
func checkErrorMethod(fd *ast.FuncDecl, prefix string, imports map[string]string, report func(token.Pos, string, ...any)) {
	ast.Inspect(fd.Body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncLit:
			return false
		case *ast.ReturnStmt:
			if len(n.Results) != 1 {
				return true
			}
			r := n.Results[0]
			if call, ok := r.(*ast.CallExpr); ok && isCallTo(call, imports, "fmt", "Sprintf") {
				r = call.Args[0]
			}
			if lit, ok := leadingLiteral(r); !ok || !strings.HasPrefix(lit, prefix) {
				report(n.Pos(), "%s returns a text that does not begin with %q", declName(fd), prefix)
			}
		}
		return true
	})
}

// fragmentHolders are the error types whose Error method prefixes a field that holds an
// error's words: tunnel.FieldError's Err (what follows the field's name) and
// internal/proxy's openError's err (why the stream to a tunnel could not be opened).
var fragmentHolders = map[string]string{"FieldError": "Err", "openError": "err"}

// fragmentCauses are the functions that make a prefixed error of the cause they are given,
// by the index of that argument: boltstore's corruptError(path, cause) ("store: <path> is
// corrupt: <cause> (move it aside ...)"), natsstore's (*Store).corrupt(cause) and
// (*Store).opError(ctx, op, key, cause) ("store: list NATS bucket b: <cause>").
var fragmentCauses = map[string]int{"corruptError": 1, "corrupt": 0, "opError": 3}

// causeFragments returns the errors.New and fmt.Errorf calls of f that are the fragment
// field of a composite literal of one of the fragmentHolders, or the cause given to one of
// the fragmentCauses.
func causeFragments(f *ast.File) map[*ast.CallExpr]bool {
	out := map[*ast.CallExpr]bool{}
	ast.Inspect(f, func(n ast.Node) bool {
		if call, ok := n.(*ast.CallExpr); ok {
			var fn string
			switch f := call.Fun.(type) {
			case *ast.Ident:
				fn = f.Name
			case *ast.SelectorExpr:
				fn = f.Sel.Name
			}
			if i, ok := fragmentCauses[fn]; ok && i < len(call.Args) {
				if c, ok := call.Args[i].(*ast.CallExpr); ok {
					out[c] = true
				}
			}
			return true
		}
		cl, ok := n.(*ast.CompositeLit)
		if !ok {
			return true
		}
		var typeName string
		switch t := cl.Type.(type) {
		case *ast.Ident:
			typeName = t.Name
		case *ast.SelectorExpr:
			typeName = t.Sel.Name
		}
		field, ok := fragmentHolders[typeName]
		if !ok {
			return true
		}
		for _, e := range cl.Elts {
			if kv, ok := e.(*ast.KeyValueExpr); ok {
				if k, ok := kv.Key.(*ast.Ident); ok && k.Name == field {
					if call, ok := kv.Value.(*ast.CallExpr); ok {
						out[call] = true
					}
				}
			}
		}
		return true
	})
	return out
}

// fileImports maps the names a file refers to its imports by to their paths.
func fileImports(f *ast.File) map[string]string {
	m := map[string]string{}
	for _, is := range f.Imports {
		path, _ := strconv.Unquote(is.Path.Value)
		name := path[strings.LastIndex(path, "/")+1:]
		if is.Name != nil {
			name = is.Name.Name
		}
		m[name] = path
	}
	return m
}

// isCallTo reports whether call is pkgPath.fn(...) with at least one argument.
func isCallTo(call *ast.CallExpr, imports map[string]string, pkgPath, fn string) bool {
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok || sel.Sel.Name != fn || len(call.Args) == 0 {
		return false
	}
	id, ok := sel.X.(*ast.Ident)
	return ok && imports[id.Name] == pkgPath
}

func isErrorCall(call *ast.CallExpr, imports map[string]string) bool {
	return isCallTo(call, imports, "errors", "New") || isCallTo(call, imports, "fmt", "Errorf")
}

// leadingLiteral returns the string literal an expression begins with: the literal itself,
// or the leftmost operand of a concatenation.
func leadingLiteral(e ast.Expr) (string, bool) {
	switch e := e.(type) {
	case *ast.ParenExpr:
		return leadingLiteral(e.X)
	case *ast.BinaryExpr:
		if e.Op == token.ADD {
			return leadingLiteral(e.X)
		}
	case *ast.BasicLit:
		if e.Kind == token.STRING {
			s, err := strconv.Unquote(e.Value)
			return s, err == nil
		}
	}
	return "", false
}

// isFileField reports whether e is x.File.
func isFileField(e ast.Expr) bool {
	sel, ok := e.(*ast.SelectorExpr)
	return ok && sel.Sel.Name == "File"
}

// isErrorMethod reports whether fd is a method Error() string.
func isErrorMethod(fd *ast.FuncDecl) bool {
	return fd.Recv != nil && fd.Name.Name == "Error" && fd.Body != nil && len(fd.Type.Params.List) == 0 &&
		fd.Type.Results != nil && len(fd.Type.Results.List) == 1 && isIdent(fd.Type.Results.List[0].Type, "string")
}

func isIdent(e ast.Expr, name string) bool {
	id, ok := e.(*ast.Ident)
	return ok && id.Name == name
}

type namedNode struct {
	name string
	node ast.Node
}

// namedNodes splits a declaration into the parts the exceptions name: a function "F", a
// method "(*T).M" or "T.M", each spec of a var, const or type declaration by its first name.
func namedNodes(decl ast.Decl) []namedNode {
	switch d := decl.(type) {
	case *ast.FuncDecl:
		return []namedNode{{declName(d), d}}
	case *ast.GenDecl:
		var out []namedNode
		for _, s := range d.Specs {
			switch s := s.(type) {
			case *ast.ValueSpec:
				out = append(out, namedNode{s.Names[0].Name, s})
			case *ast.TypeSpec:
				out = append(out, namedNode{s.Name.Name, s})
			}
		}
		return out
	}
	return nil
}

// declName names a function "F" or a method "(*T).M" or "T.M".
func declName(d *ast.FuncDecl) string {
	if d.Recv == nil || len(d.Recv.List) == 0 {
		return d.Name.Name
	}
	t := d.Recv.List[0].Type
	if g, ok := t.(*ast.IndexExpr); ok {
		t = g.X
	}
	switch t := t.(type) {
	case *ast.StarExpr:
		if id, ok := t.X.(*ast.Ident); ok {
			return "(*" + id.Name + ")." + d.Name.Name
		}
	case *ast.Ident:
		return t.Name + "." + d.Name.Name
	}
	return d.Name.Name
}

// TestErrorConventionCheckerFlags shows that checkErrorMessages fails what it should, and
// only that, on small packages.
func TestErrorConventionCheckerFlags(t *testing.T) {
	exceptions := map[string]string{"tunnel.excused": "a reason"}
	for _, tc := range []struct {
		name, dir, src string
		want           string // a part of a problem expected; "" for none
	}{
		{"prefixed", "tunnel", `var e = errors.New("tunnel: closed")`, ""},
		{"unprefixed", "tunnel", `var e = errors.New("closed")`, `"closed" does not begin with "tunnel: "`},
		{"another package's prefix", "tunnel", `var e = errors.New("group: closed")`, `does not begin with "tunnel: "`},
		{"prefix and wrapped error", "tunnel", `func f(err error) error { return fmt.Errorf("tunnel: dial: %w", err) }`, ""},
		{"own sentinel first", "wire",
			`var ErrMalformed = errors.New("wire: malformed message")
			func f(v int) error { return fmt.Errorf("%w: envelope version %d", ErrMalformed, v) }`, ""},
		{"another package's sentinel first", "tunnel",
			`func f() error { return fmt.Errorf("%w: bad label", group.ErrInvalid) }`, "wraps first an error that is not a sentinel"},
		{"an error first", "tunnel",
			`func f(err error) error { return fmt.Errorf("%w: bad label", err) }`, "wraps first an error that is not a sentinel"},
		{"own sentinel without the prefix first", "tunnel",
			`var ErrLimit = errors.New("limit reached")
			func f() error { return fmt.Errorf("%w: 3 tunnels", ErrLimit) }`, "wraps first an error that is not a sentinel"},
		{"prefix and own sentinel", "tunnel",
			`var ErrProtocol = errors.New("tunnel: protocol error")
			func f() error { return fmt.Errorf("tunnel: %w: unexpected answer", ErrProtocol) }`, "doubles the prefix"},
		{"prefix twice", "tunnel", `var e = errors.New("tunnel: tunnel: closed")`, "doubles the prefix"},
		{"not a literal", "tunnel", `func f(s string) error { return errors.New(s) }`, "is not a literal"},
		{"not a literal, excepted", "tunnel", `func excused(s string) error { return errors.New(s) }`, ""},
		{"a concatenation", "group", `func f(p string) error { return errors.New("group: subdomain " + p) }`, ""},
		{"an unprefixed concatenation", "group", `func f(p string) error { return errors.New(p + " is bad") }`, "is not a literal"},
		{"Error method", "proxy", `type e struct{ m string }
			func (x *e) Error() string { return "proxy: " + x.m }`, ""},
		{"Error method with Sprintf", "proxy", `type e struct{ m string }
			func (x e) Error() string { return fmt.Sprintf("proxy: %s", x.m) }`, ""},
		{"unprefixed Error method", "proxy", `type e struct{ m string }
			func (x *e) Error() string { return x.m }`, `(*e).Error returns a text that does not begin with "proxy: "`},
		{"FieldError's words", "tunnel",
			`func f() error { return &FieldError{Field: "Weight", Err: fmt.Errorf("must be at most %d", 100)} }`, ""},
		{"a store", "tunnel/store/boltstore", `var e = errors.New("store: closed")`, ""},
		{"a store's cause", "tunnel/store/boltstore",
			`func f(p string) error { return corruptError(p, errors.New("truncated")) }`, ""},
		{"a file's name first in config", "tunnel/config",
			`func f(c *Connector, err error) error { return fmt.Errorf("%s: %w", c.File, err) }`, ""},
		{"a file's name first elsewhere", "tunnel",
			`func f(c *Connector, err error) error { return fmt.Errorf("%s: %w", c.File, err) }`, `does not begin with "tunnel: "`},
		{"a renamed import", "tunnel", "import f \"fmt\"\nvar e = f.Errorf(\"closed\")", `does not begin with "tunnel: "`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pkg := tc.dir[strings.LastIndex(tc.dir, "/")+1:]
			src := "package " + pkg + "\n"
			if !strings.HasPrefix(tc.src, "import") {
				src += "import (\n\t\"errors\"\n\t\"fmt\"\n)\nvar _, _ = errors.New, fmt.Errorf\n"
			}
			src += tc.src + "\n"
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, "x.go", src, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			problems := checkErrorMessages(fset, tc.dir, []*ast.File{f}, exceptions, map[string]bool{})
			switch {
			case tc.want == "" && len(problems) > 0:
				t.Errorf("want no problem, got %q", problems)
			case tc.want != "" && !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, tc.want) }):
				t.Errorf("want a problem with %q, got %q", tc.want, problems)
			}
		})
	}
}

// TestLibraryErrorsAtRuntime checks real errors of the library, among them the ones that
// cross the wire from an edge to a connector: each line begins with its package's prefix, a
// prefix is never doubled, and a refusal keeps the edge's sentence verbatim.
func TestLibraryErrorsAtRuntime(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	auth, err := tunnel.NewStaticTokens([]string{"a-token-of-sixteen-chars"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	edge, err := tunnel.NewServer(tunnel.ServerConfig{Domain: "example.test", Auth: auth})
	if err != nil {
		t.Fatal(err)
	}
	defer edge.Close()
	_, badToken := tunnel.Dial(ctx, "in-memory", tunnel.WithDialer(edge.DialContext),
		tunnel.WithToken("a-wrong-token-of-sixteen"), tunnel.WithReconnect(false))
	sess, err := tunnel.Dial(ctx, "in-memory", tunnel.WithDialer(edge.DialContext), tunnel.WithToken("a-token-of-sixteen-chars"))
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	if _, err := sess.Listen(ctx, tunnel.TunnelSpec{Subdomain: "pool"}); err != nil {
		t.Fatal(err)
	}
	_, inUse := sess.Listen(ctx, tunnel.TunnelSpec{Subdomain: "pool"})
	_, badConfig := tunnel.NewServer(tunnel.ServerConfig{TCP: tunnel.TCPTunnels{Ports: group.PortRange{Lo: 30000, Hi: 20000}},
		LoadBalancing: tunnel.LoadBalancing{Strategy: "fastest"}})
	_, badSpec := sess.Listen(ctx, tunnel.TunnelSpec{Subdomain: "pool", Affinity: "nonsense"})
	_, badStrategy := dispatch.New("fastest")

	for _, tc := range []struct {
		prefix string
		err    error
		holds  string
	}{
		{"tunnel: ", badToken, "invalid auth token"},
		{"tunnel: ", inUse, "subdomain 'pool' is already in use"},
		{"tunnel: ", badConfig, "TCP.Ports: low port 30000 is above high port 20000"},
		{"tunnel: ", badSpec, `affinity "nonsense"`},
		{"tunnel: ", tunnel.ValidateToken("short"), "token is 5 characters long"},
		{"group: ", group.ValidateSubdomain("Web"), `subdomain "Web" must be lowercase`},
		{"health: ", health.Spec{Type: health.TypeHTTP, Path: "healthz"}.Validate(), `Path "healthz" must start with "/"`},
		{"health: ", health.ValidatePath("healthz"), `path "healthz" must start with "/"`},
		{"webhook: ", webhook.ValidateURL("ftp://x"), "scheme must be http or https"},
		{"dispatch: ", badStrategy, `unknown strategy "fastest"`},
	} {
		if tc.err == nil {
			t.Errorf("no error where one holding %q was expected", tc.holds)
			continue
		}
		msg := tc.err.Error()
		t.Log(msg)
		if !strings.Contains(msg, tc.holds) {
			t.Errorf("%q does not hold %q", msg, tc.holds)
		}
		for _, line := range strings.Split(msg, "\n") {
			if !strings.HasPrefix(line, tc.prefix) {
				t.Errorf("%q does not begin with %q", line, tc.prefix)
			}
		}
		for p := range strings.SplitSeq("tunnel group health webhook dispatch config cluster admin store wire proxy mux throttle", " ") {
			if strings.Contains(msg, p+": "+p+": ") {
				t.Errorf("%q doubles the prefix %q", msg, p+": ")
			}
		}
	}
	var rej *tunnel.RejectedError
	if !errors.As(inUse, &rej) || rej.Message != "subdomain 'pool' is already in use" {
		t.Errorf("the refusal's Message is not the edge's sentence verbatim: %#v", rej)
	}
}
