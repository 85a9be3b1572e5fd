package admin

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/warren-tunnel/warren/group"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestAPIRejectsBadEventStreamNames(t *testing.T) {
	for _, c := range []struct {
		proto, label string
		ok           bool
		want         groupRef
	}{
		{"http", "Pool", true, groupRef{proto: "http", label: "pool"}},
		{"tcp", "db", true, groupRef{proto: "tcp", label: "db"}},
		{"tcp", "db~DEADBEEF", true, groupRef{proto: "tcp", label: "db~DEADBEEF", base: "db", key: "deadbeef"}},
		{"tcp", "a~b~0123abcd", true, groupRef{proto: "tcp", label: "a~b~0123abcd", base: "a~b", key: "0123abcd"}},
		{"tcp", "db~beef", true, groupRef{proto: "tcp", label: "db~beef"}},
		{"tcp", "~deadbeef", true, groupRef{proto: "tcp", label: "~deadbeef"}},
		{"udp", "db", false, groupRef{}},
		{"http", "", false, groupRef{}},
	} {
		ref, ok := parseGroupRef(c.proto, c.label)
		require.Equal(t, c.ok, ok, "%s/%s", c.proto, c.label)
		require.Equal(t, c.want, ref, "%s/%s", c.proto, c.label)
	}
}

// A Plane over a registry of its own, with no edge around it: the API lists what the view
// holds, tenants see only their own members, and a token the authenticator does not know
// is 401 while an authenticator outage is 503.
func TestPlaneOverAView(t *testing.T) {
	reg := group.NewRegistry(group.Config{LoadBalancing: true})
	var key group.KeyHash
	key[0] = 0xab
	_, err := reg.Join(group.JoinRequest{ID: "m1", Proto: group.ProtoHTTP, Label: "pool", Group: "web", KeyHash: key, Tenant: "acme"})
	require.NoError(t, err)
	_, err = reg.Join(group.JoinRequest{ID: "m2", Proto: group.ProtoHTTP, Label: "pool", Group: "web", KeyHash: key, Tenant: "globex"})
	require.NoError(t, err)
	down := false
	p, err := newPlane(config{
		View:       reg.View(),
		URL:        func(g group.Info) string { return "http://" + g.Label + ".example.test" },
		AdminToken: "admin",
		Authenticate: func(_ context.Context, token string) (string, error) {
			switch {
			case down:
				return "", context.DeadlineExceeded
			case token == "acme-token":
				return "acme", nil
			}
			return "", ErrInvalidToken
		},
		Metrics: prometheus.NewRegistry(),
	})
	require.NoError(t, err)
	defer p.Close()

	get := func(token, path string) (int, []byte) {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, "http://127.0.0.1"+path, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		p.Handler().ServeHTTP(rec, req)
		return rec.Code, rec.Body.Bytes()
	}
	code, body := get("admin", "/api/groups")
	require.Equal(t, http.StatusOK, code)
	var groups []GroupInfo
	require.NoError(t, json.Unmarshal(body, &groups))
	require.Len(t, groups, 1)
	require.Equal(t, 2, groups[0].MemberCount)
	require.Equal(t, "http://pool.example.test", groups[0].URL)

	code, body = get("acme-token", "/api/tunnels")
	require.Equal(t, http.StatusOK, code)
	var tunnels []TunnelInfo
	require.NoError(t, json.Unmarshal(body, &tunnels))
	require.Len(t, tunnels, 1)
	require.Equal(t, "m1", tunnels[0].ID)
	code, _ = get("acme-token", "/api/tunnels/m2")
	require.Equal(t, http.StatusNotFound, code, "another tenant's tunnel does not exist for acme")

	code, body = get("acme-token", "/api/tunnels/m1/health-events")
	require.Equal(t, http.StatusOK, code)
	var hist []HealthEvent
	require.NoError(t, json.Unmarshal(body, &hist))
	require.Len(t, hist, 1)
	require.Equal(t, "registered", hist[0].Reason)

	code, _ = get("nobody", "/api/groups")
	require.Equal(t, http.StatusUnauthorized, code)
	code, _ = get("acme-token", "/metrics")
	require.Equal(t, http.StatusForbidden, code)
	down = true
	code, _ = get("acme-token", "/api/groups")
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Zero(t, p.EventStreams())
}

// A page of groups ends before its members pass MaxPageMembers; the pages together list
// every group once, and a single group bigger than the budget still has a page of its own.
func TestPagesAreBoundedInMembers(t *testing.T) {
	type item struct {
		name    string
		members int
	}
	var items []item
	for i := range 8 {
		items = append(items, item{fmt.Sprintf("g%d", i), MaxPageMembers / 3})
	}
	items = append(items, item{"huge", MaxPageMembers * 2})
	var seen []string
	cursor := ""
	for pages := 0; ; pages++ {
		require.Less(t, pages, 10)
		rec := httptest.NewRecorder()
		writePage(rec, httptest.NewRequest(http.MethodGet, "/api/groups?cursor="+cursor, nil), slices.Clone(items),
			func(it item) []string { return []string{it.name} }, func(it item) int { return it.members })
		require.Equal(t, http.StatusOK, rec.Code)
		var page []struct{}
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &page))
		sum := 0
		start := len(seen) // the page is the next len(page) items in key order
		sorted := slices.Clone(items)
		slices.SortFunc(sorted, func(a, b item) int { return strings.Compare(a.name, b.name) })
		for _, it := range sorted[start : start+len(page)] {
			seen = append(seen, it.name)
			sum += it.members
		}
		if len(page) > 1 {
			require.LessOrEqual(t, sum, MaxPageMembers)
		}
		if cursor = rec.Header().Get("X-Next-Cursor"); cursor == "" {
			break
		}
		require.Contains(t, rec.Header().Get("Link"), "limit=500", "the next link keeps the asked page size")
	}
	require.Len(t, seen, len(items))
}
