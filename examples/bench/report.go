package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strings"
	"text/tabwriter"
	"time"
)

// verdict is whether a row met its target.
type verdict string

const (
	pass verdict = "pass"
	fail verdict = "FAIL"
	none verdict = ""
)

func check(ok bool) verdict {
	if ok {
		return pass
	}
	return fail
}

// row is one line of a section's table.
type row struct {
	metric, tunnel, direct, compare, target string
	result                                  verdict
	// cells replaces metric … target in a section with its own columns (section.cols).
	cells []string
}

// section is one scenario's table and its notes.
type section struct {
	title string
	// cols, when set, names the section's own columns before "result" (its rows fill
	// cells); otherwise the table has the standard columns of header.
	cols  []string
	rows  []row
	notes []string
}

func (s *section) add(r row) { s.rows = append(s.rows, r) }

func (s *section) note(format string, args ...any) {
	s.notes = append(s.notes, fmt.Sprintf(format, args...))
}

// report is the result of one invocation: the tables, plus the figures behind them for
// tests.
type report struct {
	command  string
	code     string
	started  time.Time
	elapsed  time.Duration
	sections []*section

	http []httpSummary
	h2   []h2Summary // HTTP/2 through an HTTP/1.1 member, through an h2c member; gRPC
	// h2load is the h2 scenario's table of HTTP/2 over TLS (h2load) against Warren and the
	// stock Go reverse proxy, when it ran.
	h2load *h2loadSummary
	tcp    []tcpSummary
	ttfb   *ttfbSummary
	churn  []churnSummary
	lb     *lbSummary
	mem    []memSummary
	proc   *procSummary // -layout processes
}

func newReport(cfg *config) *report {
	cmd := "go -C examples/bench run ."
	for _, a := range cfg.args {
		cmd += " " + shellQuote(a)
	}
	return &report{command: cmd, code: codeVersion(), started: time.Now()}
}

func shellQuote(s string) string {
	if s != "" && !strings.ContainsAny(s, " \t\n'\"\\$`*?[]{}()<>|&;#~!") {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func (r *report) add(s *section) { r.sections = append(r.sections, s) }

// tally counts the rows with a target that passed and failed.
func (r *report) tally() (passed, failed int) {
	for _, s := range r.sections {
		for _, row := range s.rows {
			switch row.result {
			case pass:
				passed++
			case fail:
				failed++
			}
		}
	}
	return passed, failed
}

func machineLine() string {
	return fmt.Sprintf("%s, %d cores (GOMAXPROCS %d), %s RAM, %s/%s, Linux %s, %s",
		cpuModel(), runtime.NumCPU(), runtime.GOMAXPROCS(0), memTotal(), runtime.GOOS, runtime.GOARCH, kernelRelease(), runtime.Version())
}

// codeVersion names the code under test: the VCS revision stamped into the binary (go
// build), or else the checkout's HEAD (go run), with "+ uncommitted changes" when the tree
// differs from it. It only reads the repository.
func codeVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		var rev, modified string
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				modified = s.Value
			}
		}
		if rev != "" {
			if modified == "true" {
				return "commit " + rev[:min(12, len(rev))] + " + uncommitted changes"
			}
			return "commit " + rev[:min(12, len(rev))]
		}
	}
	head, err := exec.Command("git", "rev-parse", "--short=12", "HEAD").Output()
	if err != nil {
		return "unknown (not built from a git checkout)"
	}
	v := "commit " + strings.TrimSpace(string(head))
	st, err := exec.Command("git", "--no-optional-locks", "status", "--porcelain", "--untracked-files=no").Output()
	if err == nil && len(bytes.TrimSpace(st)) > 0 {
		v += " + uncommitted changes"
	}
	return v
}

var header = row{metric: "metric", tunnel: "tunnel", direct: "direct", compare: "tunnel vs direct", target: "target", result: "result"}

// writeText writes the tables for a terminal.
func (r *report) writeText(w io.Writer) error {
	p, f := r.tally()
	fmt.Fprintf(w, "\nWarren bench — %s\ncode: %s\nmachine: %s\ndate: %s, took %s; targets met: %d of %d\n",
		r.command, r.code, machineLine(), r.started.UTC().Format(time.RFC3339), r.elapsed.Round(time.Second), p, p+f)
	for _, s := range r.sections {
		fmt.Fprintf(w, "\n== %s ==\n", s.title)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		if s.cols != nil {
			fmt.Fprintf(tw, "%s\tresult\n", strings.Join(s.cols, "\t"))
			for _, row := range s.rows {
				fmt.Fprintf(tw, "%s\t%s\n", strings.Join(dashAll(row.cells, len(s.cols)), "\t"), row.result)
			}
		} else {
			for _, row := range append([]row{header}, s.rows...) {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", row.metric, dash(row.tunnel), dash(row.direct), dash(row.compare), dash(row.target), row.result)
			}
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		for _, n := range s.notes {
			fmt.Fprintf(w, "  - %s\n", n)
		}
	}
	return nil
}

// dashAll returns cells padded to n, each empty one as a dash.
func dashAll(cells []string, n int) []string {
	out := make([]string, n)
	for i := range out {
		if i < len(cells) {
			out[i] = cells[i]
		}
		out[i] = dash(out[i])
	}
	return out
}

func dash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}

// writeMarkdown writes the same tables as Markdown, with the command, machine and date.
func (r *report) writeMarkdown(w io.Writer) error {
	p, f := r.tally()
	fmt.Fprintf(w, "# Warren bench results\n\n")
	fmt.Fprintf(w, "- Command: `%s`\n", r.command)
	fmt.Fprintf(w, "- Code: %s\n", r.code)
	fmt.Fprintf(w, "- Machine: %s\n", machineLine())
	fmt.Fprintf(w, "- Date: %s (took %s)\n", r.started.UTC().Format(time.RFC3339), r.elapsed.Round(time.Second))
	fmt.Fprintf(w, "- Targets met: %d of %d\n", p, p+f)
	for _, s := range r.sections {
		fmt.Fprintf(w, "\n## %s\n\n", s.title)
		if s.cols != nil {
			writeMarkdownCols(w, s)
		} else {
			writeMarkdownStd(w, s)
		}
		if len(s.notes) > 0 {
			fmt.Fprintln(w)
			for _, n := range s.notes {
				fmt.Fprintf(w, "- %s\n", mdCell(n))
			}
		}
	}
	return nil
}

// writeMarkdownStd writes the table of a section with the standard columns.
func writeMarkdownStd(w io.Writer, s *section) {
	fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s |\n", header.metric, header.tunnel, header.direct, header.compare, header.target, header.result)
	fmt.Fprintf(w, "|---|---:|---:|---:|---|---|\n")
	for _, row := range s.rows {
		res := string(row.result)
		if row.result == fail {
			res = "**FAIL**"
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s |\n", mdCell(row.metric), mdCell(dash(row.tunnel)), mdCell(dash(row.direct)),
			mdCell(dash(row.compare)), mdCell(dash(row.target)), res)
	}
}

// writeMarkdownCols writes the table of a section with its own columns.
func writeMarkdownCols(w io.Writer, s *section) {
	cells := make([]string, len(s.cols))
	for i, c := range s.cols {
		cells[i] = mdCell(c)
	}
	fmt.Fprintf(w, "| %s | result |\n|%s\n", strings.Join(cells, " | "), strings.Repeat("---|", len(s.cols)+1))
	for _, row := range s.rows {
		res := string(row.result)
		if row.result == fail {
			res = "**FAIL**"
		}
		cs := dashAll(row.cells, len(s.cols))
		for i := range cs {
			cs[i] = mdCell(cs[i])
		}
		fmt.Fprintf(w, "| %s | %s |\n", strings.Join(cs, " | "), res)
	}
}

func mdCell(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

func (r *report) writeMarkdownFile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	bw := bufio.NewWriter(f)
	err = r.writeMarkdown(bw)
	if err == nil {
		err = bw.Flush()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
