package doctest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The harness's own tests: its parser and matcher on strings (fast), then the runners on the
// synthetic pages under testdata.

const parsePageText = "# Title\n" + // 1
	"\n" + // 2
	"<!-- timeout: 8m -->\n" + // 3
	"<!-- needs: python3 curl -->\n" + // 4
	"```sh\n" + // 5
	"echo hi\n" + // 6
	"```\n" + // 7
	"\n" + // 8
	"```text\n" + // 9
	"hi\n" + // 10
	"```\n" + // 11
	"\n" + // 12
	"<!-- not run: needs a second host -->\n" + // 13
	"\n" + // 14
	"```bash title=\"x\"\n" + // 15
	"ssh elsewhere\n" + // 16
	"```\n" + // 17
	"Some text breaks the pairing.\n" + // 18
	"```text\n" + // 19
	"not an expectation\n" + // 20
	"```\n" + // 21
	"\n" + // 22
	"1. A list item:\n" + // 23
	"\n" + // 24
	"   ```go\n" + // 25
	"   package main\n" + // 26
	"\n" + // 27
	"   func main() {}\n" + // 28
	"   ```\n" + // 29
	"\n" + // 30
	"````markdown\n" + // 31
	"<!-- not run -->\n" + // 32
	"```sh\n" + // 33
	"inside\n" + // 34
	"```\n" + // 35
	"````\n" + // 36
	"<!-- needs: jq curl -->\n" + // 37
	"```toml\n" + // 38
	"a = 1\n" + // 39
	"```\n" // 40

func TestParsePageBlocks(t *testing.T) {
	p := parsePage("x.md", parsePageText)
	require.Empty(t, p.errs)
	assert.Equal(t, 8*time.Minute, p.timeout)
	assert.Equal(t, []string{"python3", "curl", "jq"}, p.needs)
	type got struct {
		line   int
		lang   string
		body   string
		notRun string
		expect int
	}
	var gs []got
	for _, b := range p.blocks {
		g := got{line: b.line, lang: b.lang, body: strings.Join(b.body, "|"), notRun: b.reason}
		if b.expect != nil {
			g.expect = b.expect.line
		}
		gs = append(gs, g)
	}
	assert.Equal(t, []got{
		{5, "sh", "echo hi", "", 9},
		{9, "text", "hi", "", 0},
		{15, "bash", "ssh elsewhere", "needs a second host", 0},
		{19, "text", "not an expectation", "", 0},
		{25, "go", "package main||func main() {}", "", 0},
		{31, "markdown", "<!-- not run -->|```sh|inside|```", "", 0},
		{38, "toml", "a = 1", "", 0},
	}, gs)
	assert.True(t, p.blocks[2].notRun)
	assert.Len(t, p.shBlocks(), 2)
	assert.Equal(t, "x.md:15", p.blocks[2].where())
}

func TestParsePageErrors(t *testing.T) {
	for _, tc := range []struct {
		name, text string
		kind, want string
	}{
		{"not run without a reason", "<!-- not run -->\n```sh\nx\n```\n", "sh", "x.md:1: <!-- not run --> needs a reason"},
		{"not run with an empty reason", "<!-- not run: -->\n```go\nx\n```\n", "go", "x.md:1: <!-- not run --> needs a reason"},
		{"misspelt", "text\n\n<!-- not-run: x -->\n```sh\nx\n```\n", "page", "x.md:3: <!-- not-run: x -->: not a docs directive"},
		{"skip", "<!-- skip -->\n```sh\nx\n```\n", "page", "not a docs directive"},
		{"not above a block", "<!-- not run: x -->\ntext\n```sh\nx\n```\n", "page", "x.md:1: the directive is not directly above a code block"},
		{"at the end", "<!-- not run: x -->\n", "page", "x.md:1: the directive is not directly above a code block"},
		{"fragment above sh", "<!-- go: fragment -->\n```sh\nx\n```\n", "page", "not a ```go block"},
		{"prompt", "```sh\necho a\n$ echo b\n```\n", "sh", "x.md:3: a ```sh line starts with a prompt"},
		{"golang", "```golang\npackage x\n```\n", "page", "write ```go"},
		{"shell", "```shell\nls\n```\n", "page", "write ```sh"},
		{"bad timeout", "<!-- timeout: soon -->\n", "sh", "x.md:1: <!-- timeout: soon -->: not a positive Go duration"},
		{"two timeouts", "<!-- timeout: 1m -->\n<!-- timeout: 2m -->\n", "sh", "x.md:2: a second <!-- timeout --> (the first is on line 1)"},
		{"continued", "```sh\necho a \\\n  b \\\n\n```\n", "sh", "x.md:1: the ```sh block ends with a line continuation"},
		{"unclosed", "```sh\nls\n", "page", "x.md:1: the code block is not closed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := parsePage("x.md", tc.text)
			require.Len(t, p.errs, 1, "%v", p.errs)
			assert.Equal(t, tc.kind, p.errs[0].kind)
			assert.Contains(t, p.errs[0].msg, tc.want)
		})
	}
	// A plain comment is no directive, and separates a directive from its block.
	p := parsePage("x.md", "<!-- a note for editors -->\n```sh\nls\n```\n")
	assert.Empty(t, p.errs)
	assert.False(t, p.blocks[0].notRun)
	// The fragment rule is the compile test's: it parses.
	p = parsePage("x.md", "<!-- go: fragment -->\n\n```go\nx := 1\n```\n")
	assert.Empty(t, p.errs)
	assert.True(t, p.blocks[0].fragment)
}

func TestMatchOutput(t *testing.T) {
	out := []string{"starting", "   20 backend A", "listening on 127.0.0.1:8080 (pid 42)", "tick", "done: 3 ok, 0 failed"}
	for _, tc := range []struct {
		name    string
		want    string
		missing int
	}{
		{"substrings in order", "starting\n20 backend A\ndone", -1},
		{"blank lines and ... lines ignored", "\nstarting\n...\n\n  done: 3 ok  \n", -1},
		{"... inside a line", "listening on ...:8080 (pid ...)\ndone: ... ok, 0 failed", -1},
		{"... at the ends", "...backend...", -1},
		{"out of order", "done\nstarting", 1},
		{"one output line per expected line", "tick\ntick", 1},
		{"not there", "starting\nbackend B", 1},
		{"regexp characters are literal", "127.0.0.1:8080 (pid 4.)", 0},
		{"... does not cross lines", "starting...backend A", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &block{body: strings.Split(tc.want, "\n")}
			missing, at := matchOutput(expectLines(b), out)
			assert.Equal(t, tc.missing, missing)
			if missing < 0 {
				assert.Len(t, at, len(expectLines(b)))
			}
		})
	}
	msg := checkOutput(&block{page: "p.md", line: 3, body: []string{"echo"}, expect: &block{page: "p.md", line: 7, body: []string{"starting", "backend B", "done"}}}, out)
	assert.Contains(t, msg, "p.md: the output of the ```sh block at p.md:3 does not match the ```text block at p.md:7: expected line 2 of 3 not found after output line 1")
	assert.Contains(t, msg, "MISSING backend B")
	assert.Contains(t, msg, "| done: 3 ok, 0 failed")
}

func TestMentionedPorts(t *testing.T) {
	text := "listen on 127.0.0.1:4040 and http://pool.localhost:8080/, -addr :9191, port = 7000,\n" +
		"python3 -m http.server 3000, in 2026 and port 443, https://example.com:8443x, 10.0.0.1:6000x v1.2:3456"
	assert.Equal(t, []int{3000, 4040, 7000, 8080, 9191}, mentionedPorts(text))
}

func TestGoBlockKind(t *testing.T) {
	for src, want := range map[string]string{
		"package main\nfunc main() {}\n":                        "main.go build",
		"package main_test\nfunc TestX(t *testing.T) {}\n":      "x_test.go test",
		"package x\n\nfunc ExampleY() {}\n":                     "x_test.go test",
		"package x\nfunc BenchmarkZ(b *testing.B) {}\n":         "x_test.go test",
		"package x\n\n// Run is func TestX's.\nfunc Run() {}\n": "x.go build",
	} {
		file, args := goBlockKind(src)
		assert.Equal(t, want, file+" "+args[0], src)
	}
}

func TestMissingNeeds(t *testing.T) {
	p := parsePage("x.md", "<!-- needs: bash warren-no-such-command -->\n```sh\nls\n```\n")
	assert.Equal(t, "x.md needs warren-no-such-command, not found on PATH: install warren-no-such-command", missingNeeds(p))
	assert.Empty(t, missingNeeds(parsePage("x.md", "<!-- needs: bash -->\n")))
}

func TestBusyPorts(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	busy := busyPorts([]int{port})
	require.Len(t, busy, 1)
	assert.Contains(t, busy[0], fmt.Sprintf("port %d is in use (", port))
	t.Log(busy[0]) // with the process, where ss can tell
	ln.Close()
	assert.Empty(t, busyPorts([]int{port}))
}

// lineOf is the line of the first line of page holding s.
func lineOf(t *testing.T, path, s string) int {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	for i, l := range strings.Split(string(data), "\n") {
		if strings.Contains(l, s) {
			return i + 1
		}
	}
	t.Fatalf("%s has no %q", path, s)
	return 0
}

// TestShellHarnessSelfTest runs testdata/selftest.md: a background process, an output check
// that passes, one that must fail, and a block that outlives the page's 4-second timeout.
func TestShellHarnessSelfTest(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	root, err := repoRoot()
	require.NoError(t, err)
	const path = "testdata/selftest.md"
	p, err := parsePageFile(path, path)
	require.NoError(t, err)
	require.Empty(t, p.errs)
	out := t.TempDir()
	start := time.Now()
	fails := runShellPage(context.Background(), p, shellOptions{root: root, env: []string{"SELFTEST_OUT=" + out}, logf: t.Logf})
	t.Logf("the self-test page ran in %v", time.Since(start).Round(time.Millisecond))
	require.Len(t, fails, 2, strings.Join(fails, "\n"))
	for _, f := range fails {
		t.Log("as reported:\n" + f)
	}
	timeout, mismatch := fails[0], fails[1]

	fence := lineOf(t, path, `echo "before the sleep`) - 1
	assert.Contains(t, timeout, "testdata/selftest.md: timed out after 4s in the ```sh block at testdata/selftest.md:"+strconv.Itoa(fence)+" (block 4 of 4;")
	assert.Contains(t, timeout, strconv.Itoa(fence+2)+"  sleep 30")
	assert.Contains(t, timeout, "| before the sleep, in examples") // the cd of block 2 carried over

	fence = lineOf(t, path, `echo "the answer is 41"`) - 1
	textFence := lineOf(t, path, "the answer is 42") - 1
	assert.Contains(t, mismatch, "the output of the ```sh block at testdata/selftest.md:"+strconv.Itoa(fence)+
		" does not match the ```text block at testdata/selftest.md:"+strconv.Itoa(textFence)+": expected line 1 of 1 not found")
	assert.Contains(t, mismatch, "MISSING the answer is 42")
	assert.Contains(t, mismatch, "| the answer is 41")
	assert.Contains(t, mismatch, "| e2e") // ls in examples/ of the copy

	// The background process ended with the page.
	data, err := os.ReadFile(filepath.Join(out, "bg.pid"))
	require.NoError(t, err)
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	require.NoError(t, err)
	assert.True(t, gone(pid), "the background process %d outlived the page", pid)
}

// gone reports whether process pid has ended (or is a zombie waiting for its reaper).
func gone(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	s := string(data)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(f) > 0 && (f[0] == "Z" || f[0] == "X")
}

// TestShellHarnessFailingCommand runs testdata/selftest-fail.md, whose second command fails.
func TestShellHarnessFailingCommand(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	root, err := repoRoot()
	require.NoError(t, err)
	const path = "testdata/selftest-fail.md"
	p, err := parsePageFile(path, path)
	require.NoError(t, err)
	fails := runShellPage(context.Background(), p, shellOptions{root: root, logf: t.Logf})
	require.Len(t, fails, 1, strings.Join(fails, "\n"))
	t.Log("as reported:\n" + fails[0])
	line := lineOf(t, path, "false")
	assert.Contains(t, fails[0], "testdata/selftest-fail.md: the ```sh block at testdata/selftest-fail.md:3 (block 1 of 1) failed: exit status 1")
	assert.Contains(t, fails[0], "the failing command (status 1) at testdata/selftest-fail.md:"+strconv.Itoa(line)+": false")
	assert.Contains(t, fails[0], "| one")
	assert.NotContains(t, fails[0], "| never")
}

// TestShellHarnessSyntaxError: a page whose blocks bash cannot parse fails before it runs.
func TestShellHarnessSyntaxError(t *testing.T) {
	p := parsePage("x.md", "# x\n\n```sh\necho fine\n```\n\n```sh\nif true; then\n  echo unfinished\n```\n")
	fails := runShellPage(context.Background(), p, shellOptions{root: "/nonexistent"})
	require.Len(t, fails, 1)
	t.Log("as reported:\n" + fails[0])
	assert.Contains(t, fails[0], "x.md: the ```sh block at x.md:7 does not parse (bash -n):")
	assert.Contains(t, fails[0], "x.md:10: syntax error: unexpected end of file")
}

// TestGoHarnessSelfTest compiles the blocks of testdata/selftest-go.md: a package main, an
// example test, a library package, which compile, and a fragment, a block without a package
// clause and one with an error, which must not.
func TestGoHarnessSelfTest(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	root, err := repoRoot()
	require.NoError(t, err)
	const path = "testdata/selftest-go.md"
	p, err := parsePageFile(path, path)
	require.NoError(t, err)
	require.Empty(t, p.errs)
	var cmds, errs []string
	start := time.Now()
	for _, b := range p.blocks {
		if b.notRun {
			continue
		}
		cmd, err := compileGoBlock(t.Context(), root, b)
		if err != nil {
			errs = append(errs, err.Error())
		} else {
			cmds = append(cmds, cmd)
		}
	}
	t.Logf("compiled the self-test page's blocks in %v", time.Since(start).Round(time.Millisecond))
	assert.Equal(t, []string{"go build -o /dev/null . (main.go)", "go test -c -o /dev/null . (x_test.go)", "go build -o /dev/null . (x.go)"}, cmds)
	require.Len(t, errs, 3, strings.Join(errs, "\n"))
	assert.Contains(t, errs[0], "fragments are not allowed, ```go blocks must be complete files")
	assert.Contains(t, errs[1], "has no package clause")
	undefined := lineOf(t, path, "undefinedThing()")
	assert.Contains(t, errs[2], "testdata/selftest-go.md:"+strconv.Itoa(undefined)+":2: undefined: undefinedThing")
	assert.True(t, slices.ContainsFunc(p.blocks, func(b *block) bool { return b.notRun && b.reason == "shows a skipped go block" }))
}
