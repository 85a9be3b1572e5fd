package admin

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/tunnel"
)

// An open admin plane (no token, no tenants) answers only requests that name it by an IP
// address, localhost or one of Options.Hosts: a page a browser on the admin network loaded
// from a DNS name the attacker points at the listener (DNS rebinding) is refused, and reads
// nothing. /healthz tells nothing and answers any Host; with a token, any Host is checked by
// the token instead.
func TestOpenAdminPlaneAnswersOnlyItsOwnHostNames(t *testing.T) {
	e := startEdge(t, tunnel.ServerConfig{}, Options{Hosts: []string{"Admin.Internal"}})
	get := func(host, path string) int {
		req, err := http.NewRequest(http.MethodGet, "http://"+e.adminAddr+path, nil)
		require.NoError(t, err)
		req.Host = host
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, path := range []string{"/", "/api/tunnels", "/api/groups", "/metrics"} {
		for _, host := range []string{e.adminAddr, "localhost:9090", "LOCALHOST", "[::1]:9090", "10.1.2.3", "admin.internal:9090", "admin.internal."} {
			require.Equal(t, http.StatusOK, get(host, path), "%s with Host %s", path, host)
		}
		for _, host := range []string{"attacker.example", "attacker.example:9090", "admin.internal.attacker.example", "127.0.0.1.nip.io"} {
			require.Equal(t, http.StatusForbidden, get(host, path), "%s with Host %s", path, host)
		}
	}
	require.Equal(t, http.StatusOK, get("attacker.example", "/healthz"))

	// With a token, the token decides.
	const token = "admin-token-0123456789"
	te := startEdge(t, tunnel.ServerConfig{}, Options{Token: token})
	req, err := http.NewRequest(http.MethodGet, "http://"+te.adminAddr+"/api/tunnels", nil)
	require.NoError(t, err)
	req.Host = "attacker.example"
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
}
