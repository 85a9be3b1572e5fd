package admin

// The REST API of a Plane over a live edge (moved from package tunnel's api_test.go).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/internal/wire"
	"github.com/warren-tunnel/warren/tunnel"
)

// keyShort is the short key hash of the HTTP pool on sub.
func keyShort(t *testing.T, e *testEdge, sub string) string {
	t.Helper()
	g, ok := e.Registry().LookupHTTP(sub)
	require.True(t, ok, "no group on %s", sub)
	return g.KeyHash.Short()
}

func TestAPIListsTunnelsAndGroups(t *testing.T) {
	e := startEdge(t, tunnel.ServerConfig{LoadBalancing: tunnel.LoadBalancing{Enabled: true}, TCP: tunnel.TCPTunnels{Ports: tcpRange(44000), BindHost: "127.0.0.1"}}, Options{})
	hook := newReceiver(t) // on loopback: a tenant URL there is refused, never posted to
	b := backend(t, "b")
	withHook := pool("pool")
	withHook.AlertWebhook = hook.URL + "/secret-path"
	ta, err := e.connect().Forward(ctxT(t), withHook, hostPort(b.URL))
	require.NoError(t, err)
	tb, err := e.connect().Forward(ctxT(t), pool("pool"), hostPort(b.URL))
	require.NoError(t, err)
	solo, err := e.connect().Forward(ctxT(t), tunnel.TunnelSpec{Subdomain: "solo"}, hostPort(b.URL))
	require.NoError(t, err)
	db, err := e.connect().Forward(ctxT(t), tunnel.TunnelSpec{Proto: tunnel.ProtoTCP, Group: "db", GroupKey: "k"}, hostPort(b.URL))
	require.NoError(t, err)
	api := newAPIClient(t, e.adminAddr)

	tunnels := getJSON[[]TunnelInfo](api, "", "/api/tunnels")
	require.Len(t, tunnels, 4)
	byID := tunnelsByID(tunnels)
	key := keyShort(t, e, "pool")
	a := byID[ta.ID()]
	require.Equal(t, tunnel.ProtoHTTP, a.Proto)
	require.Equal(t, "pool", a.Label)
	require.Equal(t, "web", a.Group)
	require.Equal(t, key, a.KeyHashShort)
	require.Empty(t, a.Tenant)
	require.True(t, a.Healthy, "a member without a probe is healthy")
	require.False(t, a.Draining)
	require.Equal(t, "none", a.HealthKind)
	require.Equal(t, tunnel.TransportTCP, a.Transport, "its connector's session came over TCP")
	require.Equal(t, ta.URL(), a.URL)
	require.WithinDuration(t, time.Now(), a.JoinedAt, time.Minute)
	s := byID[solo.ID()]
	require.Equal(t, "solo", s.Label)
	require.Empty(t, s.Group)
	require.Empty(t, s.KeyHashShort)
	require.Equal(t, solo.URL(), s.URL)
	d := byID[db.ID()]
	require.Equal(t, tunnel.ProtoTCP, d.Proto)
	require.Equal(t, "db", d.Label)
	require.Equal(t, db.Port(), d.Port)
	require.Equal(t, db.URL(), d.URL)

	one := getJSON[TunnelInfo](api, "", "/api/tunnels/"+tb.ID())
	require.Equal(t, byID[tb.ID()], one)
	requireError(t, api, "", "/api/tunnels/no-such-id", http.StatusNotFound)
	requireError(t, api, "", "/api/tunnels/no-such-id/health-events", http.StatusNotFound)

	code, _, raw := api.get("", "/api/groups")
	require.Equal(t, http.StatusOK, code)
	require.NotContains(t, string(raw), "secret-path", "the alert URL never leaves the edge")
	require.NotContains(t, string(raw), hook.URL)
	var groups []GroupInfo
	require.NoError(t, json.Unmarshal(raw, &groups))
	require.Len(t, groups, 2, "solo tunnels are not groups")
	web, tcp := groups[0], groups[1] // sorted by protocol
	require.Equal(t, tunnel.ProtoHTTP, web.Protocol)
	require.Equal(t, "pool", web.Label)
	require.Equal(t, "web", web.Name)
	require.Equal(t, key, web.KeyHashShort)
	require.Equal(t, ta.URL(), web.URL)
	require.Equal(t, 2, web.MemberCount)
	require.Equal(t, 2, web.HealthyCount)
	require.Equal(t, []string{ta.ID(), tb.ID()}, memberIDs(web), "members in join order")
	require.True(t, web.Members[0].HasAlertWebhook)
	require.False(t, web.Members[1].HasAlertWebhook)
	require.True(t, web.Members[0].Healthy)
	require.Equal(t, tunnel.TransportTCP, web.Members[0].Transport)
	require.Zero(t, web.Members[0].ActiveStreams)
	require.Equal(t, tunnel.ProtoTCP, tcp.Protocol)
	require.Equal(t, "db", tcp.Label)
	require.Equal(t, db.Port(), tcp.Port)
	require.Equal(t, 1, tcp.MemberCount)

	// A member that leaves is gone from both lists.
	tbID := tb.ID()
	require.NoError(t, tb.Close())
	require.Eventually(t, func() bool {
		return len(getJSON[[]TunnelInfo](api, "", "/api/tunnels")) == 3
	}, 5*time.Second, 10*time.Millisecond)
	groups = getJSON[[]GroupInfo](api, "", "/api/groups")
	require.Equal(t, 1, groups[0].MemberCount)
	requireError(t, api, "", "/api/tunnels/"+tbID, http.StatusNotFound)
}

func TestAPIHealthEventsKeepTheLast50OldestFirst(t *testing.T) {
	e := startEdge(t, tunnel.ServerConfig{LoadBalancing: tunnel.LoadBalancing{Enabled: true}}, Options{})
	id, ctrl := rawMember(t, e, "", probedRegister("flappy", "web", "k"))
	api := newAPIClient(t, e.adminAddr)

	events := getJSON[[]group.Transition](api, "", "/api/tunnels/"+id+"/health-events")
	require.Len(t, events, 1)
	require.False(t, events[0].Healthy, "a probed member starts unhealthy")
	require.Contains(t, events[0].Reason, "registered")

	const flips = 60
	for i := range flips {
		require.NoError(t, wire.WriteFrame(ctrl, &wire.Health{TunnelID: id, Healthy: i%2 == 0, Reason: fmt.Sprintf("flip %d", i)}))
	}
	require.Eventually(t, func() bool {
		h, ok := e.Registry().History(id)
		require.True(t, ok, "no member %s", id)
		return h[len(h)-1].Reason == fmt.Sprintf("flip %d", flips-1)
	}, 5*time.Second, 5*time.Millisecond)

	code, _, raw := api.get("", "/api/tunnels/"+id+"/health-events")
	require.Equal(t, http.StatusOK, code)
	var fields []map[string]any
	require.NoError(t, json.Unmarshal(raw, &fields))
	require.Len(t, fields, group.HistoryLen)
	require.ElementsMatch(t, []string{"at", "healthy", "reason"}, keysOf(fields[0]))

	require.NoError(t, json.Unmarshal(raw, &events))
	first := flips - group.HistoryLen // the 61 transitions less the 11 oldest
	for i, ev := range events {
		n := first + i
		require.Equal(t, fmt.Sprintf("flip %d", n), ev.Reason)
		require.Equal(t, n%2 == 0, ev.Healthy)
		if i > 0 {
			require.False(t, ev.At.Before(events[i-1].At), "oldest first")
		}
	}
}

func TestAPIScopesEachTenantToItsOwnMembers(t *testing.T) {
	auth := mustStaticTokens(t, []string{"plain-token-0123456789"}, map[string]string{"acme": "acme-token-0123456789", "globex": "globex-token-0123456789"})
	// Wrong tokens are tried below: no delay (the throttle has tests of its own).
	e := startEdge(t, tunnel.ServerConfig{LoadBalancing: tunnel.LoadBalancing{Enabled: true}, Auth: auth, PreAuth: tunnel.PreAuthLimits{AuthFailureDelay: -1}}, Options{Token: "admin-token-0123456789"})
	b := backend(t, "b")
	acme, globex := e.connect(tunnel.WithToken("acme-token-0123456789")), e.connect(tunnel.WithToken("globex-token-0123456789"))
	acmeShared, err := acme.Forward(ctxT(t), pool("shared"), hostPort(b.URL))
	require.NoError(t, err)
	acmeSolo, err := acme.Forward(ctxT(t), tunnel.TunnelSpec{Subdomain: "acme-solo"}, hostPort(b.URL))
	require.NoError(t, err)
	var globexHealth switchable
	gs := pool("globex-shared") // "shared" is acme's: a route belongs to one tenant
	gs.Health = globexHealth.spec()
	globexShared, err := globex.Forward(ctxT(t), gs, hostPort(b.URL))
	require.NoError(t, err)
	globexOwn, err := globex.Forward(ctxT(t), tunnel.TunnelSpec{Subdomain: "globex-only", Group: "internal", GroupKey: "g"}, hostPort(b.URL))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return selectable(e, "globex-shared")() == 1 }, 5*time.Second, 5*time.Millisecond)
	api := newAPIClient(t, e.adminAddr)

	t.Run("no or wrong token is 401", func(t *testing.T) {
		for _, path := range []string{"/api/tunnels", "/api/groups", "/api/tunnels/" + acmeShared.ID(),
			"/api/tunnels/" + acmeShared.ID() + "/health-events", "/api/groups/http/shared/events", "/api/nothing-here"} {
			for _, token := range []string{"", "wrong-token"} {
				requireError(t, api, token, path, http.StatusUnauthorized)
			}
		}
		_, h, _ := api.get("", "/api/tunnels")
		require.Equal(t, `Bearer realm="warren"`, h.Get("WWW-Authenticate"))
		req, err := http.NewRequest(http.MethodGet, api.base+"/api/tunnels", nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Basic admin-token-0123456789")
		resp, err := api.hc.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusUnauthorized, resp.StatusCode, "only the Bearer scheme")
		code, _, _ := api.get("", "/healthz")
		require.Equal(t, http.StatusOK, code, "/healthz needs no token")
	})

	t.Run("the admin token sees everything", func(t *testing.T) {
		tunnels := getJSON[[]TunnelInfo](api, "admin-token-0123456789", "/api/tunnels")
		require.Len(t, tunnels, 4)
		byID := tunnelsByID(tunnels)
		require.Equal(t, "acme", byID[acmeShared.ID()].Tenant)
		require.Equal(t, "globex", byID[globexOwn.ID()].Tenant)
		groups := getJSON[[]GroupInfo](api, "admin-token-0123456789", "/api/groups")
		require.Len(t, groups, 3)
		require.Equal(t, "globex-only", groups[0].Label)
		require.Equal(t, "globex-shared", groups[1].Label)
		require.Equal(t, "shared", groups[2].Label)
		require.Equal(t, 1, groups[2].MemberCount)
		require.Equal(t, 1, groups[2].HealthyCount)
		getJSON[[]group.Transition](api, "admin-token-0123456789", "/api/tunnels/"+globexShared.ID()+"/health-events")
	})

	t.Run("a tenant sees its own members and the groups holding them", func(t *testing.T) {
		tunnels := getJSON[[]TunnelInfo](api, "acme-token-0123456789", "/api/tunnels")
		require.ElementsMatch(t, []string{acmeShared.ID(), acmeSolo.ID()}, keysOf(tunnelsByID(tunnels)))
		groups := getJSON[[]GroupInfo](api, "acme-token-0123456789", "/api/groups")
		require.Len(t, groups, 1, "globex's groups hold no acme member")
		require.Equal(t, "shared", groups[0].Label)
		require.Equal(t, 1, groups[0].MemberCount)
		require.Equal(t, 1, groups[0].HealthyCount)
		require.Equal(t, []string{acmeShared.ID()}, memberIDs(groups[0]))

		// globex's unhealthy member is invisible to acme, so acme's counts do not move.
		globexHealth.down.Store(true)
		require.Eventually(t, func() bool { return selectable(e, "globex-shared")() == 0 }, 5*time.Second, 5*time.Millisecond)
		groups = getJSON[[]GroupInfo](api, "acme-token-0123456789", "/api/groups")
		require.Equal(t, 1, groups[0].HealthyCount)
		groups = getJSON[[]GroupInfo](api, "globex-token-0123456789", "/api/groups")
		require.Len(t, groups, 2)
		require.Equal(t, 1, groups[1].MemberCount)
		require.Equal(t, 0, groups[1].HealthyCount)
		getJSON[TunnelInfo](api, "acme-token-0123456789", "/api/tunnels/"+acmeShared.ID())
	})

	t.Run("what a tenant cannot see is 404, like what does not exist", func(t *testing.T) {
		hidden := requireError(t, api, "acme-token-0123456789", "/api/tunnels/"+globexShared.ID(), http.StatusNotFound)
		missing := requireError(t, api, "acme-token-0123456789", "/api/tunnels/"+strings.Repeat("0", len(globexShared.ID())), http.StatusNotFound)
		require.Equal(t, strings.ReplaceAll(hidden, globexShared.ID(), "X"), strings.ReplaceAll(missing, strings.Repeat("0", len(globexShared.ID())), "X"))
		requireError(t, api, "acme-token-0123456789", "/api/tunnels/"+globexShared.ID()+"/health-events", http.StatusNotFound)
		requireError(t, api, "acme-token-0123456789", "/api/groups/http/globex-only/events", http.StatusNotFound)
		requireError(t, api, "acme-token-0123456789", "/api/groups/http/globex-shared/events", http.StatusNotFound)
		requireError(t, api, "acme-token-0123456789", "/api/groups/http/acme-solo/events", http.StatusNotFound)
	})

	t.Run("a valid token of no tenant sees nothing", func(t *testing.T) {
		require.Empty(t, getJSON[[]TunnelInfo](api, "plain-token-0123456789", "/api/tunnels"))
		require.Empty(t, getJSON[[]GroupInfo](api, "plain-token-0123456789", "/api/groups"))
		requireError(t, api, "plain-token-0123456789", "/api/tunnels/"+acmeShared.ID(), http.StatusNotFound)
		requireError(t, api, "plain-token-0123456789", "/api/groups/http/shared/events", http.StatusNotFound)
	})

	t.Run("metrics need the admin token", func(t *testing.T) {
		requireError(t, api, "", "/metrics", http.StatusUnauthorized)
		requireError(t, api, "wrong-token", "/metrics", http.StatusUnauthorized)
		requireError(t, api, "acme-token-0123456789", "/metrics", http.StatusForbidden)
		code, _, body := api.get("admin-token-0123456789", "/metrics")
		require.Equal(t, http.StatusOK, code)
		require.Contains(t, string(body), `warren_group_members{group="web",healthy="true",region="local"} 1`)
	})
}

func TestAPIHandlersServeEmbedders(t *testing.T) {
	errDown := errors.New("token store unreachable")
	auth := tunnel.AuthenticatorFunc(func(_ context.Context, token string) (string, error) {
		switch token {
		case "acme-token-0123456789":
			return "acme", nil
		case "flaky":
			return "", errDown
		}
		return "", tunnel.ErrUnauthorized
	})
	srv, err := tunnel.NewServer(tunnel.ServerConfig{Auth: auth, Logger: zaptest.NewLogger(t)})
	require.NoError(t, err)
	defer func() { require.NoError(t, srv.Close()) }()
	plane, err := New(srv, Options{Token: "admin-token-0123456789"})
	require.NoError(t, err)
	defer plane.Close()
	mux := http.NewServeMux()
	mux.Handle("/api/", plane.APIHandler())
	mux.Handle("/custom/metrics", plane.MetricsHandler())
	hs := httptest.NewServer(mux)
	defer hs.Close()
	api := newAPIClient(t, strings.TrimPrefix(hs.URL, "http://"))

	require.Empty(t, getJSON[[]TunnelInfo](api, "admin-token-0123456789", "/api/tunnels"))
	require.Empty(t, getJSON[[]GroupInfo](api, "acme-token-0123456789", "/api/groups"))
	requireError(t, api, "nobody", "/api/tunnels", http.StatusUnauthorized)
	requireError(t, api, "flaky", "/api/tunnels", http.StatusServiceUnavailable)
	requireError(t, api, "admin-token-0123456789", "/api/groups/udp/x/events", http.StatusNotFound)
	requireError(t, api, "admin-token-0123456789", "/api/groups/http/nothing/events", http.StatusNotFound)
	code, h, _ := api.do(http.MethodPost, "admin-token-0123456789", "/api/tunnels")
	require.Equal(t, http.StatusMethodNotAllowed, code)
	require.Contains(t, h.Get("Allow"), http.MethodGet)

	code, _, body := api.get("admin-token-0123456789", "/custom/metrics")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, string(body), `warren_requests_total{proto="http"} 0`)
	requireError(t, api, "acme-token-0123456789", "/custom/metrics", http.StatusForbidden)
}
