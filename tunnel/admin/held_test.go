package admin

import (
	"bytes"
	"context"
	"net/http"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/tunnel"
)

// The status page lists the routes held with no member (GET /api/routes, neither live nor
// reserved) in a section of their own: kind, route, tenant, group, port and times. With the
// API open the page renders it itself; a live route is not in it.
func TestStatusPageListsHeldRoutes(t *testing.T) {
	e := startEdge(t, tunnel.ServerConfig{LoadBalancing: tunnel.LoadBalancing{Enabled: true}, RouteTTL: time.Hour}, Options{})
	c := newAPIClient(t, e.adminAddr)
	b := backend(t, "b")
	sess := e.connect()
	gone, err := sess.Forward(ctxT(t), pool("old"), hostPort(b.URL))
	require.NoError(t, err)
	require.NoError(t, gone.Close())
	_, err = sess.Forward(ctxT(t), pool("pool"), hostPort(b.URL))
	require.NoError(t, err)
	require.Eventually(t, func() bool { // the route's record notes when it emptied
		for _, r := range getJSON[[]RouteInfo](c, "", "/api/routes") {
			if r.Label == "old" {
				return r.EmptySince != nil
			}
		}
		return false
	}, 5*time.Second, 10*time.Millisecond)

	status, _, page := c.get("", "/")
	require.Equal(t, http.StatusOK, status)
	body := string(page)
	require.Contains(t, body, "Held routes with no member")
	rows := regexp.MustCompile(`(?s)<tr data-route="([^"]*)">(.*?)</tr>`).FindAllStringSubmatch(body, -1)
	require.Len(t, rows, 1, "the held route only, not the live one: %s", body)
	require.Equal(t, "http/old", rows[0][1])
	row := rows[0][2]
	require.Contains(t, row, `<code>old</code>`)
	require.Contains(t, row, `<td data-label="Group">web</td>`)
	require.Regexp(t, `<td data-label="Expires" class="nowrap">\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ</td>`, row, "when the claim lapses")
	require.Regexp(t, `<td data-label="Empty since" class="nowrap">\d{4}-`, row)

	// The claim released: the section says none is held.
	status, _, _ = c.do(http.MethodDelete, "", "/api/routes/http/old")
	require.Equal(t, http.StatusOK, status)
	_, _, page = c.get("", "/")
	require.NotContains(t, string(page), "data-route=")
	require.Contains(t, string(page), "No route is held without a member.")
}

// When the API needs a token, a plain page load shows no held route (the section is hidden
// and empty: the script fills it with what the token may see, through GET /api/routes).
func TestStatusPageHeldRoutesNeedAToken(t *testing.T) {
	e := startEdge(t, tunnel.ServerConfig{LoadBalancing: tunnel.LoadBalancing{Enabled: true}, Auth: tenantAuth(t),
		RouteTTL: time.Hour}, Options{Token: "admin-token-0123456789"})
	c := newAPIClient(t, e.adminAddr)
	gone, err := e.connect(tunnel.WithToken(acmeToken)).Forward(ctxT(t), tunnel.TunnelSpec{Subdomain: "old"}, hostPort(backend(t, "b").URL))
	require.NoError(t, err)
	require.NoError(t, gone.Close())
	require.Len(t, getJSON[[]RouteInfo](c, acmeToken, "/api/routes"), 1, "acme holds it")
	require.Empty(t, getJSON[[]RouteInfo](c, globexToken, "/api/routes"), "globex does not see it")

	status, _, page := c.get("", "/")
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, string(page), `<section id="held-routes" class="held" hidden>`)
	require.NotContains(t, string(page), "data-route=")
	require.NotContains(t, string(page), "acme")
}

// Everything of a held route is escaped, and a route list that cannot be read says so.
func TestStatusPageHeldRoutesEscaped(t *testing.T) {
	now := time.Now()
	var buf bytes.Buffer
	require.NoError(t, statusTemplate.Execute(&buf, statusPage{Open: true, Rendered: now, Held: []RouteInfo{{
		Kind: "tcp", Label: `<img src=x onerror="window.pwned=1">`, Tenant: `<script>window.pwned=2</script>`,
		Group: `"><b>`, Port: 20001, EmptySince: &now, ExpiresAt: &now,
	}}}))
	body := buf.String()
	for _, raw := range []string{`<img src=x`, `<script>window`, `"><b>`} {
		require.NotContains(t, body, raw)
	}
	require.Contains(t, body, `&lt;script&gt;window.pwned=2&lt;/script&gt;`)
	require.Contains(t, body, `<td data-label="Port" class="num">20001</td>`)
	require.Contains(t, body, `<td data-label="Claimed" class="nowrap">—</td>`, "a time not recorded")

	buf.Reset()
	require.NoError(t, statusTemplate.Execute(&buf, statusPage{Open: true, Rendered: now, HeldErr: true}))
	require.Contains(t, buf.String(), "Cannot read the held routes now.")
}

// The routes the page lists with the API open come from the operator's list; when it fails
// the page still renders, with the groups, and says the routes could not be read.
func TestStatusPageHeldRoutesFailure(t *testing.T) {
	p, _ := statusPlane(t, config{Routes: func(context.Context) ([]tunnel.RouteClaim, error) {
		return nil, context.DeadlineExceeded
	}})
	body := serve(p, http.MethodGet, "/", "").Body.String()
	require.Contains(t, body, "Cannot read the held routes now.")
	require.Contains(t, body, `data-member="m1"`)
}
