package admin

// What the API lists of an edge's pools, pages, endpoints and load-balancing state (moved
// from package tunnel's owner_test.go, routes_race_test.go, lb_test.go and
// tls_passthrough_test.go, with the listing parts of tests that stay there).

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/tunnel"
)

// /api/tunnels pages like /api/groups: every tunnel once, in order, whatever the page size.
func TestTunnelListIsPaged(t *testing.T) {
	e := startEdge(t, tunnel.ServerConfig{LoadBalancing: tunnel.LoadBalancing{Enabled: true}}, Options{})
	b := backend(t, "b")
	s := e.connect()
	for i := range 7 {
		_, err := s.Forward(ctxT(t), tunnel.TunnelSpec{Subdomain: fmt.Sprintf("app%d", i)}, hostPort(b.URL))
		require.NoError(t, err)
	}
	api := newAPIClient(t, e.adminAddr)
	all := getJSON[[]TunnelInfo](api, "", "/api/tunnels")
	require.Len(t, all, 7)
	var paged []TunnelInfo
	cursor := ""
	for pages := 0; ; pages++ {
		require.Less(t, pages, 4)
		code, h, body := api.get("", "/api/tunnels?limit=3&cursor="+cursor)
		require.Equal(t, http.StatusOK, code)
		var page []TunnelInfo
		require.NoError(t, json.Unmarshal(body, &page))
		require.LessOrEqual(t, len(page), 3)
		paged = append(paged, page...)
		if cursor = h.Get("X-Next-Cursor"); cursor == "" {
			break
		}
	}
	// The same tunnels in the same order (compared by id: a URL gains the public port once
	// the test edge's public listener is up, which may happen between two pages).
	ids := func(ts []TunnelInfo) (out []string) {
		for _, t := range ts {
			out = append(out, t.ID)
		}
		return out
	}
	require.Equal(t, ids(all), ids(paged))
}

// Two pools whose key hashes share their first 8 hex digits are both listed when a page
// boundary falls between them.
func TestGroupPagesNeverSkipPoolsThatShareAShortHash(t *testing.T) {
	seen := map[string]string{}
	var k1, k2 string
	for i := 0; k2 == ""; i++ { // a birthday search: about 2^16 keys
		k := fmt.Sprint("key", i)
		s := group.HashKey(k).Short()
		if o, ok := seen[s]; ok {
			k1, k2 = o, k
		}
		seen[s] = k
	}
	e := startEdge(t, tunnel.ServerConfig{LoadBalancing: tunnel.LoadBalancing{Enabled: true},
		TCP: tunnel.TCPTunnels{Ports: group.PortRange{Lo: 45200, Hi: 45209}, BindHost: "127.0.0.1"}}, Options{Token: "admin-token-0123456789"})
	echo := tcpBackend(t, func(net.Conn) {})
	c := e.connect()
	for _, k := range []string{k1, k2} {
		_, err := c.Forward(ctxT(t), tunnel.TunnelSpec{Proto: tunnel.ProtoTCP, Name: "db", Group: "db", GroupKey: k}, echo)
		require.NoError(t, err)
	}
	api := newAPIClient(t, e.adminAddr)
	code, h, body := api.get("admin-token-0123456789", "/api/groups?limit=1")
	require.Equal(t, http.StatusOK, code)
	var page1, page2 []GroupInfo
	require.NoError(t, json.Unmarshal(body, &page1))
	require.NotEmpty(t, h.Get("X-Next-Cursor"))
	require.Contains(t, h.Get("Link"), `rel="next"`)
	_, h, body = api.get("admin-token-0123456789", "/api/groups?limit=1&cursor="+h.Get("X-Next-Cursor"))
	require.NoError(t, json.Unmarshal(body, &page2))
	require.Len(t, page1, 1)
	require.Len(t, page2, 1)
	require.NotEqual(t, page1[0].Port, page2[0].Port, "two pools, each listed once")
	require.Empty(t, h.Get("X-Next-Cursor"), "the last page names no next one")
	code, _, _ = api.get("admin-token-0123456789", "/api/groups?cursor=!!")
	require.Equal(t, http.StatusBadRequest, code)
	code, _, _ = api.get("admin-token-0123456789", "/api/groups?limit=5000")
	require.Equal(t, http.StatusBadRequest, code)
}

// Passive outlier ejection end to end, as the API and the metrics show it (package tunnel's
// TestOutlierEjectionEndToEnd, which checks the edge's side of it without them).
func TestOutlierEjectionInTheAPIAndMetrics(t *testing.T) {
	var events atomic.Int32
	e := startEdge(t, tunnel.ServerConfig{LoadBalancing: tunnel.LoadBalancing{Enabled: true, OutlierEjection: &group.Ejection{Failures: 3, Duration: time.Hour}},

		OnEvent: func(ev group.Event) {
			if ev.Ejection {
				events.Add(1)
			}
		}}, Options{})
	sick := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "upstream down", http.StatusBadGateway)
	}))
	t.Cleanup(sick.Close)
	good := backend(t, "G")
	_, err := e.connect().Forward(ctxT(t), pool("pool"), hostPort(sick.URL))
	require.NoError(t, err)
	_, err = e.connect().Forward(ctxT(t), pool("pool"), hostPort(good.URL))
	require.NoError(t, err)

	bad := 0
	for range 20 {
		if code, _ := e.get("pool", "/"); code == http.StatusBadGateway {
			bad++
		}
	}
	require.Equal(t, 3, bad, "the member is ejected after 3 502s in a row, its probe notwithstanding")
	require.Equal(t, int32(1), events.Load())
	groups := getJSON[[]GroupInfo](newAPIClient(t, e.adminAddr), "", "/api/groups")
	ejected := 0
	for _, m := range groups[0].Members {
		if m.Ejected {
			ejected++
			require.False(t, m.Healthy)
		}
	}
	require.Equal(t, 1, ejected)
	_, _, body := newAPIClient(t, e.adminAddr).get("", "/metrics")
	require.Contains(t, string(body), `warren_member_ejections_total{group="web",region="local"} 1`)
}

// A member in its slow start takes a small share of the work, and the API shows it ramping.
func TestSlowStartVisibleInAPI(t *testing.T) {
	e := startEdge(t, tunnel.ServerConfig{LoadBalancing: tunnel.LoadBalancing{Enabled: true}}, Options{})
	a := backend(t, "A")
	_, err := e.connect().Forward(ctxT(t), pool("pool"), hostPort(a.URL))
	require.NoError(t, err)
	sp := pool("pool")
	sp.SlowStart = time.Hour
	_, err = e.connect().Forward(ctxT(t), sp, hostPort(backend(t, "S").URL))
	require.NoError(t, err)
	got := e.tally("pool", 200)
	require.Less(t, got["S"], 10, "a member in its slow start takes a small share: %v", got)
	groups := getJSON[[]GroupInfo](newAPIClient(t, e.adminAddr), "", "/api/groups")
	ramping := 0
	for _, m := range groups[0].Members {
		if m.Ramping {
			ramping++
		}
	}
	require.Equal(t, 1, ramping)
}

// A reserved endpoint exists before any connector: it is listed with zero members, to its
// tenant and the admin token and to no other tenant (the listing part of package tunnel's
// TestReservedEndpointAndPolicy); once its pool registers it is listed as the live pool.
func TestReservedEndpointIsListedToItsTenant(t *testing.T) {
	e := startEdge(t, tunnel.ServerConfig{LoadBalancing: tunnel.LoadBalancing{Enabled: true}, Auth: tenantAuth(t),
		Endpoints: []tunnel.Endpoint{{Subdomain: "pool", Tenant: "acme", Group: "web"}}}, Options{Token: "admin-token-0123456789"})
	api := newAPIClient(t, e.adminAddr)
	for _, token := range []string{"admin-token-0123456789", acmeToken} {
		groups := getJSON[[]GroupInfo](api, token, "/api/groups")
		require.Len(t, groups, 1)
		require.True(t, groups[0].Reserved)
		require.Equal(t, "pool", groups[0].Label)
		require.Zero(t, groups[0].MemberCount)
	}
	require.Empty(t, getJSON[[]GroupInfo](api, globexToken, "/api/groups"), "another tenant does not see it")

	_, err := e.connect(tunnel.WithToken(acmeToken)).Forward(ctxT(t), tunnel.TunnelSpec{Subdomain: "pool", Group: "web", GroupKey: "k"},
		hostPort(backend(t, "acme").URL))
	require.NoError(t, err)
	groups := getJSON[[]GroupInfo](api, acmeToken, "/api/groups")
	require.Len(t, groups, 1)
	require.False(t, groups[0].Reserved, "a live pool")
	require.Equal(t, 1, groups[0].MemberCount)
}

// The API shows each member's weight and priority (the API part of package tunnel's
// TestWeightedPoolSplitsRequests).
func TestAPIShowsEachMembersWeightAndPriority(t *testing.T) {
	e := startEdge(t, tunnel.ServerConfig{LoadBalancing: tunnel.LoadBalancing{Enabled: true}}, Options{})
	for _, lb := range []struct{ weight, priority int }{{3, 0}, {1, 0}, {2, 1}} {
		sp := pool("pool")
		sp.Weight, sp.Priority = lb.weight, lb.priority
		_, err := e.connect().Forward(ctxT(t), sp, hostPort(backend(t, "b").URL))
		require.NoError(t, err)
	}
	groups := getJSON[[]GroupInfo](newAPIClient(t, e.adminAddr), "", "/api/groups")
	require.Len(t, groups, 1)
	got := map[int]int{}
	for _, m := range groups[0].Members {
		got[m.Weight] = m.Priority
	}
	require.Equal(t, map[int]int{3: 0, 1: 0, 2: 1}, got)
}

// selfSigned returns a self-signed certificate for names.
func selfSigned(t *testing.T, names ...string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: names[0]},
		DNSNames:     names,
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// A TLS passthrough pool is proto tls in the API, the metrics and its event stream's path:
// /api/groups/tls/<subdomain>/events (the admin part of package tunnel's
// TestTLSPassthroughPool).
func TestTLSPassthroughPoolInTheAdminAPI(t *testing.T) {
	token := strings.Repeat("a", 32)
	e := startEdge(t, tunnel.ServerConfig{LoadBalancing: tunnel.LoadBalancing{Enabled: true},
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{selfSigned(t, "*."+testDomain)}, MinVersion: tls.VersionTLS12}},
		Options{Token: token})
	be := tcpBackend(t, func(net.Conn) {})
	spec := tunnel.TunnelSpec{Proto: tunnel.ProtoTLS, Subdomain: "pool", Group: "pool", GroupKey: "k"}
	for range 2 {
		_, err := e.connect().Forward(ctxT(t), spec, be)
		require.NoError(t, err)
	}

	api := newAPIClient(t, e.adminAddr)
	code, _, body := api.get(token, "/api/groups")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, string(body), `"protocol":"tls"`)
	require.Contains(t, string(body), `"url":"tls://pool.`+testDomain)
	code, _, body = api.get(token, "/metrics")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, string(body), `warren_active_tunnels{proto="tls"} 2`)

	st := openStream(t, e.adminAddr, token, "/api/groups/tls/pool/events", nil)
	require.Equal(t, http.StatusOK, st.resp.StatusCode)
	first := make([]byte, len(": group events of tls/pool"))
	_, err := io.ReadFull(st.resp.Body, first)
	require.NoError(t, err)
	require.Equal(t, ": group events of tls/pool", string(first))
}
