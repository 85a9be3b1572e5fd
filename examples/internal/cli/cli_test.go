package cli

import (
	"bytes"
	"encoding/json"
	"flag"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestLogFormat: JSON by default when stderr is not a terminal, console on a terminal, and
// --log-format overrides either.
func TestLogFormat(t *testing.T) {
	for _, tc := range []struct {
		args     []string
		terminal bool
		json     bool
	}{
		{nil, false, true},
		{nil, true, false},
		{[]string{"--log-format", "console"}, false, false},
		{[]string{"--log-format", "json"}, true, true},
	} {
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		var lf LogFlags
		lf.Register(fs)
		require.NoError(t, fs.Parse(tc.args))
		var buf bytes.Buffer
		log, err := lf.Logger(&buf, tc.terminal)
		require.NoError(t, err)
		log.Info("hello")
		var m map[string]any
		isJSON := json.Unmarshal(buf.Bytes(), &m) == nil
		require.Equal(t, tc.json, isJSON, "%v terminal=%v: %s", tc.args, tc.terminal, buf.String())
		if isJSON {
			require.Equal(t, "hello", m["msg"])
			require.Equal(t, "info", m["level"])
		} else {
			require.Regexp(t, `^\S+\tINFO\thello\n$`, buf.String())
		}
	}
}

// TestLogLevel: --log-level drops what is below it; -v is debug on the console.
func TestLogLevel(t *testing.T) {
	lines := func(lf LogFlags) []string {
		var buf bytes.Buffer
		log, err := lf.Logger(&buf, false)
		require.NoError(t, err)
		log.Debug("d")
		log.Info("i")
		log.Warn("w")
		log.Error("e")
		var out []string
		for l := range strings.Lines(buf.String()) {
			out = append(out, l)
		}
		return out
	}
	require.Len(t, lines(LogFlags{Level: "info"}), 3)
	require.Len(t, lines(LogFlags{Level: "warn"}), 2)
	only := lines(LogFlags{Level: "error", Format: "json"})
	require.Len(t, only, 1)
	require.Contains(t, only[0], `"msg":"e"`)
	var v LogFlags
	v.Verbose()
	all := lines(v)
	require.Len(t, all, 4)
	require.Contains(t, all[0], "DEBUG\td")

	_, err := LogFlags{Level: "loud"}.Logger(&bytes.Buffer{}, false)
	require.EqualError(t, err, `--log-level "loud": want debug, info, warn or error`)
	_, err = LogFlags{Level: "info", Format: "xml"}.Logger(&bytes.Buffer{}, false)
	require.EqualError(t, err, `--log-format "xml": want console or json`)
}

// TestVersion: the program's name, the module version and Go's, and a revision.
func TestVersion(t *testing.T) {
	require.Regexp(t, regexp.MustCompile(`^edge \S+ go1\.\S+ rev \S+`), Version("edge"))
}
