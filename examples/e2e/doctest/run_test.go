package doctest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// outputTail is how many lines of a block's output a failure shows.
const outputTail = 40

// killGrace is how long a page's processes have to exit after SIGTERM before SIGKILL.
const killGrace = 5 * time.Second

// repoRoot is the checkout under test: the top of the git work tree holding this package.
func repoRoot() (string, error) {
	out, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		return "", fmt.Errorf("git rev-parse --show-toplevel: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// goEnvKeys are the go command's settings a page's shell keeps from the real environment, so
// that its fresh HOME re-downloads and rebuilds nothing.
var goEnvKeys = []string{"GOCACHE", "GOMODCACHE", "GOPATH", "GOPROXY", "GOFLAGS", "GOSUMDB",
	"GONOSUMDB", "GONOPROXY", "GOPRIVATE", "GOINSECURE", "GOTOOLCHAIN"}

func goEnv(keys []string) (map[string]string, error) {
	out, err := exec.Command("go", append([]string{"env", "-json"}, keys...)...).Output()
	if err != nil {
		return nil, fmt.Errorf("go env: %w", err)
	}
	m := map[string]string{}
	return m, json.Unmarshal(out, &m)
}

// copyCheckout copies the files git would show in a fresh clone with the work tree's
// changes on top: tracked and untracked-but-not-ignored files, as they are on disk (so
// uncommitted edits are tested). Then it makes the copy a git repository of one commit, as
// a clone is one.
func copyCheckout(root, dst string) error {
	cmd := exec.Command("git", "ls-files", "-z", "-c", "-o", "--exclude-standard")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("git ls-files in %s: %w", root, err)
	}
	for _, rel := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		if rel == "" {
			continue
		}
		src, to := filepath.Join(root, rel), filepath.Join(dst, rel)
		fi, err := os.Lstat(src)
		if errors.Is(err, os.ErrNotExist) {
			continue // deleted in the work tree, not yet committed
		}
		if err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
			return err
		}
		switch {
		case fi.Mode()&os.ModeSymlink != 0:
			target, err := os.Readlink(src)
			if err != nil {
				return err
			}
			if err := os.Symlink(target, to); err != nil {
				return err
			}
		case fi.Mode().IsRegular():
			data, err := os.ReadFile(src)
			if err != nil {
				return err
			}
			if err := os.WriteFile(to, data, fi.Mode().Perm()); err != nil {
				return err
			}
		}
	}
	for _, args := range [][]string{
		{"init", "-q"},
		{"add", "-A"},
		{"-c", "user.name=docs harness", "-c", "user.email=docs@localhost", "commit", "-q", "--no-verify", "-m", "the checkout under test"},
	} {
		cmd := exec.Command("git", args...)
		cmd.Dir = dst
		cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("git %s in the copy: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	return nil
}

// fixedPorts are the loopback ports the pages use; a page mentioning one as a word needs
// it free.
var fixedPorts = []int{3000, 3001, 4040, 4041, 4042, 5432, 8080, 8081, 8082, 8443, 9090, 9091, 9092}

var (
	colonPortRE = regexp.MustCompile(`(?:^|[^0-9A-Za-z:.])(?:127\.0\.0\.1|localhost|0\.0\.0\.0|\[::1?\]|[a-z0-9-]+\.localhost)?:([0-9]{4,5})\b`)
	tomlPortRE  = regexp.MustCompile(`(?i)\bport\s*[=:]\s*"?([0-9]{4,5})\b`)
	wordRE      = regexp.MustCompile(`\b[0-9]{4}\b`)
)

// mentionedPorts are the fixed ports a page names anywhere (as a word) and the ports ≥1024 it
// names as :NNNN (127.0.0.1:NNNN, localhost:NNNN, a bare :NNNN in a flag or an address) or
// as port = NNNN / port: NNNN in a config block.
func mentionedPorts(text string) []int {
	set := map[int]bool{}
	for _, m := range colonPortRE.FindAllStringSubmatch(text, -1) {
		if n, _ := strconv.Atoi(m[1]); n >= 1024 && n <= 65535 {
			set[n] = true
		}
	}
	for _, m := range tomlPortRE.FindAllStringSubmatch(text, -1) {
		if n, _ := strconv.Atoi(m[1]); n >= 1024 && n <= 65535 {
			set[n] = true
		}
	}
	for _, w := range wordRE.FindAllString(text, -1) {
		if n, _ := strconv.Atoi(w); slices.Contains(fixedPorts, n) {
			set[n] = true
		}
	}
	var out []int
	for n := range set {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// busyPorts tries to listen on each port on 127.0.0.1 and describes those in use, with the
// listening process when ss can tell.
func busyPorts(ports []int) []string {
	var out []string
	for _, n := range ports {
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", n))
		if err == nil {
			ln.Close()
			continue
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			continue // e.g. not allowed to bind: the page cannot be listening there either
		}
		who := "ss could not tell which process"
		if ss, err := exec.Command("ss", "-Hltnp", fmt.Sprintf("sport = :%d", n)).Output(); err == nil && len(bytes.TrimSpace(ss)) > 0 {
			who = strings.Join(strings.Fields(string(ss)), " ")
		}
		out = append(out, fmt.Sprintf("port %d is in use (%s)", n, who))
	}
	return out
}

// groupMembers are the live (not zombie) processes of process group pgid.
func groupMembers(pgid int) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(data)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:]) // state ppid pgrp ...
		if len(f) < 3 || f[0] == "Z" || f[0] == "X" {
			continue
		}
		if g, _ := strconv.Atoi(f[2]); g == pgid {
			out = append(out, pid)
		}
	}
	return out
}

// killGroup ends process group pgid: SIGTERM, then SIGKILL to what is left after killGrace.
// It returns the processes still alive after all that (none, normally).
func killGroup(pgid int) []int {
	wait := func(d time.Duration) bool {
		for end := time.Now().Add(d); ; time.Sleep(50 * time.Millisecond) {
			if len(groupMembers(pgid)) == 0 {
				return true
			}
			if time.Now().After(end) {
				return false
			}
		}
	}
	if len(groupMembers(pgid)) == 0 {
		return nil
	}
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	if wait(killGrace) {
		return nil
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	wait(10 * time.Second)
	return groupMembers(pgid)
}

// lockedBuffer is the page's output, written by its processes while the harness reads it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// shellOptions are the settings of one page's run.
type shellOptions struct {
	root string   // the checkout to copy
	env  []string // added to the page's environment (the self-test's)
	logf func(format string, args ...any)
	// deadline, if set, caps the page's timeout (the test binary's own -timeout).
	deadline time.Time
}

// shellScript is the bash script of a page's ```sh blocks, and which page line each of its
// lines came from.
type shellScript struct {
	text    string
	lineMap map[int]int // script line -> page line
	blocks  []*block    // the blocks that run, in order; marker i announces blocks[i]
}

func buildScript(p *page, nonce string) *shellScript {
	s := &shellScript{lineMap: map[int]int{}}
	var lines []string
	add := func(l string, pageLine int) {
		lines = append(lines, l)
		if pageLine > 0 {
			s.lineMap[len(lines)] = pageLine
		}
	}
	marker := "::warren-docs-" + nonce + "::"
	add("set -eo pipefail", 0)
	add(fmt.Sprintf(`__warren_docs_err() { printf '\n%s err %%s %%s %%s\n' "$1" "$2" "${3//$'\n'/ }"; }`, marker), 0)
	add(`trap '__warren_docs_err "$?" "$LINENO" "$BASH_COMMAND"' ERR`, 0)
	for _, b := range p.shBlocks() {
		if b.notRun {
			continue
		}
		add(fmt.Sprintf(`printf '\n%s block %d\n'`, marker, len(s.blocks)), 0)
		s.blocks = append(s.blocks, b)
		for i, l := range b.body {
			add(l, b.line+1+i)
		}
	}
	add(fmt.Sprintf(`printf '\n%s end\n'`, marker), 0)
	s.text = strings.Join(lines, "\n") + "\n"
	return s
}

// transcript is a page's output cut at the markers.
type transcript struct {
	outputs  [][]string // per block of the script, its output lines
	started  int        // how many blocks started
	ended    bool       // the end marker was printed: every block ran
	errLine  int        // the script line of the command that failed, 0 if none
	errCmd   string
	errState string
}

func parseTranscript(out, nonce string, nblocks int) *transcript {
	marker := "::warren-docs-" + nonce + "::"
	tr := &transcript{outputs: make([][]string, nblocks)}
	cur := -1
	for _, l := range strings.Split(strings.ReplaceAll(out, "\r", ""), "\n") {
		if rest, ok := strings.CutPrefix(l, marker+" "); ok {
			switch {
			case rest == "end":
				tr.ended = true
				cur = -1
			case strings.HasPrefix(rest, "block "):
				cur, _ = strconv.Atoi(strings.TrimPrefix(rest, "block "))
				tr.started = cur + 1
			case strings.HasPrefix(rest, "err "):
				f := strings.SplitN(strings.TrimPrefix(rest, "err "), " ", 3)
				if len(f) == 3 {
					tr.errState = f[0]
					tr.errLine, _ = strconv.Atoi(f[1])
					tr.errCmd = f[2]
				}
			}
			continue
		}
		if cur >= 0 && cur < nblocks {
			tr.outputs[cur] = append(tr.outputs[cur], l)
		}
	}
	return tr
}

// tail formats the last n non-trailing-blank lines of out, indented.
func tail(out []string, n int) string {
	for len(out) > 0 && strings.TrimSpace(out[len(out)-1]) == "" {
		out = out[:len(out)-1]
	}
	for len(out) > 0 && strings.TrimSpace(out[0]) == "" {
		out = out[1:]
	}
	if len(out) == 0 {
		return "    (no output)\n"
	}
	var sb strings.Builder
	if len(out) > n {
		fmt.Fprintf(&sb, "    [... %d lines before]\n", len(out)-n)
		out = out[len(out)-n:]
	}
	for _, l := range out {
		sb.WriteString("    | " + l + "\n")
	}
	return sb.String()
}

// showBlock formats a block's lines with their page line numbers.
func showBlock(b *block) string {
	var sb strings.Builder
	for i, l := range b.body {
		fmt.Fprintf(&sb, "    %5d  %s\n", b.line+1+i, l)
	}
	return sb.String()
}

// pageDir is the directory of a page's run: the same one on every run of the page from the
// same checkout, so that the go command's build cache, which is keyed by the packages'
// directories, serves a page's builds from its previous run. A lock file keeps two runs of
// one page from sharing it; unlock releases it.
func pageDir(root, pagePath string) (dir string, unlock func(), err error) {
	sum := sha256.Sum256([]byte(root + "\x00" + pagePath))
	dir = filepath.Join(os.TempDir(), "warren-doctest-"+hex.EncodeToString(sum[:6]))
	lock, err := os.OpenFile(dir+".lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return "", nil, err
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		lock.Close()
		return "", nil, fmt.Errorf("another run of this page holds %s.lock (%v)", dir, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		lock.Close()
		return "", nil, err
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		lock.Close()
		return "", nil, err
	}
	return dir, func() { lock.Close() }, nil
}

// runShellPage runs the page's ```sh blocks in one bash process as described in the
// package comment and returns its failures, each a message for t.Error.
func runShellPage(ctx context.Context, p *page, opt shellOptions) []string {
	logf := opt.logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	var nonceB [6]byte
	_, _ = rand.Read(nonceB[:])
	nonce := hex.EncodeToString(nonceB[:])
	script := buildScript(p, nonce)
	if len(script.blocks) == 0 {
		return nil
	}

	tmp, unlock, err := pageDir(opt.root, p.path)
	if err != nil {
		return []string{fmt.Sprintf("%s: %v", p.path, err)}
	}
	defer unlock()
	defer func() {
		if err := os.RemoveAll(tmp); err != nil {
			logf("removing %s: %v", tmp, err)
		}
	}()
	src, home, bin, run := filepath.Join(tmp, "src"), filepath.Join(tmp, "home"), filepath.Join(tmp, "bin"), filepath.Join(tmp, "run")
	for _, d := range []string{src, home, bin, run} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return []string{err.Error()}
		}
	}
	scriptPath := filepath.Join(tmp, "page.sh")
	if err := os.WriteFile(scriptPath, []byte(script.text), 0o600); err != nil {
		return []string{err.Error()}
	}
	// Each block on its own must parse: a user pastes it whole.
	var syntax []string
	for _, b := range script.blocks {
		cmd := exec.Command("bash", "-n")
		cmd.Stdin = strings.NewReader(strings.Join(b.body, "\n") + "\n")
		if out, err := cmd.CombinedOutput(); err != nil {
			syntax = append(syntax, fmt.Sprintf("%s: the ```sh block at %s does not parse (bash -n):\n%s  the block:\n%s",
				p.path, b.where(), indent(mapBlockLines(string(out), b)), showBlock(b)))
		}
	}
	if len(syntax) > 0 {
		return syntax
	}
	start := time.Now()
	if err := copyCheckout(opt.root, src); err != nil {
		return []string{fmt.Sprintf("%s: copying the checkout: %v", p.path, err)}
	}
	logf("%s: copied the checkout to %s in %v", p.path, src, time.Since(start).Round(time.Millisecond))
	start = time.Now()

	env, err := pageEnv(home, bin, run, opt.env)
	if err != nil {
		return []string{err.Error()}
	}
	timeout := p.timeout
	if !opt.deadline.IsZero() {
		if left := time.Until(opt.deadline) - 30*time.Second; left < timeout {
			timeout = max(left, time.Second)
		}
	}

	pr, pw, err := os.Pipe()
	if err != nil {
		return []string{err.Error()}
	}
	cmd := exec.Command("bash", "--noprofile", "--norc", scriptPath)
	cmd.Dir = src
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = pw, pw // one pipe: stdout and stderr interleave as in a terminal
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		pr.Close()
		pw.Close()
		return []string{err.Error()}
	}
	pw.Close()
	pgid := cmd.Process.Pid
	var out lockedBuffer
	copied := make(chan struct{})
	go func() {
		_, _ = io.Copy(&out, pr)
		close(copied)
	}()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	var (
		waitErr  error
		timedOut bool
	)
	timer := time.NewTimer(timeout)
	select {
	case waitErr = <-exited:
	case <-timer.C:
		timedOut = true
	case <-ctx.Done():
		timedOut = true
	}
	timer.Stop()
	left := killGroup(pgid)
	if timedOut {
		waitErr = <-exited
	}
	select {
	case <-copied:
	case <-time.After(2 * time.Second): // a process outside the group holds the pipe
		pr.Close()
		<-copied
	}
	pr.Close()
	logf("%s: the page's %d ```sh blocks took %v", p.path, len(script.blocks), time.Since(start).Round(time.Millisecond))

	tr := parseTranscript(out.String(), nonce, len(script.blocks))
	var fails []string
	if len(left) > 0 {
		fails = append(fails, fmt.Sprintf("%s: processes of the page outlived SIGKILL: %v", p.path, left))
	}
	cur := max(tr.started-1, 0)
	curBlock := script.blocks[cur]
	switch {
	case timedOut:
		fails = append(fails, fmt.Sprintf("%s: timed out after %v in the ```sh block at %s (block %d of %d; raise the page's bound with <!-- timeout: 8m -->)\n  the block:\n%s  its output so far (last %d lines):\n%s",
			p.path, timeout, curBlock.where(), cur+1, len(script.blocks), showBlock(curBlock), outputTail, tail(tr.outputs[cur], outputTail)))
	case waitErr != nil || !tr.ended:
		what := "exited"
		if waitErr != nil {
			what = waitErr.Error()
		}
		failed := ""
		if tr.errLine > 0 {
			failed = fmt.Sprintf("\n  the failing command (status %s) at %s:%d: %s", tr.errState, p.path, script.lineMap[tr.errLine], tr.errCmd)
		}
		if waitErr == nil {
			what = "the shell exited (status 0) before the page's last block"
		}
		fails = append(fails, fmt.Sprintf("%s: the ```sh block at %s (block %d of %d) failed: %s%s\n  the block:\n%s  its output (last %d lines):\n%s",
			p.path, curBlock.where(), cur+1, len(script.blocks), what, failed, showBlock(curBlock), outputTail, tail(tr.outputs[cur], outputTail)))
	}
	// The output checks of the blocks that ran to their end.
	done := tr.started
	if !tr.ended {
		done = tr.started - 1
	}
	for i := 0; i < done; i++ {
		b := script.blocks[i]
		if b.expect == nil {
			continue
		}
		if msg := checkOutput(b, tr.outputs[i]); msg != "" {
			fails = append(fails, msg)
		}
	}
	return fails
}

// checkOutput compares a block's output with its ```text block; "" if it matches.
func checkOutput(b *block, output []string) string {
	want := expectLines(b.expect)
	missing, at := matchOutput(want, output)
	if missing < 0 {
		return ""
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "%s: the output of the ```sh block at %s does not match the ```text block at %s: expected line %d of %d not found",
		b.page, b.where(), b.expect.where(), missing+1, len(want))
	if missing > 0 {
		fmt.Fprintf(&sb, " after output line %d", at[missing-1]+1)
	}
	sb.WriteString("\n  expected, in order (each a substring of an output line; ... matches any text):\n")
	for i, w := range want {
		mark := "ok"
		switch {
		case i == missing:
			mark = "MISSING"
		case i > missing:
			mark = "  "
		}
		fmt.Fprintf(&sb, "    %-7s %s\n", mark, w)
	}
	fmt.Fprintf(&sb, "  the block:\n%s  its output (last %d lines):\n%s", showBlock(b), outputTail, tail(output, outputTail))
	return sb.String()
}

// pageEnv is the environment of a page's shell: the real one with a temporary HOME, GOBIN
// first on PATH, XDG_RUNTIME_DIR of its own, the go command's settings of the real
// environment, and WARREN_DOCS=0 (a page running the tests must not run the pages again).
func pageEnv(home, bin, run string, extra []string) ([]string, error) {
	goenv, err := goEnv(goEnvKeys)
	if err != nil {
		return nil, err
	}
	drop := map[string]bool{"HOME": true, "GOBIN": true, "PATH": true, "XDG_RUNTIME_DIR": true, "WARREN_DOCS": true,
		"OLDPWD": true, "PWD": true, "GOENV": true, "GOCOVERDIR": true, "GOWORK": true}
	for _, k := range goEnvKeys {
		drop[k] = true
	}
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if !drop[k] {
			env = append(env, kv)
		}
	}
	for _, k := range goEnvKeys {
		if v := goenv[k]; v != "" {
			env = append(env, k+"="+v)
		}
	}
	env = append(env, "HOME="+home, "GOBIN="+bin, "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"),
		"XDG_RUNTIME_DIR="+run, "WARREN_DOCS=0")
	return append(env, extra...), nil
}

// mapBlockLines rewrites bash's "bash: line N:" (N in the block) to "page:M:".
func mapBlockLines(out string, b *block) string {
	re := regexp.MustCompile(`bash: line ([0-9]+):`)
	return re.ReplaceAllStringFunc(out, func(m string) string {
		n, _ := strconv.Atoi(re.FindStringSubmatch(m)[1])
		return fmt.Sprintf("%s:%d:", b.page, b.line+n)
	})
}

func indent(s string) string {
	var sb strings.Builder
	for _, l := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		sb.WriteString("    " + l + "\n")
	}
	return sb.String()
}
