package doctest

import (
	"context"
	"fmt"
	"iter"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

var (
	packageRE  = regexp.MustCompile(`(?m)^package\s+([A-Za-z_][A-Za-z0-9_]*)`)
	testFuncRE = regexp.MustCompile(`(?m)^func (Test|Example|Benchmark)`)
	goLineRE   = regexp.MustCompile(`(?m)^go\s+(\S+)`)
)

// goBlockKind says how a complete ```go block compiles: its file's name and the command.
func goBlockKind(src string) (file string, args []string) {
	m := packageRE.FindStringSubmatch(src)
	switch {
	case m != nil && m[1] == "main":
		return "main.go", []string{"build", "-o", os.DevNull, "."}
	case testFuncRE.MatchString(src):
		return "x_test.go", []string{"test", "-c", "-o", os.DevNull, "."}
	default:
		return "x.go", []string{"build", "-o", os.DevNull, "."}
	}
}

// compileGoBlock compiles a ```go block in a temporary module of its own that requires the
// library, replaced by the checkout at root. It returns the command and, on failure, a
// message with the compiler's output, its lines mapped to the page's.
func compileGoBlock(ctx context.Context, root string, b *block) (string, error) {
	src := strings.Join(b.body, "\n") + "\n"
	if b.fragment {
		return "", fmt.Errorf("%s: the ```go block is marked <!-- go: fragment -->: fragments are not allowed, ```go blocks must be complete files (package clause and imports)", b.where())
	}
	if packageRE.FindStringIndex(src) == nil {
		return "", fmt.Errorf("%s: the ```go block has no package clause: ```go blocks must be complete files (package clause and imports) that compile; its first line: %q", b.where(), firstLine(slices.All(b.body)))
	}
	rootMod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		return "", err
	}
	goVersion := "1.26.0"
	if m := goLineRE.FindSubmatch(rootMod); m != nil {
		goVersion = string(m[1])
	}
	dir, err := os.MkdirTemp("", "warren-doctest-go-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	gomod := fmt.Sprintf("module warren.docs/block\n\ngo %s\n\nrequire github.com/warren-tunnel/warren v0.0.0-00010101000000-000000000000\n\nreplace github.com/warren-tunnel/warren => %s\n", goVersion, root)
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		return "", err
	}
	file, args := goBlockKind(src)
	for name, data := range map[string][]byte{"go.mod": []byte(gomod), "go.sum": sum, file: []byte(src)} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return "", err
		}
	}
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
	cmdline := "go " + strings.Join(args, " ") + " (" + file + ")"
	out, err := cmd.CombinedOutput()
	if err != nil {
		return cmdline, fmt.Errorf("%s: the ```go block does not compile: %s: %v\n%s", b.where(), cmdline, err, mapGoLines(string(out), file, b))
	}
	return cmdline, nil
}

// mapGoLines rewrites the compiler's "./main.go:12:3" to "README.md:52:3".
func mapGoLines(out, file string, b *block) string {
	re := regexp.MustCompile(`(?:\./)?` + regexp.QuoteMeta(file) + `:([0-9]+)`)
	return re.ReplaceAllStringFunc(out, func(m string) string {
		n, _ := strconv.Atoi(re.FindStringSubmatch(m)[1])
		return fmt.Sprintf("%s:%d", b.page, b.line+n)
	})
}

// firstLine is the first non-blank line of lines.
func firstLine(lines iter.Seq2[int, string]) string {
	for _, l := range lines {
		if strings.TrimSpace(l) != "" {
			return l
		}
	}
	return ""
}
