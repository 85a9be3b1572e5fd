package config_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/tunnel/config"
)

// TestAdminBindDefaultsToLoopback: an operator who sets bind = "0.0.0.0" for the public
// listeners does not publish the admin API with it.
func TestAdminBindDefaultsToLoopback(t *testing.T) {
	for _, tc := range []struct{ file, want string }{
		{"[server]\ndomain = \"localhost\"\n", "127.0.0.1:9090"},
		{"[server]\ndomain = \"localhost\"\nbind = \"0.0.0.0\"\nadmin_port = 9191\n", "127.0.0.1:9191"},
		{"[server]\ndomain = \"localhost\"\nbind = \"192.0.2.7\"\n", "127.0.0.1:9090"},
		// A loopback bind (two edges on 127.0.0.1 and 127.0.0.2) keeps its own address.
		{"[server]\ndomain = \"localhost\"\nbind = \"127.0.0.2\"\n", "127.0.0.2:9090"},
		{"[server]\ndomain = \"localhost\"\nbind = \"::1\"\n", "[::1]:9090"},
		{"[server]\ndomain = \"localhost\"\nadmin_port = 0\n", ""},
		{"[server]\ndomain = \"localhost\"\nadmin_bind = \"0.0.0.0\"\n[auth]\nadmin_token = \"admin-token-0123456789\"\n", "0.0.0.0:9090"},
		{"[server]\ndomain = \"localhost\"\nadmin_bind = \"10.1.2.3\"\nallow_open_admin = true\n", "10.1.2.3:9090"},
	} {
		require.Equal(t, tc.want, edgeOf(t, tc.file).AdminAddr, tc.file)
	}
}

// TestOpenAdminRefused: an admin listener off loopback without an admin token is refused,
// with a message naming the keys that fix it, unless allow_open_admin says it is meant.
func TestOpenAdminRefused(t *testing.T) {
	_, err := config.ParseServer("server.toml", []byte("[server]\ndomain = \"localhost\"\nadmin_bind = \"0.0.0.0\"\n"))
	require.Error(t, err)
	require.EqualError(t, err, `server.toml:3: server.admin_bind: the admin listener would serve 0.0.0.0:9090, which is not a loopback address, without an admin token: `+
		`set auth.admin_token (at least 16 characters), or admin_bind = "127.0.0.1", or allow_open_admin = true to serve it there without one`)
	require.True(t, errors.Is(err, config.ErrInvalid))

	// Off, or explicitly on loopback: nothing to refuse.
	for _, file := range []string{
		"[server]\ndomain = \"localhost\"\nadmin_bind = \"0.0.0.0\"\nadmin_port = 0\n",
		"[server]\ndomain = \"localhost\"\nadmin_bind = \"127.0.0.1\"\nbind = \"0.0.0.0\"\n",
		"[server]\ndomain = \"localhost\"\nadmin_bind = \"0.0.0.0\"\nallow_open_admin = true\n",
	} {
		_, err := config.ParseServer("server.toml", []byte(file))
		require.NoError(t, err, file)
	}
}

// TestAdminBindErrors: a bad address and a misspelt key say what to write.
func TestAdminBindErrors(t *testing.T) {
	_, err := config.ParseServer("server.toml", []byte("[server]\ndomain = \"localhost\"\nadmin_bind = \"all\"\n"))
	require.EqualError(t, err, `server.toml:3: server.admin_bind: "all" is not an IP address; use e.g. "127.0.0.1" (this machine only, the default) or "0.0.0.0" (all interfaces)`)

	_, err = config.ParseServer("server.toml", []byte("[server]\ndomain = \"localhost\"\nadmin_bnd = \"0.0.0.0\"\n"))
	require.ErrorIs(t, err, config.ErrUnknownKey)
	require.ErrorContains(t, err, `server.toml:3: server.admin_bnd: unknown key`)
	require.ErrorContains(t, err, `did you mean "admin_bind"?`)

	_, err = config.ParseServer("server.toml", []byte("[server]\ndomain = \"localhost\"\nallow_open_admn = true\n"))
	require.ErrorContains(t, err, `did you mean "allow_open_admin"?`)
}
