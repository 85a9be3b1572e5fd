package admin

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/tunnel"
)

// GET /api/routes lists the routes tenants hold, live or lingering, each tenant its own and
// the admin every one; DELETE /api/routes/{kind}/{label} releases a claim nobody serves, for
// the admin token only: the route is anyone's at once.
func TestRoutesAPIListsAndReleasesClaims(t *testing.T) {
	const admin = "admin-token-0123456789"
	e := startEdge(t, tunnel.ServerConfig{LoadBalancing: tunnel.LoadBalancing{Enabled: true}, Auth: tenantAuth(t),
		RouteTTL: time.Hour}, Options{Token: admin})
	c := newAPIClient(t, e.adminAddr)
	b := backend(t, "b")
	acme := e.connect(tunnel.WithToken(acmeToken))
	gone, err := acme.Forward(ctxT(t), tunnel.TunnelSpec{Subdomain: "old"}, hostPort(b.URL))
	require.NoError(t, err)
	require.NoError(t, gone.Close())
	_, err = acme.Forward(ctxT(t), pool("pool"), hostPort(b.URL))
	require.NoError(t, err)
	globex := e.connect(tunnel.WithToken(globexToken))
	_, err = globex.Forward(ctxT(t), tunnel.TunnelSpec{Subdomain: "g"}, hostPort(b.URL))
	require.NoError(t, err)

	labels := func(token string) map[string]RouteInfo {
		out := map[string]RouteInfo{}
		for _, r := range getJSON[[]RouteInfo](c, token, "/api/routes") {
			out[r.Kind+"/"+r.Label] = r
		}
		return out
	}
	// Closing a tunnel tells the edge, which removes the member in its own time: until then
	// the route is still live.
	var all map[string]RouteInfo
	require.Eventually(t, func() bool {
		all = labels(admin)
		return !all["http/old"].Live
	}, 10*time.Second, 10*time.Millisecond, "the closed tunnel's route stops being live")
	require.ElementsMatch(t, []string{"http/old", "http/pool", "http/g"}, keysOf(all))
	require.NotNil(t, all["http/old"].ExpiresAt, "a lingering claim says when it lapses")
	require.True(t, all["http/pool"].Live)
	require.Nil(t, all["http/pool"].ExpiresAt)
	require.Equal(t, "web", all["http/pool"].Group)
	require.ElementsMatch(t, []string{"http/old", "http/pool"}, keysOf(labels(acmeToken)), "a tenant sees its own")
	require.ElementsMatch(t, []string{"http/g"}, keysOf(labels(globexToken)))
	require.Empty(t, labels(plainToken), "a token of no tenant holds nothing here")

	status, _, _ := c.do(http.MethodDelete, acmeToken, "/api/routes/http/old")
	require.Equal(t, http.StatusForbidden, status, "a tenant does not release claims")
	status, _, _ = c.do(http.MethodDelete, admin, "/api/routes/http/pool")
	require.Equal(t, http.StatusConflict, status, "a route with members is not released")
	status, _, body := c.do(http.MethodDelete, admin, "/api/routes/http/old")
	require.Equal(t, http.StatusOK, status, "%s", body)
	var released RouteInfo
	require.NoError(t, json.Unmarshal(body, &released))
	require.Equal(t, "acme", released.Tenant)
	status, _, _ = c.do(http.MethodDelete, admin, "/api/routes/http/old")
	require.Equal(t, http.StatusNotFound, status)
	require.NotContains(t, keysOf(labels(admin)), "http/old")

	_, err = globex.Forward(ctxT(t), tunnel.TunnelSpec{Subdomain: "old"}, hostPort(b.URL))
	require.NoError(t, err, "the released name is anyone's")
}
