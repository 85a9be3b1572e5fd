package config_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/tunnel/config"
)

// TestConnectorControlSocketLenient: the control socket of a connector file is found while
// the rest of the file has errors, so that "connector status" and "connector reload" reach
// the running connector during an edit.
func TestConnectorControlSocketLenient(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ text, want string }{
		{"server: localhost:4040\ncontrol_socket: run/c.sock\ntunnels:\n  a: {proto: http, local_port: 3000, subdomain: a}\n", filepath.Join(dir, "run", "c.sock")},
		// Invalid values elsewhere, an unknown key, no tunnels.
		{"server: 12\ncontrol_socket: /tmp/x.sock\nbogus: 1\ntunnels:\n  a: {proto: htp, local_port: 0}\n", "/tmp/x.sock"},
		// YAML that does not parse: the top-level line is still read.
		{"control_socket: \"/tmp/y.sock\" # comment\ntunnels:\n  a: [unclosed\n", "/tmp/y.sock"},
		{"control_socket: '/tmp/z.sock'\ntunnels: {\n", "/tmp/z.sock"},
		// None set: the caller uses the default socket of the file.
		{"server: localhost:4040\ntunnels: {\n", ""},
		{"", ""},
	} {
		path := filepath.Join(dir, "config.yml")
		require.NoError(t, os.WriteFile(path, []byte(tc.text), 0o600))
		got, err := config.ConnectorControlSocket(path)
		require.NoError(t, err, tc.text)
		require.Equal(t, tc.want, got, tc.text)
	}
	_, err := config.ConnectorControlSocket(filepath.Join(dir, "missing.yml"))
	require.ErrorContains(t, err, "missing.yml: cannot read the configuration file")
}
