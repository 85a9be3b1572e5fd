package doctest

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"
)

// defaultPageTimeout bounds a page's ```sh blocks unless the page says <!-- timeout: D -->.
const defaultPageTimeout = 4 * time.Minute

// block is one fenced code block of a page.
type block struct {
	page string
	line int // the opening fence's line, 1-based
	lang string
	body []string // the lines between the fences, the fence's indentation removed

	notRun   bool
	reason   string // why, for a block under <!-- not run: REASON -->
	fragment bool   // under <!-- go: fragment -->
	expect   *block // the ```text block right after a ```sh block
}

// where is "page:line", the block's opening fence.
func (b *block) where() string { return fmt.Sprintf("%s:%d", b.page, b.line) }

// isGo and isSh tell the blocks the harness runs: ```go, and ```sh or ```bash.
func (b *block) isGo() bool { return b.lang == "go" }
func (b *block) isSh() bool { return b.lang == "sh" || b.lang == "bash" }

// page is a Markdown page and its code blocks.
type page struct {
	path    string
	blocks  []*block
	timeout time.Duration
	needs   []string    // commands named by <!-- needs: ... -->, in order, once each
	errs    []pageError // convention violations
}

// A pageError is a page breaking a convention. kind says which test reports it: "go" the
// ```go blocks', "sh" the ```sh blocks', "page" the others (reported with the ```go blocks,
// whose test also runs under -short).
type pageError struct {
	kind string
	msg  string // "page:line: message"
}

// errors are the messages of the page's errors of the kinds given.
func (p *page) errors(kinds ...string) []string {
	var out []string
	for _, e := range p.errs {
		for _, k := range kinds {
			if e.kind == k {
				out = append(out, e.msg)
			}
		}
	}
	return out
}

func (p *page) shBlocks() []*block {
	var out []*block
	for _, b := range p.blocks {
		if b.isSh() {
			out = append(out, b)
		}
	}
	return out
}

var (
	fenceRE   = regexp.MustCompile("^( *)(```+|~~~+)[ \t]*([^`]*)$")
	commentRE = regexp.MustCompile(`^\s*<!--(.*)-->\s*$`)
	// nearDirectiveRE catches misspelt directives, which would otherwise be plain comments
	// and silently not apply.
	nearDirectiveRE = regexp.MustCompile(`(?i)^\s*(not[-_ ]*run|no[-_ ]*run|skip\b|fragment|go\s*:|needs?\s*:|timeout)`)
	// misnamedLangs are info strings that look like a language the harness runs but are not
	// the spelling it runs, so a block would silently not run.
	misnamedLangs = map[string]string{"golang": "go", "shell": "sh", "zsh": "sh"}
)

// parsePageFile reads and parses the page at path, naming it name in messages.
func parsePageFile(path, name string) (*page, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return parsePage(name, string(data)), nil
}

// parsePage splits a Markdown page into its fenced code blocks and applies the directives
// (HTML comments) above them; see the package comment for the conventions.
func parsePage(name, text string) *page {
	p := &page{path: name, timeout: defaultPageTimeout}
	lines := strings.Split(strings.ReplaceAll(text, "\r\n", "\n"), "\n")
	errf := func(kind string, line int, format string, args ...any) {
		p.errs = append(p.errs, pageError{kind, fmt.Sprintf("%s:%d: ", name, line) + fmt.Sprintf(format, args...)})
	}
	kindOf := func(b *block) string {
		switch {
		case b.isGo():
			return "go"
		case b.isSh():
			return "sh"
		}
		return "page"
	}
	type pending struct {
		line     int
		notRun   bool
		reason   string
		fragment bool
	}
	var (
		pend       *pending // block directives waiting for their block
		lastSh     *block   // a ```sh block that a ```text block may still follow
		timeoutSet int      // the line of the timeout directive, 0 if none
	)
	addNeed := func(cmd string) {
		for _, n := range p.needs {
			if n == cmd {
				return
			}
		}
		p.needs = append(p.needs, cmd)
	}
	for i := 0; i < len(lines); i++ {
		ln := i + 1
		line := lines[i]
		if m := fenceRE.FindStringSubmatch(line); m != nil {
			indent, fence := len(m[1]), m[2]
			info := strings.Fields(m[3])
			b := &block{page: name, line: ln}
			if len(info) > 0 {
				b.lang = strings.ToLower(info[0])
			}
			closed := false
			for i++; i < len(lines); i++ {
				l := lines[i]
				if t := strings.TrimSpace(l); len(t) >= len(fence) && strings.Trim(t, fence[:1]) == "" {
					closed = true
					break
				}
				// Remove up to the opening fence's indentation, as CommonMark does.
				n := 0
				for n < indent && n < len(l) && l[n] == ' ' {
					n++
				}
				b.body = append(b.body, l[n:])
			}
			if !closed {
				errf("page", ln, "the code block is not closed")
			}
			if pend != nil {
				b.notRun, b.reason, b.fragment = pend.notRun, pend.reason, pend.fragment
				if pend.fragment && !b.isGo() {
					errf("page", pend.line, "<!-- go: fragment --> is above a ```%s block, not a ```go block", b.lang)
				}
				if pend.notRun && pend.reason == "" {
					errf(kindOf(b), pend.line, "<!-- not run --> needs a reason: <!-- not run: REASON -->")
				}
				pend = nil
			}
			if want, ok := misnamedLangs[b.lang]; ok {
				errf("page", ln, "```%s: the harness runs ```%s blocks; write ```%s (or mark the block <!-- not run: REASON -->)", b.lang, want, want)
			}
			if b.isSh() && !b.notRun {
				if last := strings.TrimRight(firstLine(slices.Backward(b.body)), " \t"); strings.HasSuffix(last, "\\") {
					errf("sh", ln, "the ```%s block ends with a line continuation (\\): its last command would run on into the next block", b.lang)
				}
				for j, l := range b.body {
					if t := strings.TrimLeft(l, " \t"); strings.HasPrefix(t, "$ ") || t == "$" {
						errf("sh", ln+1+j, "a ```%s line starts with a prompt (\"$ \"): ```sh blocks hold the commands as a user pastes them; show a transcript in a ```console block", b.lang)
						break
					}
				}
			}
			if b.lang == "text" && lastSh != nil {
				lastSh.expect = b
			}
			lastSh = nil
			if b.isSh() {
				lastSh = b
			}
			p.blocks = append(p.blocks, b)
			continue
		}
		if strings.TrimSpace(line) == "" {
			continue
		}
		lastSh = nil
		m := commentRE.FindStringSubmatch(line)
		if m == nil {
			if pend != nil {
				errf("page", pend.line, "the directive is not directly above a code block (only blank lines and other directives may come between)")
				pend = nil
			}
			continue
		}
		inner := strings.TrimSpace(m[1])
		key, val, hasColon := strings.Cut(inner, ":")
		key, val = strings.TrimSpace(key), strings.TrimSpace(val)
		switch {
		case key == "not run":
			if pend == nil {
				pend = &pending{line: ln}
			}
			pend.notRun = true
			pend.reason = val
		case key == "go" && hasColon && val == "fragment":
			if pend == nil {
				pend = &pending{line: ln}
			}
			pend.fragment = true
		case key == "needs" && hasColon:
			if val == "" {
				errf("sh", ln, "<!-- needs: --> names no command: <!-- needs: python3 curl jq -->")
			}
			for _, c := range strings.Fields(val) {
				addNeed(c)
			}
		case key == "timeout" && hasColon:
			d, err := time.ParseDuration(val)
			switch {
			case err != nil || d <= 0:
				errf("sh", ln, "<!-- timeout: %s -->: not a positive Go duration such as 8m or 90s", val)
			case timeoutSet != 0:
				errf("sh", ln, "a second <!-- timeout --> (the first is on line %d)", timeoutSet)
			default:
				p.timeout, timeoutSet = d, ln
			}
		case nearDirectiveRE.MatchString(inner):
			errf("page", ln, "%s: not a docs directive; the directives are <!-- not run: REASON -->, <!-- go: fragment -->, <!-- needs: CMD... --> and <!-- timeout: DURATION -->", strings.TrimSpace(line))
		default:
			// An ordinary comment: it separates a directive from its block like text does.
			if pend != nil {
				errf("page", pend.line, "the directive is not directly above a code block (only blank lines and other directives may come between)")
				pend = nil
			}
		}
	}
	if pend != nil {
		errf("page", pend.line, "the directive is not directly above a code block")
	}
	return p
}

// expectLines are the non-empty lines of a ```text block, trimmed, without the lines that
// are only "...".
func expectLines(b *block) []string {
	var out []string
	for _, l := range b.body {
		l = strings.TrimSpace(l)
		if l == "" || l == "..." {
			continue
		}
		out = append(out, l)
	}
	return out
}

// lineMatcher compiles an expected line: a substring of an output line, "..." matching any
// text.
func lineMatcher(want string) *regexp.Regexp {
	parts := strings.Split(want, "...")
	for i, s := range parts {
		parts[i] = regexp.QuoteMeta(s)
	}
	return regexp.MustCompile(strings.Join(parts, ".*"))
}

// matchOutput checks that every expected line appears in output, in order, each in an
// output line of its own after the previous one's. It returns the index of the first
// expected line not found (-1 if all were) and, for each found one, the index of its
// output line.
func matchOutput(want, output []string) (missing int, at []int) {
	j := 0
	for i, w := range want {
		re := lineMatcher(w)
		for ; j < len(output); j++ {
			if re.MatchString(output[j]) {
				break
			}
		}
		if j == len(output) {
			return i, at
		}
		at = append(at, j)
		j++
	}
	return -1, at
}
