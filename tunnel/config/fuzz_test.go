package config_test

import (
	"bytes"
	"errors"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/tunnel/config"
)

// requireWellFormed checks the contract of ParseServer and ParseConnector on
// any input: either a configuration that passes its own validation, or an
// ErrorList of *Error values that each name the file, a line of the input
// and one of the package's sentinels.
func requireWellFormed(t *testing.T, name string, data []byte, yamlBreaks bool, cfg interface{ Validate() error }, isNil bool, err error) {
	t.Helper()
	if err == nil {
		require.False(t, isNil, "nil configuration without an error")
		require.NoError(t, cfg.Validate(), "a parsed configuration must pass its own validation")
		return
	}
	require.True(t, isNil, "a configuration returned together with an error")
	var list config.ErrorList
	require.True(t, errors.As(err, &list), "error %T is not an ErrorList: %v", err, err)
	require.NotEmpty(t, list)
	if len(data) > maxText {
		require.ErrorIs(t, err, config.ErrInvalid)
		require.Contains(t, err.Error(), "larger than")
		return
	}
	lines := countLines(data, yamlBreaks)
	for _, e := range list {
		var target *config.Error
		require.True(t, errors.As(e, &target))
		require.Equal(t, name, e.File)
		require.GreaterOrEqual(t, e.Line, 1, "%v", e)
		require.LessOrEqual(t, e.Line, lines, "%v", e)
		require.NotEmpty(t, e.Msg)
		known := false
		for _, s := range []error{config.ErrSyntax, config.ErrUnknownKey, config.ErrType, config.ErrRequired, config.ErrInvalid} {
			known = known || errors.Is(e, s)
		}
		require.True(t, known, "problem without a sentinel: %v", e)
	}
}

// maxText is the size limit of configuration text.
const maxText = 256 << 10

func FuzzParseServer(f *testing.F) {
	sample, err := os.ReadFile(serverSample)
	require.NoError(f, err)
	f.Add(sample)
	for _, s := range []string{
		"",
		"[server]\ndomain = \"localhost\"\n",
		"[server\ndomain = \"x\"\n",
		"[server]\ndomain = \"x\"\ndomain = \"y\"\n",
		"[server]\ndomian = 1\nhttp_port = \"80\"\n[limits]\ntcp_port_range = [30000, 20000]\ndrain_timeout_secs = nan\n",
		"server.domain = \"a\"\nlimits = { tcp_port_range = [1, \"x\"], drain_timeout_secs = 1e300 }\n",
		"[[auth.tenants]]\nname = \"a\"\ntoken = \"t\"\n[[auth.tenants]]\nname = \"a\"\ntoken = \"t\"\n[auth]\nrequire_auth = true\n",
		"[server]\ndomain = \"localhost\"\nhttps_port = 443\n[tls]\ncert_path = \"/nonexistent\"\n",
		"[[a]]\n[a]\n[a.b.c]\n\"q.k\" = 1979-05-27T07:32:00Z\n",
		"[load_balancing]\nstrategy = \"random\"\nalert_webhook_url = \"http://[::1\"\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := config.ParseServer("fuzz.toml", data)
		requireWellFormed(t, "fuzz.toml", data, false, cfg, cfg == nil, err)
		_, again := config.ParseServer("fuzz.toml", data)
		require.Equal(t, errText(err), errText(again), "parsing must be deterministic")
	})
}

func FuzzParseConnector(f *testing.F) {
	sample, err := os.ReadFile(clientSample)
	require.NoError(f, err)
	f.Add(sample)
	for _, s := range []string{
		"",
		"---\n",
		"server: localhost:4040\ntunnels:\n  a: {proto: tcp, local_port: 1}\n",
		"server: a: b\n",
		"server: localhost:4040\nserver: x\ntunnels:\n  A: {proto: udp, local_port: \"1\"}\n",
		"tunnels:\n  a:\n    proto: http\n    local_port: 1\n    health_check:\n      type: http\n      interval_secs: .nan\n",
		"x: &a [*a]\n",
		"a: &a {b: 1}\nc:\n  <<: [*a, *a]\n  <<: 5\n",
		"? [a]\n: b\n- c\n",
		"server: localhost:4040\n---\nserver: other:1\n",
		"auth_token: \"\x01\"\n",
		"tunnels:\n  a: {proto: http, local_port: 1, subdomain: p, group: g, group_key: k}\n  b: {proto: https, local_port: 2, subdomain: p, group: g, group_key: j}\n",
		"tls: {ca_path: /nonexistent, insecure_skip_verify: true, server_name: 'a b'}\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := config.ParseConnector("fuzz.yml", data)
		requireWellFormed(t, "fuzz.yml", data, true, cfg, cfg == nil, err)
		_, again := config.ParseConnector("fuzz.yml", data)
		require.Equal(t, errText(err), errText(again), "parsing must be deterministic")
	})
}

// countLines counts the lines of data: TOML ends lines with LF (or CR LF);
// YAML also with a lone CR, NEL, LS and PS.
func countLines(data []byte, yamlBreaks bool) int {
	if !yamlBreaks {
		return bytes.Count(data, []byte("\n")) + 1
	}
	n := 1
	for i, r := range string(data) {
		switch {
		case r == '\r' && i+1 < len(data) && data[i+1] == '\n':
		case r == '\n', r == '\r', r == 0x85, r == 0x2028, r == 0x2029:
			n++
		}
	}
	return n
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func TestTextSizeLimit(t *testing.T) {
	big := bytes.Repeat([]byte("# padding\n"), maxText/10+1)
	_, err := config.ParseServer("server.toml", big)
	require.ErrorIs(t, err, config.ErrInvalid)
	require.EqualError(t, err, "server.toml: the file is larger than 262144 bytes; is this the right file?")
	_, err = config.ParseConnector("config.yml", big)
	require.ErrorIs(t, err, config.ErrInvalid)

	// Up to the limit is fine.
	ok := append([]byte("[server]\ndomain = \"localhost\"\n"), bytes.Repeat([]byte("#"), maxText-30)...)
	_, err = config.ParseServer("server.toml", ok[:maxText])
	require.NoError(t, err)
}
