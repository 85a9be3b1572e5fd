// Package cli holds what the example programs share as processes: the -version line and
// the --log-level / --log-format flags with the zap logger they build. It is internal to
// the examples: a program embedding Warren builds its own logger and passes it in
// (tunnel.WithLogger, ServerConfig.Logger).
package cli

import (
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"strings"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Version returns the line -version prints for the program name: the main module's version
// and the VCS revision, time and modified flag stamped by go build, e.g.
//
//	edge (devel) go1.26.8 rev abc1234def56 2026-12-01T10:00:00Z dirty
//
// A binary built without VCS information (go run, a test) says "rev unknown".
func Version(name string) string {
	version, rev, at, dirty := "(unknown)", "", "", false
	if bi, ok := debug.ReadBuildInfo(); ok {
		version = bi.Main.Version
		if version == "" {
			version = "(devel)"
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.time":
				at = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s %s", name, version, runtime.Version())
	if rev == "" {
		b.WriteString(" rev unknown")
	} else {
		fmt.Fprintf(&b, " rev %.12s", rev)
	}
	if at != "" {
		b.WriteString(" " + at)
	}
	if dirty {
		b.WriteString(" dirty")
	}
	return b.String()
}

// VersionFlag registers -version (also spelled --version) on fs.
func VersionFlag(fs *flag.FlagSet) *bool {
	return fs.Bool("version", false, "print the version (module version, Go version, VCS revision and time) and exit")
}

// LogFlags are --log-level and --log-format.
type LogFlags struct {
	Level, Format string
}

// Register adds --log-level and --log-format to fs.
func (l *LogFlags) Register(fs *flag.FlagSet) {
	fs.StringVar(&l.Level, "log-level", "info", "log `level`: debug, info, warn or error")
	fs.StringVar(&l.Format, "log-format", "", "log `format`: console (human-readable) or json (default: console when stderr is a terminal, else json)")
}

// Verbose is the -v alias: --log-level debug --log-format console.
func (l *LogFlags) Verbose() { l.Level, l.Format = "debug", "console" }

// Logger builds the logger the flags ask for, writing to w, which must be safe for
// concurrent use; terminal chooses the default format (console on a terminal, JSON
// otherwise). An unknown level or format is an error naming the flag.
func (l LogFlags) Logger(w io.Writer, terminal bool) (*zap.Logger, error) {
	var level zapcore.Level
	switch l.Level {
	case "debug", "info", "warn", "error":
		_ = level.Set(l.Level)
	default:
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", l.Level)
	}
	format := l.Format
	if format == "" {
		format = "json"
		if terminal {
			format = "console"
		}
	}
	var enc zapcore.Encoder
	switch format {
	case "json":
		ec := zap.NewProductionEncoderConfig()
		ec.EncodeTime = zapcore.ISO8601TimeEncoder
		enc = zapcore.NewJSONEncoder(ec)
	case "console":
		ec := zap.NewDevelopmentEncoderConfig()
		ec.EncodeCaller = nil
		enc = zapcore.NewConsoleEncoder(ec)
	default:
		return nil, fmt.Errorf("--log-format %q: want console or json", l.Format)
	}
	return zap.New(zapcore.NewCore(enc, zapcore.AddSync(w), level)), nil
}

// IsTerminal reports whether w is a character device (a terminal), the default format's
// choice.
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// LogLines logs each line of err's message (a configuration file's errors, one per line)
// as its own entry at error level.
func LogLines(log *zap.Logger, err error) {
	for line := range strings.Lines(err.Error()) {
		if line = strings.TrimRight(line, "\n"); line != "" {
			log.Error(line)
		}
	}
}
