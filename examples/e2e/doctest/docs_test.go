// Package doctest runs the code blocks of the documentation, README.md and docs/*.md, so
// that the pages cannot drift from the code: TestDocsGoBlocksCompile compiles every ```go
// block and TestDocsShellWalkthroughs runs every ```sh block and checks its output. The
// conventions a page is written to (docs/contributing-docs.md says the same for writers):
//
// Pages. The tests run the pages listed in testdata/pages.txt: one path a line, relative to
// the repository's root, globs allowed (docs/*.md), # comments. With no page listed both
// tests skip. WARREN_DOCS_PAGES="README.md docs/x.md" runs the pages it names instead.
//
// Blocks. A fenced block's language is the first word of its info string. ```go blocks are
// compiled, ```sh and ```bash blocks run; blocks in any other language (toml, yaml, ini,
// text, json, console: a transcript, ...) or none do not run. ```golang, ```shell and ```zsh
// are errors (write ```go or ```sh). Directives are one-line HTML comments directly above a
// block (blank lines and other directives may come between):
//
//   - <!-- not run: REASON --> skips the block (the test logs it with its reason, and lists
//     every skipped block); a <!-- not run --> without a reason fails.
//   - <!-- go: fragment --> is not allowed: it fails, saying fragments must be complete
//     files.
//   - <!-- needs: python3 curl jq --> (anywhere in the page, by convention above the first
//     block that needs them): before the page runs, each command must be on PATH, else the
//     page fails with "install X" (with WARREN_DOCS_ALLOW_MISSING=1 it is skipped instead).
//   - <!-- timeout: 8m --> (anywhere in the page, once) bounds the page's ```sh blocks
//     instead of the default 4 minutes.
//
// A misspelt directive (<!-- not-run: ... -->, <!-- skip -->, ...) or one that is not
// above a block fails.
//
// ```go blocks are complete Go files, with their package clause and imports. Each compiles
// in a temporary module of its own that requires github.com/warren-tunnel/warren, replaced
// by the checkout under test (its go.sum copied, GOFLAGS=-mod=mod, so other modules it
// imports are fetched): a package main block with go build, a block declaring a func
// Test..., Example... or Benchmark... as x_test.go with go test -c -o /dev/null, any other
// package with go build. Two compile at a time. A subtest per block:
// TestDocsGoBlocksCompile/<page>/L<line of the opening fence>.
//
// ```sh blocks are commands a user pastes into a terminal, without prompts. All the ```sh
// blocks of a page run in order in one bash process (set -eo pipefail first, so a failing
// command fails the page), as in one terminal: a cd, a variable or a process started with &
// carries over to the next block. Each block must parse on its own (bash -n) and not end
// in a line continuation. The process runs with
//   - its working directory a fresh copy of the checkout (the files of git ls-files -co
//     --exclude-standard: tracked and untracked-but-not-ignored files as they are on disk,
//     made a git repository of one commit), as a fresh clone would be;
//   - HOME a new empty directory, XDG_RUNTIME_DIR another, and GOBIN a third one first on
//     PATH (so `go install ./examples/edge ./examples/connector` puts edge and connector on
//     PATH); GOCACHE, GOMODCACHE, GOPATH, GOPROXY, GOFLAGS and the rest of the go
//     command's settings are the real environment's (`go env`), so nothing is downloaded
//     again; WARREN_DOCS=0, so that a page running the tests does not run the pages again;
//     standard input /dev/null;
//   - a process group of its own: when the page ends, fails or times out, the group gets
//     SIGTERM, then SIGKILL after 5 s, and the harness waits until none of it is left, so
//     processes started with & end with the page.
//
// A page has 4 minutes unless it says <!-- timeout: D -->; a timeout reports the block
// that was running and its output so far. Pages run one after another, one subtest each
// (TestDocsShellWalkthroughs/<page>), as they listen on fixed loopback ports: before a
// page runs, each port it mentions must be free (any of 3000 3001 4040 4041 4042 5432 8080
// 8081 8082 8443 9090 9091 9092 appearing in the page as a word, and any port from 1024 up
// written :NNNN, 127.0.0.1:NNNN, localhost:NNNN, port = NNNN or port: NNNN), else the
// page fails naming the port and its process (from ss -ltnp).
//
// Output checks. A ```text block right after a ```sh block (only blank lines between) is
// the output that block must print: stdout and stderr together, including what the
// page's background processes print meanwhile (the shell's stdout and stderr are one pipe,
// as a terminal is one, and the generated script prints a marker line between blocks, so
// the harness knows which block printed what). Every non-empty line of the ```text block,
// its leading and trailing spaces trimmed, must appear in that output, in order, each a
// substring of an output line after the previous one's line; "..." inside a line matches
// any text, and a line that is only "..." matches nothing in particular (it is there for
// the reader).
//
// A failure names the page, the line of the block's opening fence and of the failing
// command, shows the block and the last 40 lines of its output and, for an output check,
// the expected lines with the first one missing marked.
//
// TestDocsShellWalkthroughs is skipped with -short and with WARREN_DOCS=0 (which also
// skips TestDocsGoBlocksCompile); otherwise both run in .ci/test like every other test.
// Run one page with
//
//	go -C examples/e2e test -count=1 -v -run 'TestDocsShellWalkthroughs/README.md' ./doctest
package doctest

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// pagesFile lists the pages the tests run.
const pagesFile = "testdata/pages.txt"

// selectedPages parses the pages to run: those WARREN_DOCS_PAGES names, else those
// pagesFile lists. It skips the test when there are none.
func selectedPages(t *testing.T) (root string, pages []*page) {
	t.Helper()
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	var patterns []string
	source := "WARREN_DOCS_PAGES"
	if env := os.Getenv("WARREN_DOCS_PAGES"); env != "" {
		patterns = strings.FieldsFunc(env, func(r rune) bool { return r == ',' || r == ' ' || r == '\n' })
	} else {
		source = "examples/e2e/doctest/" + pagesFile
		f, err := os.Open(pagesFile)
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		if f != nil {
			sc := bufio.NewScanner(f)
			for sc.Scan() {
				l, _, _ := strings.Cut(sc.Text(), "#")
				if l = strings.TrimSpace(l); l != "" {
					patterns = append(patterns, l)
				}
			}
			f.Close()
			if err := sc.Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if len(patterns) == 0 {
		t.Skipf("no documentation pages listed in %s: list README.md and docs/*.md there to run their code blocks", source)
	}
	seen := map[string]bool{}
	for _, pat := range patterns {
		matches, err := filepath.Glob(filepath.Join(root, pat))
		if err != nil {
			t.Fatalf("%s: %q: %v", source, pat, err)
		}
		if len(matches) == 0 {
			t.Errorf("%s: %q names no file of the checkout", source, pat)
		}
		for _, m := range matches {
			rel, err := filepath.Rel(root, m)
			if err != nil {
				t.Fatal(err)
			}
			if seen[rel] {
				continue
			}
			seen[rel] = true
			p, err := parsePageFile(m, filepath.ToSlash(rel))
			if err != nil {
				t.Fatal(err)
			}
			pages = append(pages, p)
		}
	}
	return root, pages
}

// logNotRun logs the page's blocks of the given kind under <!-- not run: REASON --> and
// returns their descriptions.
func logNotRun(t *testing.T, p *page, runs func(*block) bool) []string {
	t.Helper()
	var out []string
	for _, b := range p.blocks {
		if runs(b) && b.notRun {
			s := fmt.Sprintf("%s (```%s) not run: %s", b.where(), b.lang, b.reason)
			t.Log(s)
			out = append(out, s)
		}
	}
	return out
}

func logSkippedSummary(t *testing.T, skipped []string) {
	t.Helper()
	if len(skipped) == 0 {
		t.Log("no block skipped")
		return
	}
	t.Logf("%d blocks skipped:\n  %s", len(skipped), strings.Join(skipped, "\n  "))
}

func TestDocsGoBlocksCompile(t *testing.T) {
	if os.Getenv("WARREN_DOCS") == "0" {
		t.Skip("WARREN_DOCS=0")
	}
	root, pages := selectedPages(t)
	sem := make(chan struct{}, 2) // two compiles at a time
	var skipped []string
	for _, p := range pages {
		skipped = append(skipped, logNotRun(t, p, (*block).isGo)...)
		t.Run(p.path, func(t *testing.T) {
			t.Parallel()
			for _, e := range p.errors("go", "page") {
				t.Error(e)
			}
			for _, b := range p.blocks {
				if !b.isGo() || b.notRun {
					continue
				}
				t.Run(fmt.Sprintf("L%d", b.line), func(t *testing.T) {
					t.Parallel()
					sem <- struct{}{}
					defer func() { <-sem }()
					start := time.Now()
					cmd, err := compileGoBlock(t.Context(), root, b)
					if err != nil {
						t.Error(err)
						return
					}
					t.Logf("%s: %s in %v", b.where(), cmd, time.Since(start).Round(time.Millisecond))
				})
			}
		})
	}
	logSkippedSummary(t, skipped)
}

func TestDocsShellWalkthroughs(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	if os.Getenv("WARREN_DOCS") == "0" {
		t.Skip("WARREN_DOCS=0")
	}
	root, pages := selectedPages(t)
	deadline, _ := t.Deadline()
	var skipped []string
	for _, p := range pages {
		if len(p.shBlocks()) == 0 {
			continue
		}
		t.Run(p.path, func(t *testing.T) {
			skipped = append(skipped, logNotRun(t, p, (*block).isSh)...)
			if errs := p.errors("sh"); len(errs) > 0 {
				t.Fatal(strings.Join(errs, "\n"))
			}
			if !slices.ContainsFunc(p.shBlocks(), func(b *block) bool { return !b.notRun }) {
				t.Skip("every ```sh block of the page is marked not run")
			}
			checkNeeds(t, p)
			if busy := busyPorts(mentionedPorts(readPage(t, root, p))); len(busy) > 0 {
				t.Fatalf("%s: the page needs ports that are taken:\n  %s", p.path, strings.Join(busy, "\n  "))
			}
			fails := runShellPage(context.Background(), p, shellOptions{root: root, logf: t.Logf, deadline: deadline})
			for _, f := range fails {
				t.Error(f)
			}
		})
	}
	logSkippedSummary(t, skipped)
}

func readPage(t *testing.T, root string, p *page) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, p.path))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// checkNeeds fails (or, with WARREN_DOCS_ALLOW_MISSING=1, skips) the page when a command
// its <!-- needs: --> names is not on PATH.
func checkNeeds(t *testing.T, p *page) {
	t.Helper()
	msg := missingNeeds(p)
	if msg == "" {
		return
	}
	if os.Getenv("WARREN_DOCS_ALLOW_MISSING") == "1" {
		t.Skip(msg + " (skipped: WARREN_DOCS_ALLOW_MISSING=1)")
	}
	t.Fatal(msg + " (or set WARREN_DOCS_ALLOW_MISSING=1 to skip the page)")
}

// missingNeeds says which commands of the page's <!-- needs: --> are not on PATH; "" if
// none.
func missingNeeds(p *page) string {
	var missing []string
	for _, c := range p.needs {
		if _, err := exec.LookPath(c); err != nil {
			missing = append(missing, c)
		}
	}
	if len(missing) == 0 {
		return ""
	}
	return fmt.Sprintf("%s needs %s, not found on PATH: install %s", p.path, strings.Join(missing, ", "), strings.Join(missing, " "))
}
